"""The pages made from the code are up to date, and the table they are made from is true.

- docs/reference/configuration.md, docs/reference/metrics.md and docs/recipes.md equal what
  `scripts/make_docs.py` writes now: a comment changed in conf/, a metric added to
  rlcli/tracking/metric_names.py or a recipe edited without running the script fails here.
- The metric table is complete and has nothing extra: short tiny-model runs of each kind
  (GRPO on vLLM with evaluation, PPO with PPO-ptx, DAPO, DUPO, DPO, the calculator env with
  evaluation, and each loss that counts something of its own) write only documented names,
  and every documented name is written by one of them or listed in NOT_IN_THESE_RUNS.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from rlcli.tracking.metric_names import all_metrics, documented
from rlcli.train.loop import train
from rlcli.validate import compose
from tests.conftest import FIXTURES, REPO, tiny

SCRIPT = REPO / "scripts" / "make_docs.py"
PAIRS = FIXTURES / "pairs.jsonl"
PTX_TEXT = REPO / "recipes" / "data" / "pretraining_sample.txt"


def make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_what_the_script_writes():
    stale = make_docs().stale_pages()
    assert not stale, (
        f"stale: {', '.join(stale)} (not what scripts/make_docs.py writes from conf/, the metric "
        "table and recipes/): run `.venv/bin/python scripts/make_docs.py` and commit the pages."
    )


def test_check_names_the_stale_page_and_exits_1(tmp_path):
    docs = make_docs()
    for page, render in docs.PAGES.items():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(render())
    check = [sys.executable, str(SCRIPT), "--check", "--root", str(tmp_path)]
    fresh = subprocess.run(check, capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    metrics_page = tmp_path / "docs" / "reference" / "metrics.md"
    metrics_page.write_text(metrics_page.read_text().replace("loss/policy", "loss/polciy"))
    stale = subprocess.run(check, capture_output=True, text=True)
    assert stale.returncode == 1
    assert "docs/reference/metrics.md is stale" in stale.stderr
    assert "configuration.md" not in stale.stderr


# ---- the metric table against what runs write ----

TINY = tiny("trainer.max_steps=1", "trainer.prompts_per_step=2", "trainer.group_size=2",
            sampler=None)  # fmt: skip
EVAL = ["trainer.eval_every=1", "eval.max_problems=2", "eval.k=2"]
HF = [*TINY, "sampler=hf"]
RUNS = {
    # vLLM's log-probs against the learner's (rollout/*) and the correction by them (the
    # default where the run computes in bfloat16, named here for every CPU), the KL in the
    # loss, evaluation (also before training: a row of step 0).
    "grpo": [
        *TINY,
        "sampler=vllm",
        "sampler.old_logp=sampler",
        *EVAL,
        "trainer.val_before_train=true",
    ],
    # The critic (value/*), the KL in the reward, PPO-ptx.
    "ppo": [*HF, "algo=ppo", "algo.ptx_coef=0.5", f"algo.ptx_path={PTX_TEXT}"],
    # Dynamic sampling (the tiny model never ends a response, so no overlong filter).
    "dapo": [*HF, "algo=dapo", "algo.overlong_filter=false"],
    "dupo": [*HF, "algo=dupo", "algo.overlong_filter=false"],
    "dpo": [
        "model=tiny",
        "algo=dpo",
        "data=pairs",
        f"data.path={PAIRS}",
        "data.num_test=2",
        "trainer.max_steps=1",
        "logger.progress=false",
    ],
    # Tools (env/*), their evaluation, the math reward.
    "calculator": [*HF, "env=calculator", "reward=math", *EVAL],
    # Losses that count something of their own.
    **{loss: [*HF, f"algo={loss}"] for loss in ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov")},
}
# Documented names none of RUNS writes, and why: each needs what these runs do not start.
NOT_IN_THESE_RUNS = {
    **{
        name: "rollout workers (sampler.workers, sampler.urls)"
        for name in (
            "rollout/staleness_mean",
            "rollout/staleness_max",
            "rollout/staleness_<k>",
            "rollout/versions_per_response",
            "rollout/generating_share",
            "rollout/paused_s",
        )
    },
    "reward/log_only_errors": "a reward.weights entry of 0",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, set[str]]:
    """Per run of RUNS, the metric names its metrics.jsonl holds."""
    names = {}
    for run, overrides in RUNS.items():
        run_dir = tmp_path_factory.mktemp(run)
        train(compose(overrides), run_dir)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        names[run] = set().union(*rows)
    return names


def test_every_metric_a_run_writes_is_documented(written):
    undocumented = {
        run: missing
        for run, names in written.items()
        if (missing := sorted(name for name in names if documented(name) is None))
    }
    assert not undocumented, (
        "metrics missing from rlcli/tracking/metric_names.py (add each with its meaning, then "
        f"run scripts/make_docs.py), by run: {undocumented}"
    )


def test_every_documented_metric_is_written_by_a_run(written):
    emitted = {documented(name).name for names in written.values() for name in names
               if documented(name) is not None}  # fmt: skip
    never = sorted(m.name for m in all_metrics() if m.name not in emitted)
    assert never == sorted(NOT_IN_THESE_RUNS), (
        "documented metrics that no run writes, beyond NOT_IN_THESE_RUNS: a name that no "
        "longer exists, or a run kind missing from RUNS: "
        f"{sorted(set(never) - set(NOT_IN_THESE_RUNS))}; listed but written: "
        f"{sorted(set(NOT_IN_THESE_RUNS) - set(never))}"
    )


def test_patterns_match_one_name_part():
    assert documented("reward/math").name == "reward/<component>"
    assert documented("reward/mean").name == "reward/mean"  # its own row first
    assert documented("eval/pass@16").name == "eval/pass@<k>"
    assert documented("reward/math/extra") is None
    assert documented("loss/polciy") is None
