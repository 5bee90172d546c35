"""scripts/paper_effects.py: every claim's experiment runs end to end on the tiny model (one
seed, two steps) so that the experiments keep working as the code changes; the verdict and a
run's value are computed as docs/paper-effects.md says."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from paper_effects import CLAIMS, run_value, verdict  # noqa: E402

SCRIPT = Path(__file__).parents[1] / "scripts" / "paper_effects.py"


@pytest.mark.parametrize("key", sorted(CLAIMS))
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
        if arm != next(iter(claim.arms)):
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
