"""Never lose a run: exact resume, SIGKILL mid-run and mid-checkpoint, Ctrl-C / SIGTERM, and
non-finite steps. Runs use the tiny random model; the CLI tests start the real `rlcli train`."""

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlcli.lifecycle.checkpoint import list_checkpoints, load_checkpoint
from rlcli.lifecycle.guard import EXIT_BAD_STEPS, RunStopped
from rlcli.tracking.metrics import read_metrics
from rlcli.train.loop import train
from rlcli.validate import compose
from tests.conftest import REPO, tiny

SMALL = tiny("trainer.lr=1e-2", "trainer.prompts_per_step=4", "trainer.group_size=4",
             sampler=None, new_tokens=16)  # fmt: skip


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics without wall-clock timings, which differ from run to run."""
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        # vLLM sampling (its seed counter), KL to the reference with the adaptive controller.
        ["sampler=vllm", "algo.kl_target=0.01"],
        # DCPO's per-prompt SAS state, sampled with transformers (torch's global RNG); six
        # problems, so that steps 3 and 4 revisit prompts the saved state has seen.
        ["sampler=hf", "algo=dcpo", "data.num_train=6"],
        # PPO: the critic, its optimiser, and two mini-batches per step with warm-up.
        ["sampler=hf", "algo=ppo", "trainer.mini_batches=2", "trainer.warmup_steps=3"],
        # DUPO's random duplicates of informative groups.
        ["sampler=hf", "algo=dupo"],
        # LoRA: the adapters (PEFT files) and their optimiser state; the reference is the
        # base model with the adapters off; vLLM gets the merged weights.
        ["sampler=vllm", "model.lora.rank=8", "algo.beta=0.04"],
        # LoRA on PPO's critic too, its value head saved whole beside its adapters.
        ["sampler=hf", "algo=ppo", "model.lora.rank=8"],
    ],
    ids=["grpo-vllm-kl", "dcpo-hf", "ppo-critic", "dupo", "lora-vllm-kl", "lora-ppo"],
)
def test_two_steps_plus_resume_equal_four_straight(tmp_path, overrides):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(compose([*SMALL, *overrides, "trainer.max_steps=4"]), straight)
    train(compose([*SMALL, *overrides, "trainer.max_steps=2"]), split)
    if "algo=dcpo" in overrides:  # as a checkpoint written before the estimators' state slot
        legacy_state_key(split / "checkpoints" / "step_2", "estimator_state", "sas")
    # A fresh process-level state would not help a wrong resume: scramble the RNGs anyway.
    torch.manual_seed(12345)
    train(compose([*SMALL, *overrides, "trainer.max_steps=4", "trainer.resume=auto"]), split)

    expected, got = comparable(read_metrics(straight)), comparable(read_metrics(split))
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert got == expected
    lora = "model.lora.rank=8" in overrides
    final = f"checkpoints/step_4/{'adapter_model' if lora else 'model'}.safetensors"
    a, b = load_file(straight / final), load_file(split / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if "algo=ppo" in overrides:  # the critic's weights (its adapters and head with LoRA)
        final = final.replace("step_4/", "step_4/critic/")
        a, b = load_file(straight / final), load_file(split / final)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def legacy_state_key(checkpoint: Path, key: str, old: str) -> None:
    """Rename `key` in the checkpoint's trainer_state.json to `old`, manifest rewritten."""
    from rlcli.lifecycle.checkpoint import _write_manifest

    path = checkpoint / "trainer_state.json"
    state = json.loads(path.read_text())
    assert state[key]["states"]  # DCPO saved its per-prompt statistics
    state[old] = state.pop(key)
    path.write_text(json.dumps(state))
    _write_manifest(checkpoint)


def test_checkpoints_are_pruned_to_keep_last_and_hold_no_pickled_objects(tmp_path):
    train(compose([*SMALL, "sampler=hf", "trainer.max_steps=3", "trainer.save_every=1"]), tmp_path)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2", "step_3"]  # keep_last: 2
    state, tensors = load_checkpoint(tmp_path / "checkpoints" / "step_3")  # weights_only load
    assert state["step"] == 3 and state["data_position"] == 3 * 4
    assert set(tensors) == {"optimizer", "scheduler"}
    assert len(state["rng"]["python"][1]) == 625 and len(state["rng"]["numpy"][1]) == 624


def test_resume_null_refuses_to_overwrite_checkpoints(tmp_path):
    from rlcli.config import ConfigError

    train(compose([*SMALL, "sampler=hf", "trainer.max_steps=1"]), tmp_path)
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        fresh = compose([*SMALL, "sampler=hf", "trainer.max_steps=2", "trainer.resume=null"])
        train(fresh, tmp_path)


def huge_rewards(prompts, responses, answers, **fields):
    """Rewards of +-3e38, near float32's limit: Dr.GRPO's unnormalised advantages make the
    token-summed loss overflow to inf (a user's reward of absurd scale)."""
    return [3e38 if i % 2 else -3e38 for i in range(len(responses))]


def test_non_finite_steps_are_skipped_then_stop_the_run_with_a_checkpoint(tmp_path, tiny_model_dir):
    cfg = compose(
        [*SMALL, "sampler=hf", "algo=dr_grpo", "reward=python",
         "reward.function=test_resume:huge_rewards", "trainer.max_steps=10",
         "trainer.max_bad_steps=2"]
    )  # fmt: skip
    with pytest.raises(RunStopped) as stopped:
        train(cfg, tmp_path)
    assert stopped.value.exit_code == EXIT_BAD_STEPS
    message = str(stopped.value)
    assert "stopped after step 2" in message and "non-finite loss or gradient" in message
    assert "trainer.resume=auto" in message
    rows = read_metrics(tmp_path)
    assert [r["nonfinite/skipped_updates"] for r in rows] == [1.0, 1.0]
    assert not math.isfinite(rows[0]["loss/policy"])
    # No update was applied: the checkpoint holds the initial weights, all finite.
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    saved = load_file(tmp_path / "checkpoints" / "step_2" / "model.safetensors")
    assert all(torch.equal(initial[k], saved[k]) for k in initial)


# --- the real command, killed and interrupted -------------------------------------------------


def command(run_dir: Path, *overrides: str) -> list[str]:
    """`rlcli train` on the tiny model, sampling with transformers, writing to `run_dir`."""
    return [sys.executable, "-m", "rlcli", "train", *SMALL, "sampler=hf",
            f"hydra.run.dir={run_dir}", *overrides]  # fmt: skip


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        command(run_dir, *overrides), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def wait_for(condition, timeout=240.0, every=0.001):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    train(compose([*SMALL, "sampler=hf", "trainer.max_steps=6"]), straight)

    run_dir = tmp_path / "killed"
    proc = start(run_dir, "trainer.max_steps=6", "trainer.save_every=2")
    wait_for(lambda: steps_logged(run_dir) >= 3 or proc.poll() is not None, every=0.05)
    proc.kill()  # SIGKILL: no handler runs, step 3 was logged but never checkpointed
    proc.wait()
    assert steps_logged(run_dir) < 6
    again = command(run_dir, "trainer.max_steps=6", "trainer.save_every=2")
    out = subprocess.run(again, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(r"resuming from .*step_2 \(step 2\)", out.stdout)
    got = comparable(read_metrics(run_dir))
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]  # step 3's old row was replaced
    assert got == comparable(read_metrics(straight))


def test_sigkill_while_writing_a_checkpoint_never_uses_the_partial_one(tmp_path):
    # A wider tiny model, so that writing a checkpoint (weights + Adam state, ~150 MB) takes
    # long enough to be caught in the act.
    wide = ["model.tiny_hidden=256", "model.tiny_heads=4", "trainer.save_every=1",
            "trainer.max_steps=4"]  # fmt: skip
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    proc = start(run_dir, *wide)
    wait_for(lambda: (root / "step_1").exists() or proc.poll() is not None, every=0.01)
    partial = lambda: [p for p in root.glob(".step_2-*")] or proc.poll() is not None  # noqa: E731
    wait_for(partial)
    proc.kill()
    proc.wait()
    leftovers = list(root.glob(".step_2-*"))
    assert leftovers, "the process finished writing before it could be killed"
    assert not (root / "step_2").exists()
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_1"]

    out = subprocess.run(command(run_dir, *wide), cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(r"resuming from .*step_1 \(step 1\)", out.stdout)
    assert "a checkpoint whose writing was interrupted" in out.stdout
    assert not list(root.glob(".*"))
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_3", "step_4"]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]
    state, _ = load_checkpoint(root / "step_4")
    assert state["step"] == 4


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_saves_a_checkpoint_and_says_how_to_resume(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    proc = start(run_dir, "trainer.max_steps=200")
    wait_for(lambda: steps_logged(run_dir) >= 1 or proc.poll() is not None, every=0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stdout + stderr
    name = signal.Signals(sig).name
    match = re.search(rf"stopped by {name} after step (\d+); checkpoint saved in (\S+)\.", stderr)
    assert match, stderr
    step, checkpoint = int(match.group(1)), Path(match.group(2))
    assert checkpoint == run_dir / "checkpoints" / f"step_{step}"
    assert load_checkpoint(checkpoint)[0]["step"] == step == steps_logged(run_dir)
    # The printed command continues the run (here to a nearer end).
    resume = shlex.split(stderr.split("Resume with:")[1].strip().splitlines()[0])
    assert resume[:2] == ["rlcli", "train"] and "trainer.resume=auto" in resume
    assert f"hydra.run.dir={run_dir}" in resume
    args = [a for a in resume[2:] if not a.startswith("trainer.max_steps=")]
    out = subprocess.run(
        [sys.executable, "-m", "rlcli", "train", *args, f"trainer.max_steps={step + 1}"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, step + 2))
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == step + 1
    assert os.path.isdir(run_dir / "checkpoints" / f"step_{step + 1}")


def test_the_promise_of_an_exact_resume_names_what_rollout_workers_do_not_repeat():
    # Two uninterrupted runs with sampler.workers=1 differ at step 1 (vLLM servers take no seed
    # per request), so the promise on the reliability page must say where it holds.
    page = (REPO / "docs" / "reliability.md").read_text()
    promise = page[page.index("- A resumed run continues exactly") :].split("\n- ")[0]
    promise = " ".join(promise.split())
    assert "Rollout workers (`sampler.workers`, `sampler.urls`)" in promise
    assert "sample different responses from step 1 on" in promise
    # The scaling page, where streaming's resumes are told, promises no more for k = 0.
    scaling = " ".join((REPO / "docs" / "scaling.md").read_text().split())
    assert "resume stays exact" not in scaling
    assert "samples other responses than the run would have" in scaling
