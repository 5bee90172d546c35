"""Behaviour kept through refactors: seeded GRPO, DAPO, PPO and DPO runs of the real
`rlcli train` on the tiny model give the per-step metrics recorded in `tests/fixtures/`.

The numbers are recorded by `RLCLI_RECORD_GOLDEN=1 pytest tests/train/test_golden.py`; a change
that alters what a run computes (a sampled token, a reward, a loss, a gradient) changes them.
Wall-clock timings are left out. Re-record only for a change that is meant to alter the
numbers, and say why in its commit. Last re-recorded to make the record portable across CPU
kinds: the runs were in bfloat16, whose matmuls round differently on CPUs with AMX than on
those with AVX512-BF16 only, so each kind had a record of its own and a suite run on the
other kind failed. They now compute in float32 (`trainer.bf16_autocast=false`), one record
serves every x86 CPU, and floats are compared within float32 rounding (see REL and ABS).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, tiny

GOLDEN = FIXTURES / "golden_metrics.json"
PAIRS = FIXTURES / "pairs.jsonl"
# float32 throughout: the learner, the reference, the HF sampler and the vLLM engine. In
# bfloat16 the record depended on the CPU's matmul instructions (AMX or AVX512-BF16: floats
# 0.7% apart after three steps); float32 needs no such instructions, and is faster here
# (the four runs: 35 s against 75 s on a 2-core AVX512-BF16 machine).
FLOAT32 = "trainer.bf16_autocast=false"
TINY = tiny("trainer.lr=1e-2", "trainer.prompts_per_step=4", "trainer.group_size=4",
            "trainer.max_steps=3", FLOAT32, sampler=None, new_tokens=16)  # fmt: skip
RUNS = {
    # vLLM's engine, KL to the reference in the loss, the adaptive KL controller (in float32
    # sampler.old_logp=auto is the learner's log-probs).
    "grpo": [*TINY, "algo=grpo", "sampler=vllm", "algo.kl_target=0.01"],
    # Dynamic sampling, clip-higher, token-mean aggregation (the tiny model never ends a
    # response within 16 tokens, so overlong filtering would leave no loss at all).
    "dapo": [*TINY, "algo=dapo", "sampler=hf", "algo.overlong_filter=false"],
    # The critic, GAE with KL in the reward, two mini-batches.
    "ppo": [*TINY, "algo=ppo", "sampler=hf", "trainer.mini_batches=2"],
    # Preference pairs, the cached reference.
    "dpo": [
        "model=tiny",
        "algo=dpo",
        "data=pairs",
        f"data.path={PAIRS}",
        "data.num_test=2",
        "trainer.max_steps=3",
        "trainer.lr=1e-3",
        "logger.progress=false",
        FLOAT32,
    ],  # fmt: skip
}
# Facts of the sampled tokens and of the bookkeeping, compared exactly: lengths, counts and
# fractions of tokens, the rule rewards of the sampled text (and their mean and spread), the
# learning rate. A kernel's rounding cannot move them short of flipping a sampled token.
# (DPO's reward/* are implicit rewards, log-prob ratios: floats like the rest.)
EXACT_KEYS = {"step", "actor/lr", "reward/mean", "reward/std", "reward/space_rate", "reward/errors"}
EXACT_PREFIXES = ("batch/", "response/", "clip/", "nonfinite/")
# Float32 kernels still differ in the last bits between machines (MKL picks its SGEMM by
# the CPU's vendor and model; vector widths and thread counts change reduction orders), and
# three steps at lr 1e-2 grow that. Measured on AVX512-BF16 against the recorded run,
# under another SGEMM (MKL_CBWR=COMPATIBLE), AVX2 reductions (ATEN_CPU_CAPABILITY=avx2), one
# thread, and all three: the same tokens and counts, floats above 0.1 within 1e-5 relative.
# REL is ten times that (float32's spacing is 1.2e-7).
REL = 1e-4
# Metrics near zero are differences of far larger log-probs (a token's about 11 nats, a DPO
# sequence's about 200 times beta = 0.1) and carry their rounding: rollout/kl ~ 4e-7 is pure
# noise, DPO's implicit rewards moved by up to 1.5e-6 (one float32 spacing of 20 is 1.9e-6),
# the largest move measured below 0.1. ABS is about five such spacings. (A 1% lr change
# moves GRPO's kl by 2.7e-5 and its grad norm by 6e-4 relative: both still fail.)
ABS = 1e-5


def run_metrics(overrides: list[str], run_dir: Path) -> list[dict]:
    """The per-step metrics of `rlcli train OVERRIDES`, without timings."""
    cmd = [sys.executable, "-m", "rlcli", "train", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))} for row in rows
    ]


def same(key: str, recorded, got) -> bool:
    """Whether metric `key` of a run is the recorded one: exactly for token facts, within
    float32 rounding (REL, ABS) for what the model computed."""
    if key in EXACT_KEYS or key.startswith(EXACT_PREFIXES) or not isinstance(recorded, float):
        return got == recorded
    if math.isnan(recorded):
        return math.isnan(got)
    return got == pytest.approx(recorded, rel=REL, abs=ABS)


def mismatches(got: list[dict], expected: list[dict]) -> list[str]:
    """What differs between a run's rows and the recorded ones (empty when they match)."""
    if [sorted(row) for row in got] != [sorted(row) for row in expected]:
        return ["the steps or the metric names differ"]
    return [
        f"step {step} {key}: recorded {value!r}, got {row[key]!r}"
        for step, (row, want) in enumerate(zip(got, expected, strict=True), start=1)
        for key, value in want.items()
        if not same(key, value, row[key])
    ]


@pytest.mark.parametrize("algo", list(RUNS))
def test_seeded_run_matches_the_recorded_metrics(tmp_path, algo):
    got = run_metrics(RUNS[algo], tmp_path)
    if os.environ.get("RLCLI_RECORD_GOLDEN"):
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps({**recorded, algo: got}, indent=1, sort_keys=True) + "\n")
    assert not mismatches(got, json.loads(GOLDEN.read_text())[algo])


def test_the_comparison_tells_rounding_from_a_change():
    # The tolerances must not hide a real change: a token more, a grad norm 0.1% off, a KL of
    # 1e-4 where 0 was recorded (GRPO's first step), a rule reward in its last bits fail;
    # float32 rounding of the size measured between kernels passes.
    recorded = json.loads(GOLDEN.read_text())["grpo"]
    first = recorded[0]

    def first_step(**changes) -> list[str]:
        return mismatches([{**first, **changes}, *recorded[1:]], recorded)

    assert not first_step()
    assert first_step(**{"batch/tokens": first["batch/tokens"] + 1})
    assert first_step(**{"actor/grad_norm": first["actor/grad_norm"] * 1.001})
    assert first_step(**{"loss/kl": first["loss/kl"] + 1e-4})
    assert first_step(**{"reward/mean": first["reward/mean"] * (1 + 1e-7)})
    assert not first_step(
        **{"actor/grad_norm": first["actor/grad_norm"] * (1 + 2e-5), "rollout/kl": 1e-6}
    )
