"""HTTP to the rollout workers: what the learner asks them and how it reads their answers.

A worker's transient HTTP failures are retried (`worker_session`); a worker that is not there,
answers like no vLLM server (`not_a_worker`), fails a request or answers what cannot be
trained on (`read_answer`) is a `WorkerLost` naming it (`WorkerClient.lost`), and only the
errors of the path to a worker count as such (`transport_error`). The weight push's control
calls go through vLLM's own client (`workers.weight_push`). Nothing here imports vLLM, so the
training loop of a run that never uses workers catches `WorkerLost` without loading it.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


class WorkerLost(RuntimeError):
    """A rollout worker died, stopped answering or answered nonsense; the message names it
    and what to do."""


# A worker's transient HTTP failures (a refused connection while it restarts, a 429 or 5xx
# answer from it or a proxy before it) are retried this many times, waiting 0, 2, 4, 8 x
# RETRY_BACKOFF_S seconds between tries, before the worker is reported lost. A read timeout is
# not retried: the worker has had sampler.worker_timeout_s already.
RETRIES = 4
RETRY_BACKOFF_S = 0.5
RETRY_STATUSES = (429, 500, 502, 503, 504)


def transport_error(err: BaseException) -> bool:
    """Whether `err` is the path to a worker failing rather than the learner's own bug: any
    error of requests (a refused or reset connection, a timeout, an HTTP error status that
    vLLM's weight-sync client raises), and the sockets' own ConnectionError and TimeoutError."""
    return isinstance(err, (requests.RequestException, ConnectionError, TimeoutError))


# Generate requests in flight per worker at most: every prompt of a step at once, and of the
# steps streamed ahead of it (sampler.max_staleness); vLLM batches them.
REQUESTS_PER_WORKER = 32


def worker_session(connections: int = 10) -> requests.Session:
    """A requests session whose calls retry a worker's transient failures (urllib3's Retry),
    keeping up to `connections` open per worker."""
    retry = Retry(
        total=RETRIES,
        connect=RETRIES,
        read=0,
        status=RETRIES,
        other=0,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=None,  # POST too: generate and reset_prefix_cache can be asked again
        backoff_factor=RETRY_BACKOFF_S,
        raise_on_status=False,  # the last answer is returned, so its status can be named
    )
    session = requests.Session()
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry, pool_maxsize=connections))
    return session


def why_unreachable(err: requests.RequestException) -> str:
    """The operating system's reason in a requests error ("Connection refused"), which
    requests buries in a line about connection pools; else the error's kind."""
    if isinstance(err, requests.Timeout):
        return "no answer in time (a timeout)"
    found = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", str(err))
    return found[-1].strip() if found else type(err).__name__


def answer_snippet(response: requests.Response) -> str:
    """What a worker answered, short and on one line, for an error message."""
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    text = " ".join(response.text.split())
    return f"{kind}, {text[:100]!r}{'...' if len(text) > 100 else ''}"


def is_up(url: str) -> bool:
    """Whether the worker at `url` answers its health check now: polled while it starts."""
    try:
        return requests.get(f"{url}/health", timeout=5).ok
    except requests.RequestException:
        return False


def not_a_worker(session: requests.Session, url: str, timeout: float) -> str | None:
    """None when `url` answers like a vLLM server (GET /v1/models: its list of models); else
    what it does instead, for a WorkerLost before the first weight push, which would wait
    sampler.worker_timeout_s for a worker that never joins."""
    try:
        response = session.get(f"{url}/v1/models", timeout=timeout)
    except requests.RequestException as err:
        return f"cannot be reached: {why_unreachable(err)} (tried {RETRIES + 1} times)"
    if not response.ok:
        snippet = answer_snippet(response)
        return f"answered HTTP {response.status_code} to GET /v1/models ({snippet})"
    try:
        if isinstance(response.json()["data"], list):
            return None
    except (ValueError, KeyError, TypeError):  # not JSON, or not the model list
        pass
    return f"does not answer like a vLLM server: GET /v1/models gave {answer_snippet(response)}"


def held_dtype(session: requests.Session, url: str, timeout: float) -> str | None:
    """The dtype the vLLM server at `url` holds its weights in ("bfloat16", "float32"), from
    /server_info, a route of vLLM's dev mode, which every rlcli worker runs in; None when the
    server does not say (another kind of server, or another vLLM's answer)."""
    try:
        response = session.get(f"{url}/server_info?config_format=json", timeout=timeout)
        dtype = response.json()["vllm_config"]["model_config"]["dtype"]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None
    return dtype.removeprefix("torch.") if isinstance(dtype, str) else None


class WorkerClient:
    """Requests to the K workers at `urls`, each failure a WorkerLost naming the worker.

    `local` is the `LocalWorkers` that started them, if this process did: its logs are named
    in a WorkerLost, and a worker process that has ended is reported as such, which says more
    than a refused connection."""

    def __init__(self, urls: list[str], timeout: float, local=None):
        self.urls, self.timeout, self.local = urls, timeout, local
        self.session = worker_session(REQUESTS_PER_WORKER)
        self.pool = ThreadPoolExecutor(max_workers=max(REQUESTS_PER_WORKER * len(urls), 1))
        self.busy = BusyClock(len(urls))

    def check_workers(self) -> None:
        """WorkerLost unless every URL answers like a vLLM server (at most 60 s each)."""
        for i, url in enumerate(self.urls):
            if problem := not_a_worker(self.session, url, min(self.timeout, 60)):
                raise WorkerLost(
                    f"rollout worker {i} ({url}) {problem}. Each URL in sampler.urls must "
                    "be a running `rlcli rollout-server` (started on that node with the "
                    "learner's model); check that it runs and that the host and port are "
                    "right."
                )

    def held_dtype(self) -> str | None:
        """The dtype every worker holds its weights in (`held_dtype`), None unless all say the
        same one."""
        said = {held_dtype(self.session, url, min(self.timeout, 60)) for url in self.urls}
        return said.pop() if len(said) == 1 else None

    def generate(self, bodies: list[dict]) -> Iterator[tuple[int, dict]]:
        """Ask vLLM's token-in/token-out route for each body at once, body i of worker i mod K
        so that every worker gets a share; (worker, its JSON answer) in the bodies' order."""
        k = len(self.urls)
        route = "inference/v1/generate"
        jobs = [
            self.pool.submit(self._generate, self.urls[i % k], route, body, i % k)
            for i, body in enumerate(bodies)
        ]
        for i, job in enumerate(jobs):
            yield i % k, job.result()

    def _generate(self, url: str, route: str, body: dict, worker: int) -> dict:
        with self.busy.request(worker):
            return self.post(url, route, body, worker)

    def read(self, worker: int, answer: dict, n: int, vocab: int, max_tokens: int):
        """`read_answer` of worker `worker`'s answer, what is wrong with it a WorkerLost."""
        try:
            return read_answer(answer, n, vocab, max_tokens)
        except ValueError as err:
            why = f"answered a generate request with what cannot be trained on: {err}"
            raise WorkerLost(self.lost(worker, why)) from None

    def post(self, url: str, route: str, body, worker: int | None = None) -> dict:
        """POST `body` to a worker's route (transient failures retried); its JSON answer."""
        i = self.urls.index(url) if worker is None else worker
        try:
            response = self.session.post(f"{url}/{route}", json=body, timeout=self.timeout)
        except requests.RequestException as err:
            why = f"stopped answering: {why_unreachable(err)}"
            raise WorkerLost(self.lost(i, why)) from err
        if not response.ok:
            why = f"answered HTTP {response.status_code} to /{route} ({answer_snippet(response)})"
            raise WorkerLost(self.lost(i, why))
        try:
            return response.json() if response.content else {}
        except ValueError:
            why = f"answered /{route} with what is not JSON ({answer_snippet(response)})"
            raise WorkerLost(self.lost(i, why)) from None

    def lost(self, i: int | None, what: str) -> str:
        """The message of a WorkerLost: worker i (None: which one is not known) and `what`."""
        who = f"rollout worker {i} ({self.urls[i]})" if i is not None else "a rollout worker"
        log = f"; its log is {self.local.logs[i]}" if self.local and i is not None else ""
        if self.local is not None and i is not None:
            self.local.check(i)  # a process that ended says more than a refused connection
        return f"{who} {what}{log}."


def vocab_size(model_path: str, tokenizer, trust_remote_code: bool = False) -> int:
    """Rows of the model's embedding (its config's vocab_size; at least the tokenizer's);
    `trust_remote_code`: model.init_kwargs', for a config class shipped with the model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    size = getattr(config.get_text_config(), "vocab_size", None) or 0
    return max(size, len(tokenizer))


class BusyClock:
    """How much of the time each worker had generate requests in flight, paused spans (a weight
    push) not counted: `share()` since its last call, the mean over the workers; and how long
    they were paused (`paused_seconds()`, since its last call)."""

    def __init__(self, workers: int):
        self.lock = threading.Lock()
        self.open = [0] * workers  # requests in flight per worker
        self.busy = [0.0] * workers  # seconds with some in flight, since `since`
        self.mark = [0.0] * workers  # when the span being counted began
        self.paused = False
        self.paused_at = 0.0  # when the pause under way began
        self.paused_s = 0.0  # seconds paused since `paused_seconds` was last called
        self.since = time.perf_counter()

    def _counting(self, i: int) -> bool:
        return self.open[i] > 0 and not self.paused

    def _settle(self, now: float) -> None:
        for i in range(len(self.open)):
            if self._counting(i):
                self.busy[i] += now - self.mark[i]
            self.mark[i] = now

    @contextlib.contextmanager
    def request(self, worker: int):
        with self.lock:
            self._settle(time.perf_counter())
            self.open[worker] += 1
        try:
            yield
        finally:
            with self.lock:
                self._settle(time.perf_counter())
                self.open[worker] -= 1

    def pause(self) -> None:
        with self.lock:
            self.paused_at = time.perf_counter()
            self._settle(self.paused_at)
            self.paused = True

    def resume(self) -> None:
        with self.lock:
            now = time.perf_counter()
            self._settle(now)
            self.paused = False
            self.paused_s += now - self.paused_at

    def paused_seconds(self) -> float:
        with self.lock:
            paused, self.paused_s = self.paused_s, 0.0
        return paused

    def share(self) -> float:
        with self.lock:
            now = time.perf_counter()
            self._settle(now)
            wall = max(now - self.since, 1e-9)
            share = sum(self.busy) / len(self.busy) / wall if self.busy else 0.0
            self.busy, self.since = [0.0] * len(self.busy), now
        return share


def token_versions(spans, length: int) -> list[int] | None:
    """The weight version that sampled each of a response's `length` tokens, from vLLM's
    `weight_versions` spans ([{version, start, end}], the labels rlcli's pushes give:
    `WeightPush.send`); None where the worker gave none, or a label that is not rlcli's."""
    if not isinstance(spans, list) or not spans:
        return None
    versions = [-1] * length
    for span in spans:
        try:
            version, start, end = int(span["version"]), int(span["start"]), int(span["end"])
        except (KeyError, TypeError, ValueError):
            return None  # e.g. "default": weights no push of rlcli's labelled
        start, end = max(start, 0), min(end, length)
        versions[start:end] = [version] * max(end - start, 0)
    return None if -1 in versions else versions


def read_answer(answer, n: int, vocab: int, max_tokens: int) -> list[tuple]:
    """The `n` responses of a worker's generate answer as (token ids, truncated, log-prob of
    each token, the weight version of each token or None), checked. Anything else is a
    ValueError saying what is wrong: an id past the vocabulary would crash the learner, and
    log-probs one short, too many or NaN would train on wrong numbers (the ratio and the KL
    are made from them token by token)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        raise ValueError(f"the answer has no list of choices ({_short(answer)})")
    if len(choices) != n:
        raise ValueError(f"a prompt that asked for {n} responses got {len(choices)}")
    responses = []
    for choice in choices:
        try:
            tokens, finish = choice["token_ids"], choice["finish_reason"]
            logps = [step["logprob"] for step in choice["logprobs"]["content"]]
        except (KeyError, TypeError):
            raise ValueError(
                f"a response lacks token_ids, finish_reason or logprobs.content ({_short(choice)})"
            ) from None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise ValueError(f"a response's token_ids are not a list of integers: {_short(tokens)}")
        if outside := [t for t in tokens if not 0 <= t < vocab]:
            raise ValueError(
                f"token id {outside[0]} is outside the model's vocabulary (ids 0 to {vocab - 1}); "
                "is the worker serving the learner's model?"
            )
        if len(tokens) > max_tokens:
            raise ValueError(
                f"a response of {len(tokens)} tokens is longer than sampler.max_new_tokens="
                f"{max_tokens}"
            )
        if len(logps) != len(tokens):
            raise ValueError(
                f"a response of {len(tokens)} tokens came with {len(logps)} log-probs; exactly "
                "one per token is needed"
            )
        for k, logp in enumerate(logps):
            if type(logp) not in (int, float) or not math.isfinite(logp):
                raise ValueError(
                    f"the log-prob of token {k} of a response is {logp!r}, not a finite number"
                )
        versions = token_versions(choice.get("weight_versions"), len(tokens))
        responses.append((tokens, finish == "length", [float(x) for x in logps], versions))
    return responses


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 100 else text[:100] + "..."
