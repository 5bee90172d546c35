"""Rollout workers at their edges: settings that cannot work, servers that are no vLLM worker
or answer nonsense, transient HTTP failures, and a port `rlcli rollout-server` cannot take.

The broken workers are a tiny `http.server` on 127.0.0.1 (a free port, stopped after each
test) that stands in for a `vllm serve` gone wrong: it answers HTML, `{}`, 500, token ids
past the vocabulary, one log-prob too few or fifty too many, NaN. No vLLM starts here, so
each test takes seconds; tests/rollout/test_workers.py runs the real workers.
"""

import contextlib
import io
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import torch

from rlcli.cli import main
from rlcli.config import ConfigError
from rlcli.rollout.workers import client as worker_client
from rlcli.rollout.workers import sampler as workers
from rlcli.rollout.workers import weight_push
from rlcli.rollout.workers.client import RETRIES, WorkerLost
from rlcli.rollout.workers.processes import free_port
from rlcli.rollout.workers.sampler import WorkerSampler
from rlcli.runtime.models import load_tokenizer
from rlcli.validate import compose
from tests.conftest import tiny

MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
TOKENS, LOGPS = [5, 6, 7], [-1.0, -2.0, -0.5]  # one good response


def choice(tokens=TOKENS, logps=LOGPS, finish="length"):
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(tokens, logps, strict=False)]
    return {"token_ids": tokens, "finish_reason": finish, "logprobs": {"content": content}}


class FakeWorker:
    """What the stand-in answers: `answer(method, path) -> (status, content type, body)`,
    a function of the request and of how many came before (`self.calls`)."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method):
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                fake.calls.append((method, self.path))
                status, kind, body = fake.answer(method, self.path)
                data = body if isinstance(body, bytes) else body.encode()
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's names
                self._reply("GET")

            def do_POST(self):  # noqa: N802
                self._reply("POST")

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def generated(self) -> int:
        return sum(path == "/inference/v1/generate" for _, path in self.calls)


def worker_answering(generate):
    """A stand-in that lists its model (GET /v1/models) and answers generate with
    `generate(k)`, k the generate requests before this one."""

    def answer(method, path):
        if path == "/v1/models":
            return as_json(MODELS)
        if path == "/inference/v1/generate":
            return generate(sum(p == path for _, p in fake.calls) - 1)
        return 404, "application/json", "{}"

    fake = FakeWorker(answer)
    return fake


def as_json(body, status=200):
    return status, "application/json", json.dumps(body)


HTML = (200, "text/html", "<html><body><h1>Welcome to nginx!</h1></body></html>")


@pytest.fixture
def fast_retries(monkeypatch):
    """The same retries, without seconds of backoff between them."""
    monkeypatch.setattr(worker_client, "RETRY_BACKOFF_S", 0.001)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def sampler_for(url, tiny_model_dir, tokenizer) -> WorkerSampler:
    cfg = compose(
        ["model=tiny", f"sampler.urls=[{url}]", "sampler.worker_timeout_s=10",
         "sampler.max_new_tokens=8"]
    )  # fmt: skip
    eos = {tokenizer.eos_token_id}
    return WorkerSampler(
        tiny_model_dir, tokenizer, eos, cfg.sampler, "float32", torch.device("cpu")
    )


def sample(sampler: WorkerSampler):
    return sampler.sample(["1+1="], 2, ["p0"], ["2"])


def one_paragraph(message: str, url: str) -> None:
    assert "\n" not in message and f"rollout worker 0 ({url})" in message, message


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ("sampler.urls=[not-a-url]", "sampler.urls=[not-a-url]: 'not-a-url' is not an http(s) URL"),
        ("sampler.urls=[ftp://node-b/w]", "'ftp://node-b/w' uses ftp://, not http:// or https://"),
        ("sampler.urls=[http://node-b:70000]", "has a port outside 1-65535"),
        ("sampler.urls=[http://:8000]", "'http://:8000' names no host"),
        ("sampler.urls=[http://a:80,http://a:80/]", "names http://a:80 more than once"),
        ("sampler.worker_timeout_s=0", "sampler.worker_timeout_s=0.0 is not allowed"),
        ("sampler.worker_timeout_s=-3", "sampler.worker_timeout_s=-3.0 is not allowed"),
        ("sampler.serve_port=-1", "sampler.serve_port=-1 is not a TCP port: choose one in 1-65535"),
        ("sampler.serve_port=70000", "sampler.serve_port=70000 is not a TCP port"),
    ],
)
def test_worker_settings_that_cannot_work_are_config_errors(override, expect):
    with pytest.raises(ConfigError) as err:
        compose(["model=tiny", override])
    assert expect in str(err.value) and "\n" not in str(err.value)


def test_an_unreachable_address_is_still_a_valid_setting():
    # Whether a worker runs there is found out when the run starts (exit 4), not by validation.
    cfg = compose(["model=tiny", "sampler.urls=[http://127.0.0.1:1/]"])
    assert cfg.sampler.urls == ["http://127.0.0.1:1/"]


@pytest.mark.parametrize(
    ("answer", "expect"),
    [
        (HTML, "does not answer like a vLLM server: GET /v1/models gave text/html, '<html>"),
        (as_json({}), "does not answer like a vLLM server: GET /v1/models gave application/json"),
        (as_json({"error": "boom"}, 500), "answered HTTP 500 to GET /v1/models"),
    ],
)  # fmt: skip
def test_a_server_that_is_no_vllm_worker_is_lost_before_any_push(
    answer, expect, fast_retries, tiny_model_dir, tokenizer
):
    with FakeWorker(lambda method, path: answer) as fake:
        with pytest.raises(WorkerLost) as err:
            sampler_for(fake.url, tiny_model_dir, tokenizer)
    assert expect in str(err.value)
    one_paragraph(str(err.value), fake.url)
    # A 500 is retried before the worker is declared lost; an answer that is no worker's is not.
    assert len(fake.calls) == (RETRIES + 1 if answer[0] == 500 else 1)


def test_a_refused_connection_is_retried_then_lost(fast_retries, tiny_model_dir, tokenizer):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(WorkerLost) as err:
        sampler_for(url, tiny_model_dir, tokenizer)
    assert f"cannot be reached: Connection refused (tried {RETRIES + 1} times)" in str(err.value)
    one_paragraph(str(err.value), url)


def test_a_good_answer_is_read_and_transient_errors_are_retried(
    fast_retries, tiny_model_dir, tokenizer
):
    # Two 503s (a worker restarting behind a proxy), then the answer.
    def generate(k):
        if k < 2:
            return as_json({"error": "busy"}, 503)
        return as_json({"choices": [choice(), choice(TOKENS[:2], LOGPS[:2], "stop")]})

    with worker_answering(generate) as fake:
        rollout = sample(sampler_for(fake.url, tiny_model_dir, tokenizer))
    assert fake.generated() == 3
    width = rollout.prompt_width
    assert rollout.input_ids[0, width : width + 3].tolist() == TOKENS
    assert rollout.sampler_logp[0, :3].tolist() == LOGPS
    assert rollout.sampler_logp[1, :2].tolist() == LOGPS[:2]
    assert rollout.response_mask.sum(-1).tolist() == [3, 2]
    assert rollout.truncated.tolist() == [True, False]


def server_info(dtype) -> tuple:
    """GET /server_info?config_format=json as vLLM 0.32 answers it, cut to what is read."""
    return as_json({"vllm_config": {"model_config": {"dtype": dtype}}, "vllm_env": {}})


@pytest.mark.parametrize(
    ("info", "pushed"),
    [
        (server_info("torch.bfloat16"), torch.bfloat16),  # as `rlcli rollout-server` answers
        (server_info("torch.float16"), torch.float16),
        ((404, "application/json", '{"detail": "Not Found"}'), None),  # dev mode off
        (server_info(None), None),
        (HTML, None),
    ],
)
def test_the_push_to_a_worker_at_a_url_sends_the_dtype_it_holds(
    info, pushed, tiny_model_dir, tokenizer
):
    # A worker that says which dtype it holds gets its tensors cast to that one before they
    # are sent (half the bytes of float32 for bfloat16); one that does not say, the policy's
    # own, which vLLM casts as it loads them.
    def answer(method, path):
        if path == "/v1/models":
            return as_json(MODELS)
        if path == "/server_info?config_format=json":
            return info
        return 404, "application/json", "{}"

    with FakeWorker(answer) as fake:
        sampler = sampler_for(fake.url, tiny_model_dir, tokenizer)
    assert ("GET", "/server_info?config_format=json") in fake.calls
    assert sampler.weights.dtype == pushed


VOCAB = 49152  # SmolLM2's tokenizer, which the tiny model shares


@pytest.mark.parametrize(
    ("generate", "expect"),
    [
        (as_json({"choices": [choice(), choice([5, VOCAB, 7])]}),
         f"token id {VOCAB} is outside the model's vocabulary (ids 0 to {VOCAB - 1})"),
        (as_json({"choices": [choice(), choice([5, -1, 7])]}), "token id -1 is outside"),
        (as_json({"choices": [choice(), choice(logps=LOGPS[:2])]}),
         "a response of 3 tokens came with 2 log-probs; exactly one per token is needed"),
        (as_json({"choices": [choice(), {**choice(), "logprobs": {"content": [
            {"logprob": -1.0}] * 53}}]}), "a response of 3 tokens came with 53 log-probs"),
        (as_json({"choices": [choice(logps=[-1.0, float("nan"), -0.5]), choice()]}),
         "the log-prob of token 1 of a response is nan, not a finite number"),
        (as_json({"choices": [choice(logps=[-1.0, -0.5, float("-inf")]), choice()]}),
         "the log-prob of token 2 of a response is -inf"),
        (as_json({"choices": [choice()]}), "a prompt that asked for 2 responses got 1"),
        (as_json({"choices": [choice(list(range(9)), [-1.0] * 9), choice()]}),
         "a response of 9 tokens is longer than sampler.max_new_tokens=8"),
        (as_json({"choices": [choice(), {"token_ids": TOKENS}]}),
         "a response lacks token_ids, finish_reason or logprobs.content"),
        (as_json({}), "the answer has no list of choices ({})"),
        (HTML, "answered /inference/v1/generate with what is not JSON (text/html, '<html>"),
        (as_json({"error": "Internal"}, 500),
         "answered HTTP 500 to /inference/v1/generate (application/json, '{\"error\": \"Intern"),
    ],
)  # fmt: skip
def test_a_wrong_generate_answer_is_a_lost_worker_not_a_wrong_step(
    generate, expect, fast_retries, tiny_model_dir, tokenizer
):
    # Before these checks: an IndexError in the learner (ids), or a step trained on log-probs
    # shifted against their tokens or NaN (kl 59.8, skipped steps, exit 0).
    with worker_answering(lambda k: generate) as fake:
        sampler = sampler_for(fake.url, tiny_model_dir, tokenizer)
        assert sampler.vocab == VOCAB
        with pytest.raises(WorkerLost) as err:
            sample(sampler)
    assert expect in str(err.value)
    one_paragraph(str(err.value), fake.url)
    assert fake.generated() == (RETRIES + 1 if generate[0] == 500 else 1)


# Which errors `WorkerSampler._guard` blames on a worker. A learner-side bug cannot be produced
# on demand, so each case is injected with a monkeypatch of the narrowest function inside the
# guarded call: `rollout_from_tokens`, the learner's layout of the batch once a good answer
# has been read (sampling), and `sampler_weights`, the learner's making of the weights (the
# push). Before the narrowing every one of them became a WorkerLost (exit 4, a worker blamed).
LEARNER_BUGS = [
    KeyError("pad_id"),
    TypeError("'NoneType' object is not subscriptable"),
    RuntimeError("The size of tensor a (3) must match the size of tensor b (2)"),
]
TRANSPORT = [
    requests.ConnectionError("('Connection aborted.', RemoteDisconnected())"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("timed out"),
]


def good_answer(k):
    return as_json({"choices": [choice(), choice()]})


def raised_while_sampling(error, monkeypatch, model_dir, tokenizer) -> Exception:
    """What sampling raises when turning a worker's good answer into a rollout raises `error`
    (patched in: a real learner bug cannot be produced on demand)."""

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(workers, "rollout_from_tokens", broken)
    with worker_answering(good_answer) as fake:
        sampler = sampler_for(fake.url, model_dir, tokenizer)
        with pytest.raises(Exception) as err:
            sample(sampler)
    return err.value


@pytest.mark.parametrize("bug", LEARNER_BUGS, ids=lambda e: type(e).__name__)
def test_a_learner_bug_while_sampling_propagates_as_itself(
    bug, monkeypatch, tiny_model_dir, tokenizer
):
    raised = raised_while_sampling(bug, monkeypatch, tiny_model_dir, tokenizer)
    assert raised is bug and not isinstance(raised, WorkerLost)


@pytest.mark.parametrize("error", TRANSPORT, ids=lambda e: type(e).__name__)
def test_a_transport_error_while_sampling_is_a_lost_worker(
    error, monkeypatch, tiny_model_dir, tokenizer
):
    raised = raised_while_sampling(error, monkeypatch, tiny_model_dir, tokenizer)
    assert isinstance(raised, WorkerLost)
    assert str(raised).startswith(f"a rollout worker failed ({type(error).__name__}: ")
    assert raised.__cause__ is error and "\n" not in str(raised)


class StandInEngine:
    """vLLM's learner-side transfer engine without its transfer group: it makes every tensor
    as the real one does, then its broadcast fails with `broadcast_error` (if any)."""

    def __init__(self, broadcast_error=None):
        self.source, self.broadcast_error = None, broadcast_error

    def send_weights(self):
        for _ in self.source:
            pass
        if self.broadcast_error is not None:
            raise self.broadcast_error

    def load_weights(self):
        pass


def pushing_sampler(fake, engine, monkeypatch, tiny_model_dir, tokenizer) -> WorkerSampler:
    monkeypatch.setattr(workers.WeightPush, "connect", lambda self, source: engine)
    return sampler_for(fake.url, tiny_model_dir, tokenizer)


def answers_everything(method, path):
    return as_json(MODELS if path == "/v1/models" else {})  # reset_prefix_cache too


# What torch's gloo raised in the learner when a worker was killed in a broadcast (its first line).
GLOO_DEAD_PEER = RuntimeError(
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:20621. This is typically caused by a remote worker crashing.\nmore lines"
)


@pytest.mark.parametrize("error", [GLOO_DEAD_PEER, *TRANSPORT], ids=lambda e: type(e).__name__)
def test_a_push_that_breaks_on_the_way_is_a_lost_worker(
    error, monkeypatch, tiny_model_dir, tokenizer
):
    policy = torch.nn.Linear(2, 2)
    with FakeWorker(answers_everything) as fake:
        engine = StandInEngine()
        sampler = pushing_sampler(fake, engine, monkeypatch, tiny_model_dir, tokenizer)
        sampler.sync(policy)  # a push that works: reset_prefix_cache asked, the version counted
        assert sampler.version == 0 and ("POST", "/reset_prefix_cache") in fake.calls
        engine.broadcast_error = error
        with pytest.raises(WorkerLost) as err:
            sampler.sync(policy)
    assert str(err.value).startswith(f"a rollout worker failed ({type(error).__name__}: ")
    assert err.value.__cause__ is error and "\n" not in str(err.value)
    assert sampler.version == 0  # a push that broke counts no version


@pytest.mark.parametrize("bug", LEARNER_BUGS, ids=lambda e: type(e).__name__)
def test_a_learner_bug_in_the_push_propagates_as_itself(
    bug, monkeypatch, tiny_model_dir, tokenizer
):
    # A RuntimeError too: in the push it counts as the transport's only when the broadcast,
    # not the learner's making of the weights, raised it.
    def broken(policy, dtype):
        yield "weight", torch.zeros(2, 2)
        raise bug

    monkeypatch.setattr(weight_push, "sampler_weights", broken)
    with FakeWorker(answers_everything) as fake:
        sampler = pushing_sampler(fake, StandInEngine(), monkeypatch, tiny_model_dir, tokenizer)
        with pytest.raises(type(bug)) as err:
            sampler.sync(torch.nn.Linear(2, 2))
    assert err.value is bug and not isinstance(err.value, WorkerLost)


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`rlcli ARGV` in this process: (exit code, stdout, stderr); an escaped exception fails."""
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return code, out.getvalue(), err.getvalue()


TINY = tiny("trainer.max_steps=1", sampler=None)  # the workers' vLLM


@pytest.mark.parametrize("kind", ["html", "refused"])
def test_rlcli_train_with_a_broken_worker_exits_4_saying_which(
    kind, fast_retries, tmp_path: Path, tiny_model_dir
):
    with FakeWorker(lambda method, path: HTML) as fake:
        url = fake.url if kind == "html" else f"http://127.0.0.1:{free_port()}"
        code, out, err = run_cli("train", *TINY, f"sampler.urls=[{url}]",
                                 f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert code == 4, err
    assert "Traceback" not in err
    message = err.strip().split("\n\n")[-1]
    assert message.startswith(f"rlcli: rollout worker 0 ({url}) "), err
    assert "Nothing was trained in this start" in message and "trainer.resume=auto" in message
    assert not (tmp_path / "checkpoints").exists()


def test_rlcli_train_with_a_url_that_is_none_exits_2(tmp_path: Path):
    code, out, err = run_cli("train", *TINY, "sampler.urls=[ftp://node-b/w]",
                             f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("rlcli: error: sampler.urls=[ftp://node-b/w]")


@pytest.mark.parametrize("port", ["in use", "-1", "70000"])
def test_rollout_server_refuses_a_port_it_cannot_listen_on(port, tmp_path: Path, monkeypatch):
    def no_exec(*args):  # a port let through would replace this test with vLLM
        raise AssertionError(f"rlcli rollout-server started vLLM: {args[1]}")

    monkeypatch.setattr("os.execvpe", no_exec)
    with contextlib.ExitStack() as stack:
        if port == "in use":
            taken = stack.enter_context(socket.socket())
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = str(taken.getsockname()[1])
        code, out, err = run_cli("rollout-server", "model=tiny", f"sampler.serve_port={port}",
                                 f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert code == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"rlcli: error: sampler.serve_port={port} "), line
    expect = "is in use on this machine" if int(port) in range(1, 65536) else "is not a TCP port"
    assert expect in line


# A worker's server, stood in for by a process that ignores SIGTERM as a server waiting on a
# dead push's request does, in a session of its own as a local worker is. Its parent, the
# learner's stand-in, starts it and prints its PID.
STUCK_SERVER = """
import os, signal, subprocess, sys, time
child = '''
import signal, time
from rlcli.rollout.workers import processes
signal.signal(signal.SIGTERM, signal.SIG_IGN)
processes.END_GRACE_S = 0.5
processes.watch_learner()
time.sleep(60)
'''
from rlcli.rollout.workers.processes import LEARNER_PID
env = {**os.environ, LEARNER_PID: str(os.getpid())}
server = subprocess.Popen([sys.executable, "-c", child], env=env, start_new_session=True)
print(server.pid, flush=True)
time.sleep(60)
"""


def test_a_local_workers_server_is_killed_once_its_learner_is_gone():
    learner = subprocess.Popen(
        [sys.executable, "-c", STUCK_SERVER], stdout=subprocess.PIPE, text=True
    )
    server = int(learner.stdout.readline())
    time.sleep(3)  # the server is up and watching
    assert running(server), "the server ended while its learner ran"
    learner.kill()
    learner.wait()
    deadline = time.monotonic() + 20
    while running(server):
        assert time.monotonic() < deadline, "the server outlived its learner"
        time.sleep(0.2)


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie waiting to be reaped has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
