"""Ctrl-C stops a run at every moment of its life: model load, the vLLM engine's start, a
rollout worker's start, the first step, a weight push, a checkpoint being written.

Each run is the real `rlcli train` on the tiny model, started as a script's background job
starts it (`rlcli train ... &`): with SIGINT ignored, which Python leaves so unless rlcli sets
its handler (it used to, only in the loop). Before the loop the run exits 130 saying nothing
more was saved; in it, after the step under way, with a checkpoint
(tests/lifecycle/test_resume.py checks that such a run resumes). Either way: no traceback, and
no rollout worker left running.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcli.lifecycle.checkpoint import load_checkpoint
from tests.conftest import REPO, tiny

TINY = tiny("trainer.max_steps=50", sampler=None)
# Before the loop: "interrupted before the run started" (Hydra still composing the config) or
# "interrupted; nothing more was saved" (the job started).
BEFORE_THE_LOOP = re.compile(r"rlcli: interrupted(; nothing more| before the run started)")


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """`rlcli train` with SIGINT ignored when it starts, as in a script's background job."""
    command = [sys.executable, "-m", "rlcli", "train", *TINY, *overrides,
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip


def wait_for(condition, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def servers(proc: subprocess.Popen) -> list[int]:
    """The PIDs of the learner's rollout-worker servers (children running vLLM's server)."""
    found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split() if "vllm" in text(Path(f"/proc/{p}/cmdline"))]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def interrupt(proc: subprocess.Popen, workers: list[int], codes=(130,)) -> tuple[str, float]:
    """SIGINT, then (stderr, seconds to exit); asserts an exit in `codes`, no traceback, no
    worker left."""
    proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    seconds = time.monotonic() - began
    assert proc.returncode in codes, stdout + stderr
    assert "Traceback" not in stdout + stderr
    deadline = time.monotonic() + 15
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in workers), "a rollout worker outlived the run"
    return stderr, seconds


def stopped_after_a_step(stderr: str, run_dir: Path) -> int:
    match = re.search(r"stopped by SIGINT after step (\d+); checkpoint saved in (\S+)\.", stderr)
    assert match, stderr
    step, checkpoint = int(match.group(1)), Path(match.group(2))
    assert checkpoint == run_dir / "checkpoints" / f"step_{step}"
    assert load_checkpoint(checkpoint)[0]["step"] == step
    return step


def test_ctrl_c_while_the_model_loads(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler=hf")
    log = run_dir / "train.log"
    wait_for(log.exists, proc)  # Hydra's start: the imports and the model's load follow
    stderr, _ = interrupt(proc, [])
    assert BEFORE_THE_LOOP.search(stderr), stderr
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())


def test_ctrl_c_while_the_vllm_engine_starts(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler=vllm")
    wait_for(lambda: "vllm" in text(run_dir / "train.log"), proc)  # the engine says it starts
    # rlcli says it was interrupted and exits 130; the in-process engine's teardown may then
    # end the process by SIGINT itself (-2), which a shell reports as 130 all the same.
    stderr, _ = interrupt(proc, [], codes=(130, -signal.SIGINT))
    assert BEFORE_THE_LOOP.search(stderr) or "stopped by SIGINT after step 1" in stderr, stderr


# A user's loss module that takes a Ctrl-C during its import as a library might, standing in
# for libraries CI caught, deterministically. Each sleeps until interrupted.
IMPORTING = """
import pathlib, time
import torch
pathlib.Path(__file__).with_suffix(".importing").touch()
try:
    time.sleep(120)
except KeyboardInterrupt as err:
"""
LOSS = """
def loss(ratio, advantages, lo, hi):  # PPO's clipped loss: a run that would train
    clipped = torch.minimum(torch.maximum(ratio, lo), hi)
    return -torch.minimum(ratio * advantages, clipped * advantages), {}
"""
LIBRARIES = {
    # pydantic, building vLLM's config in compiled code, turned a Ctrl-C into a SchemaError:
    # the run printed a traceback and exited 1.
    "wraps it in its own error": '    raise RuntimeError("a library\'s own error") from err',
    # Compiled code in the vLLM engine's start that cannot raise lost one ("Exception ignored
    # in: 'cls_name'"), and the run trained all its steps and exited 0.
    "swallows it": "    pass",
}


@pytest.mark.parametrize("library", LIBRARIES)
def test_ctrl_c_that_a_library_takes_still_stops_before_the_first_step(tmp_path, library):
    module = tmp_path / "own_loss.py"
    module.write_text(IMPORTING + LIBRARIES[library] + LOSS)
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler=hf", f"algo.loss={module}:loss")
    wait_for(module.with_suffix(".importing").exists, proc)
    stderr, _ = interrupt(proc, [])
    assert BEFORE_THE_LOOP.search(stderr), stderr
    assert "RuntimeError" not in stderr
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())


def test_ctrl_c_while_a_rollout_worker_starts_stops_within_seconds(tmp_path):
    # It used to do nothing (SIGINT ignored until the loop): the run trained all its steps.
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler.workers=1")
    wait_for(lambda: servers(proc), proc)
    workers = servers(proc)
    time.sleep(2)  # the server is importing vLLM and starting its engine
    stderr, seconds = interrupt(proc, workers)
    assert BEFORE_THE_LOOP.search(stderr), stderr
    # A starting server ends on SIGTERM only once its engine is up: it has 10 s, then SIGKILL.
    assert seconds < 30


def test_ctrl_c_in_the_first_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler=hf")
    wait_for(lambda: "rlcli: training" in text(run_dir / "train.log"), proc)
    stderr, _ = interrupt(proc, [])
    # The line comes a moment before the loop's guard is up: a signal may still land before.
    assert BEFORE_THE_LOOP.search(stderr) or stopped_after_a_step(stderr, run_dir) == 1


def test_ctrl_c_in_a_weight_push(tmp_path):
    # The worker's log names each push's first request once it is answered: the second push,
    # after step 1's update, is then under way.
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler.workers=1")
    pushes = lambda: text(run_dir / "workers" / "worker-0.log").count("/start_weight_update")  # noqa: E731
    wait_for(lambda: pushes() >= 2, proc)
    workers = servers(proc)
    stderr, _ = interrupt(proc, workers)
    assert stopped_after_a_step(stderr, run_dir) >= 1


def test_ctrl_c_while_a_checkpoint_is_written(tmp_path):
    # A wider tiny model, so that writing a checkpoint (~150 MB) takes long enough to be caught.
    run_dir = tmp_path / "run"
    proc = start(run_dir, "sampler=hf", "model.tiny_hidden=256", "model.tiny_heads=4",
                 "trainer.save_every=1")  # fmt: skip
    root = run_dir / "checkpoints"
    wait_for(lambda: root.exists() and any(root.glob(".step_1-*")), proc)
    stderr, _ = interrupt(proc, [])
    step = stopped_after_a_step(stderr, run_dir)
    assert step in (1, 2)  # the checkpoint under way is finished, then the next step's
    assert not list(root.glob(".*"))


@pytest.mark.parametrize("moment", ["the start", "the loop"])
def test_sigterm_still_stops_as_before(tmp_path, moment):
    # The same exits for SIGTERM, which was never ignored: 143.
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcli", "train", *TINY, "sampler=hf", f"hydra.run.dir={run_dir}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The loop: once step 1's row is written (metrics.jsonl is created before the loop starts,
    # and may hold an evaluation's row); the start: as soon as Hydra has made the run directory.
    if moment == "the loop":
        wait_for(lambda: "time/step" in text(run_dir / "metrics.jsonl"), proc)
    else:
        wait_for((run_dir / "train.log").exists, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    # In the loop rlcli saves and exits 143; before it, SIGTERM's default ends the process
    # (the shell's 143 too), and each local worker receives SIGTERM with it.
    assert proc.returncode == (143 if moment == "the loop" else -signal.SIGTERM), stdout + stderr
    assert "Traceback" not in stdout + stderr
