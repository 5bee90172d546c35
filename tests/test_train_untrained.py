"""A step that trains on no token is named: `batch/trained_token_share` is 0, one warning line
says why (DAPO's overlong filter on responses all cut off, failed rewards) and the run's end
counts such steps; a step that trains says nothing."""

import json

from rlcli.train.loop import train
from rlcli.train.step import untrained_reason
from rlcli.validate import compose

# The tiny random model never ends a response within 8 tokens: every one is cut off.
DAPO = ["model=tiny", "algo=dapo", "reward=space_rate", "sampler=hf", "sampler.max_new_tokens=8",
        "trainer.prompts_per_step=2", "trainer.max_steps=2", "logger.progress=false"]  # fmt: skip


def rows_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dapo_on_responses_all_cut_off_warns_once_and_counts(tmp_path, capsys):
    train(compose(DAPO), tmp_path)
    out = capsys.readouterr().out
    rows = rows_of(tmp_path)
    assert [r["batch/trained_token_share"] for r in rows] == [0.0, 0.0]
    assert [r["batch/response_utilisation"] for r in rows] == [0.0, 0.0]  # was 1.0
    # Every warning: its advantages are 0 too, but that is the same cause, said once.
    warnings = [line for line in out.splitlines() if line.startswith("rlcli: warning:")]
    assert warnings == [
        "rlcli: warning: step 1 trained on no tokens (batch/trained_token_share=0, loss and "
        "gradient 0): every response was cut off at sampler.max_new_tokens=8 and "
        "algo.overlong_filter=true leaves cut-off responses out of the loss: raise "
        "sampler.max_new_tokens or set algo.overlong_filter=false.",
        "rlcli: warning: 2 of the 2 steps trained on no tokens (batch/trained_token_share=0); "
        "the warning at step 1 says why.",
    ]


def test_a_step_that_trains_says_nothing(tmp_path, capsys):
    train(compose([*DAPO, "algo.overlong_filter=false", "trainer.max_steps=1"]), tmp_path)
    assert [r["batch/trained_token_share"] for r in rows_of(tmp_path)] == [1.0]
    assert "trained on no tokens" not in capsys.readouterr().out


def test_the_reason_names_failed_rewards():
    cfg = compose(["model=tiny", "algo=grpo"])
    nothing = {"batch/trained_token_share": 0.0, "response/truncated_frac": 0.0}
    assert untrained_reason(cfg, {**nothing, "reward/errors": 16.0}) == (
        "16 response(s) had no reward; the reward's error lines say why"
    )
    assert untrained_reason(cfg, {**nothing, "batch/trained_token_share": 0.5}) is None
