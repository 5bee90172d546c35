"""Steps that learn nothing are named, and a step that learns says nothing.

- A step that trains on no token: `batch/trained_token_share` is 0, one warning line says why
  (DAPO's overlong filter on responses all cut off, failed rewards) and the run's end counts
  such steps.
- A step whose every trained response has advantage 0 learns nothing from the policy loss,
  whatever the algorithm: one warning line names the cause, the gradient left and the settings
  to change, and the run's end counts such steps (as for a step with no token in the loss).
"""

import json

from rlcli.train.loop import train
from rlcli.train.step import no_signal, untrained_reason
from rlcli.validate import compose
from tests.conftest import tiny

# The tiny random model never ends a response within 8 tokens: every one is cut off.
DAPO = tiny("algo=dapo", "trainer.prompts_per_step=2", "trainer.max_steps=2")

REWARDS = """
def constant(prompts, responses, answers, **fields):
    return [1.0 for _ in responses]
"""


def rows_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def warnings_in(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("rlcli: warning:")]


def test_grpo_on_a_constant_reward_warns_once_and_counts(tmp_path, capsys):
    (tmp_path / "rewards.py").write_text(REWARDS)
    constant = f"reward.function={tmp_path / 'rewards.py'}:constant"
    overrides = tiny("algo=grpo", constant, "trainer.prompts_per_step=2", "trainer.max_steps=2",
                     reward="python")  # fmt: skip
    train(compose(overrides), tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    assert [r["batch/response_utilisation"] for r in rows] == [0.0, 0.0]
    assert [r["batch/trained_token_share"] for r in rows] == [1.0, 1.0]
    assert warnings_in(capsys.readouterr().out) == [
        "rlcli: warning: step 1 had no learning signal (batch/response_utilisation=0, every "
        "trained response's advantage 0): every response got the same reward (1, "
        "reward/std=0), so the group-relative advantages of algo.advantage=grpo are all 0 and "
        "the policy loss has no gradient but the KL penalty's (algo.beta=0.04), which only "
        "pulls to the reference: make the reward tell responses apart (partial credit, another "
        "component), use prompts the model solves some of the time, raise "
        "trainer.group_size=4 or sampler.temperature=1.0, or turn on dynamic sampling "
        "(algo.dynamic_sampling=true, as algo=dapo does), which trains only on groups whose "
        "responses differ.",
        "rlcli: warning: 2 of the 2 steps had no learning signal "
        "(batch/response_utilisation=0); the warning at step 1 says why.",
    ]


def test_a_reward_that_varies_within_groups_says_nothing(tmp_path, capsys):
    train(compose(tiny("algo=grpo", "trainer.prompts_per_step=2", "trainer.max_steps=1")), tmp_path)
    assert rows_of(tmp_path)[0]["batch/response_utilisation"] > 0
    assert warnings_in(capsys.readouterr().out) == []


# What a step of equal rewards in every group logs (reward/std > 0: the groups differ).
EQUAL_GROUPS = {"batch/trained_token_share": 1.0, "batch/response_utilisation": 0.0,
                "reward/mean": 0.5, "reward/std": 0.5}  # fmt: skip


def test_the_cause_follows_the_estimator_and_the_objective():
    grpo = compose(["model=tiny", "algo=grpo", "algo.beta=0", "sampler.temperature=0.7"])
    said = no_signal(grpo, EQUAL_GROUPS, group_relative=True)
    assert (said.what, said.metric) == ("had no learning signal", "batch/response_utilisation=0")
    assert said.why.startswith(
        "the responses of each group got the same reward, so the group-relative advantages of "
        "algo.advantage=grpo are all 0 and the policy loss has no gradient: make the reward"
    )
    assert "raise trainer.group_size=4 or sampler.temperature=0.7" in said.why
    # No groups to enlarge; the entropy bonus is the gradient left.
    batch = compose(["model=tiny", "algo.advantage=reinforce_pp", "algo.beta=0",
                     "algo.entropy_coef=0.01"])  # fmt: skip
    why = no_signal(batch, EQUAL_GROUPS, group_relative=False).why
    assert why.startswith(
        "algo.advantage=reinforce_pp gave every trained response an advantage of 0 and the "
        "policy loss has no gradient but the entropy bonus's (algo.entropy_coef=0.01):"
    )
    assert "group_size" not in why
    # Dynamic sampling is on already: its filter is what to change.
    dapo = compose(["model=tiny", "algo=dapo"])
    why = no_signal(dapo, EQUAL_GROUPS, group_relative=True).why
    assert "algo.dynamic_sampling=true" not in why
    assert why.endswith(
        "or set algo.filter_metric=total (now correctness), so that dynamic sampling keeps the "
        "groups whose rewards differ"
    )


def test_no_token_in_the_loss_is_the_one_cause_named():
    cfg = compose(["model=tiny", "algo=grpo"])
    nothing = {**EQUAL_GROUPS, "batch/trained_token_share": 0.0, "reward/errors": 16.0}
    said = no_signal(cfg, nothing, group_relative=True)
    assert (said.what, said.metric) == ("trained on no tokens", "batch/trained_token_share=0")
    assert no_signal(cfg, {**EQUAL_GROUPS, "batch/response_utilisation": 0.25}, True) is None


# ---- a step that trains on no token ----


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
