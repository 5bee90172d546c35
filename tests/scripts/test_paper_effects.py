"""scripts/paper_effects.py: every claim's experiment runs end to end on the tiny model (one
seed, two steps; one claim in the suite, the others with `-m slow`) so that the experiments
keep working as the code changes; the verdict and a run's value are computed as
docs/paper-effects.md says."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from paper_claims import evaluate_args, path_override  # noqa: E402
from paper_effects import (  # noqa: E402
    CLAIMS,
    at_baseline_rounds,
    run_value,
    same_overrides,
    verdict,
    with_correctness,
    with_sample_lengths,
)

SCRIPT = REPO / "scripts" / "paper_effects.py"


# One experiment in the suite (dynamic_sampling: curves by generation rounds); the other eight,
# dpo_pairs among them (data prepared, then each run evaluated), 4 minutes together, run with
# `pytest -m slow`.
IN_THE_SUITE = {"dynamic_sampling"}


@pytest.mark.parametrize(
    "key",
    [k if k in IN_THE_SUITE else pytest.param(k, marks=pytest.mark.slow) for k in sorted(CLAIMS)],
)
def test_each_experiment_runs_on_the_tiny_model(tmp_path, key):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), key, "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / key
    result = json.loads((out / "result.json").read_text())
    claim = CLAIMS[key]
    assert list(result["arms"]) == list(claim.arms)
    for arm, entry in result["arms"].items():
        for metric in (claim.metric, *claim.also):
            assert list(entry[metric]["by_seed"]) == ["0"], (arm, metric)
        # One seed cannot tell an effect from noise.
        if arm in (claim.judged or list(claim.arms)[1:]):
            assert entry["verdict"] == "inconclusive at this scale"
    assert (out / "curves.png").stat().st_size > 0
    assert claim.metric in (out / "result.md").read_text()


def test_the_verdict_reads_the_paired_interval_in_the_papers_direction():
    assert verdict([1.0, 1.1, 0.9], direction=+1) == "reproduced"
    assert verdict([1.0, 1.1, 0.9], direction=-1) == "not reproduced"
    assert verdict([1.0, -1.0, 0.5], direction=+1) == "inconclusive at this scale"
    assert verdict([2.0], direction=+1) == "inconclusive at this scale"  # one seed


def test_a_runs_value_is_its_mean_over_all_or_the_late_steps():
    rows = [{"step": s, "m": float(s)} for s in range(1, 5)] + [{"step": 5}]
    assert run_value(rows, "m", "all") == 2.5
    assert run_value(rows, "m", "late") == 3.5  # steps 3 and 4 of the 4 that logged it


def test_the_lengths_of_wrong_and_right_responses_come_from_samples_jsonl(tmp_path):
    samples = tmp_path / "samples.jsonl"
    lines = [(1, 0.0, 10), (1, 0.0, 30), (1, 1.0, 4), (2, 1.0, 6), (2, None, 99)]
    samples.write_text(
        "".join(json.dumps({"step": s, "reward": r, "length": n}) + "\n" for s, r, n in lines)
    )
    rows = with_sample_lengths([{"step": 1}, {"step": 2}], samples)
    assert rows[0] == {"step": 1, "samples/wrong_length": 20.0, "samples/right_length": 4.0}
    # Step 2 had no wrong response, and an unscored one (reward null) counts as neither.
    assert rows[1] == {"step": 2, "samples/right_length": 6.0}


def test_an_arm_that_ran_with_other_overrides_is_told_apart_from_hydras_spelling():
    # Hydra writes a sweep's overrides back normalised: 2e-5 as 2e-05, false as False.
    ran = ["logger.progress=False", "trainer.lr=2e-05", "algo=grpo"]
    assert same_overrides(ran, ["algo=grpo", "logger.progress=false", "trainer.lr=2e-5"])
    assert not same_overrides(ran, ["logger.progress=false", "trainer.lr=1e-4", "algo=grpo"])
    assert not same_overrides(ran, ["logger.progress=false", "trainer.lr=2e-5"])


def test_rlcli_evals_overrides_for_a_run_inside_a_sweeps_job_directory_parse():
    # Three seeds put a job in 0_seed=0; one seed (the smoke tests) in 0, so only this catches it.
    from hydra.core.override_parser.overrides_parser import OverridesParser

    job = Path("/runs/dpo_pairs/arm0/0_seed=0")
    model = path_override("model.path", job / "checkpoints" / "step_20")
    args = evaluate_args(job / "after", False, model)
    parsed = OverridesParser.create().parse_overrides(args[1:])  # after the subcommand
    values = {o.key_or_group: o.value() for o in parsed}
    assert values["model.path"] == str(job / "checkpoints" / "step_20")
    assert values["hydra.run.dir"] == str(job / "after")


def test_arms_are_compared_within_the_generation_rounds_the_baseline_sampled():
    grpo = [{"step": i + 1, "batch/gen_batches": 1.0, "m": m} for i, m in enumerate([0.1, 0.3])]
    dynamic = [{"step": i + 1, "batch/gen_batches": n, "m": m}
               for i, (n, m) in enumerate([(1.0, 0.5), (1.0, 0.7), (3.0, 0.9)])]  # fmt: skip
    result = at_baseline_rounds("m", {"grpo": {0: grpo}, "dynamic": {0: dynamic}})
    assert result["grpo"]["by_seed"] == {0: 0.2}
    assert result["dynamic"]["by_seed"] == {0: 0.6}  # its third step needed rounds 3 to 5


def test_dapos_plus_minus_one_reward_becomes_the_share_of_right_answers():
    rows = with_correctness([{"reward/math_pm1": -0.5}, {"reward/math": 0.3}])
    assert rows == [{"reward/math_pm1": -0.5, "reward/math": 0.25}, {"reward/math": 0.3}]
