"""Rewards that cannot score, and what they may cost: a batch with no score stops the run after
saving the steps before it; a held-out evaluation with no score is a warning and training goes
on; a log-only component (weight 0) that fails never touches training; reward.timeout_s=0 is
no limit; a reward beyond float32's range, or a set of scores, is a failed score."""

import contextlib
import io
import json

import pytest
import torch

from rlcli.cli import main
from rlcli.rewards.scorer import Sample, Scorer, Unscorable
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose
from tests.conftest import tiny

TINY = tiny(reward=None)

# Loaded by the reward worker from a file (standard library only, so it starts in ms).
REWARDS = '''
import math, os, time


def spaces(responses):
    return [r.count(" ") / max(len(r), 1) for r in responses]


def none_after_step_1(prompts, responses, answers, **fields):
    """Step 1's batch is scored; every later reply is unparseable (None)."""
    calls = os.path.join(os.path.dirname(__file__), "calls")
    done = int(open(calls).read()) if os.path.exists(calls) else 0
    open(calls, "w").write(str(done + 1))
    return [None] * len(responses) if done else spaces(responses)


def fixed(prompts, responses, answers, **fields):
    return spaces(responses)


def none_for_greedy_replies(prompts, responses, answers, **fields):
    """The evaluation's greedy call has eval.max_problems=3 replies; training batches 16."""
    return [None] * 3 if len(responses) == 3 else spaces(responses)


def raises(prompts, responses, answers, **fields):
    raise RuntimeError("the log-only judge is down")


def nan_on_even(prompts, responses, answers, **fields):
    return [math.nan if i % 2 == 0 else 1.0 for i in range(len(responses))]


def slow(prompts, responses, answers, **fields):
    time.sleep(0.3)
    return [1.0] * len(responses)


def too_large(prompts, responses, answers, **fields):
    return [1e39] + [0.5] * (len(responses) - 1)


def near_float32_max(prompts, responses, answers, **fields):
    return [3e38] + [0.5] * (len(responses) - 1)


def one_per_prompt(prompts, responses, answers, **fields):
    """A batch-wise reward that scores each unique prompt once: one score per response alone."""
    return [1.0] * len(dict.fromkeys(prompts))


def a_set(prompts, responses, answers, **fields):
    return set(range(len(responses)))


def a_frozenset(prompts, responses, answers, **fields):
    return frozenset(range(len(responses)))
'''


@pytest.fixture
def rewards(tmp_path):
    """name -> reward.function=<file>:name, the file holding REWARDS."""
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return lambda name: f"{path}:{name}"


def scorer(*overrides) -> Scorer:
    cfg = compose(["sampler=hf", *overrides])
    return Scorer(cfg.reward, cfg.sampler.max_new_tokens, torch.device("cpu"), "float32")


def samples(*responses) -> list[Sample]:
    return [Sample("What is 12 + 35?", r, "47", {}, 5) for r in responses]


def train(run_dir, *overrides) -> tuple[int, str]:
    """`rlcli train` in this process: (exit code, stdout and stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(["train", *TINY, *overrides, f"hydra.run.dir={run_dir}"])
            code = 0
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue()


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- a batch, or an evaluation, with no score ---


def test_a_batch_with_no_score_saves_the_steps_before_it_then_resumes(rewards, tmp_path):
    run = tmp_path / "run"
    function = f"reward.function={rewards('none_after_step_1')}"
    code, text = train(run, "reward=python", function, "trainer.max_steps=3")
    assert code == 2 and "Traceback" not in text
    # save_every is 50: without the save on stopping, step 1 would be lost.
    assert (run / "checkpoints" / "step_1").is_dir()
    assert (
        "No response of step 2's batch could be scored (16 responses; the reward returned None "
        "for all), so the run stopped before that step; step 1 is saved in " in text
    )
    assert "trainer.resume=auto" in text.splitlines()[-1]  # the command that resumes it
    # The function's code fixed under the same name: the run resumes from step 1 and finishes.
    (tmp_path / "rewards.py").write_text(REWARDS.replace("if done else", "if False else"))
    code, text = train(run, "reward=python", function, "trainer.max_steps=3")
    assert code == 0, text
    assert "resuming from" in text and [r["step"] for r in rows(run)] == [1, 2, 3]


def test_a_held_out_evaluation_with_no_score_is_a_warning_and_training_goes_on(rewards, tmp_path):
    run = tmp_path / "run"
    evaluation = ["trainer.eval_every=1", "eval.max_problems=3", "eval.k=2"]
    function = f"reward.function={rewards('none_for_greedy_replies')}"
    code, text = train(run, "reward=python", function, "trainer.max_steps=2", *evaluation)
    assert code == 0, text
    for step in (1, 2):
        assert f"the held-out evaluation at step {step} measured nothing: none of its 3 " in text
    assert [r["step"] for r in rows(run)] == [1, 2]
    assert not any(key.startswith("eval/") for r in rows(run) for key in r)  # no false 0
    # The replies are kept: they show why none was scored.
    replies = [json.loads(line) for line in (run / "eval_samples.jsonl").open()]
    assert len(replies) == 3 and all(r["greedy"]["reward"] is None for r in replies)


# --- a log-only component (weight 0) ---


@pytest.mark.parametrize("name", ["raises", "nan_on_even"])
def test_a_log_only_component_that_fails_does_not_touch_the_total(rewards, name):
    s = scorer("reward=python", "reward.components=[space_rate,python]",
               f"reward.function={rewards(name)}", "reward.weights=[1,0]")  # fmt: skip
    scores = s(samples("a b", "ab", "a b c", "abc"))  # raised Unscorable for "raises"
    assert not scores.missing.any()  # 0 x NaN used to drop the response
    assert scores.total.tolist() == scores.components["space_rate"].tolist()
    metrics = scores.metrics()
    assert metrics["reward/errors"] == 0
    assert metrics["reward/log_only_errors"] == (4 if name == "raises" else 2)
    assert scores.errors == []


def test_a_step_with_a_failing_log_only_component_trains_on_every_response(rewards):
    log_only = ["reward.components=[space_rate,python]", "reward.weights=[1,0]"]
    run = setup(
        compose([*TINY, "reward=python", f"reward.function={rewards('raises')}", *log_only])
    )
    metrics = train_step(run)
    assert metrics["reward/errors"] == 0 and metrics["reward/log_only_errors"] == 16
    assert metrics["batch/trained_token_share"] == 1.0
    run.scorer.close()


# --- reward.timeout_s=0 ---


def test_reward_timeout_s_0_is_no_limit(rewards):
    s = scorer("reward=python", f"reward.function={rewards('slow')}", "reward.timeout_s=0")
    scores = s(samples("1", "2"))  # the batch and each sample used to get 0 s
    assert scores.total.tolist() == [1.0, 1.0] and scores.errors == []


# --- rewards beyond float32's range ---


def test_a_reward_beyond_float32_is_a_failed_score_named_in_the_log(rewards, caplog):
    s = scorer("reward=python", f"reward.function={rewards('too_large')}")
    scores = s(samples("1", "2", "3"))
    assert scores.missing.tolist() == [True, False, False]
    assert scores.total[1:].tolist() == [0.5, 0.5] and scores.metrics()["reward/errors"] == 1
    assert "returned 1e+39, beyond the range of float32" in scores.errors[0]
    assert "returned 1e+39, beyond the range of float32" in caplog.text


def test_a_weighted_total_beyond_float32_is_a_failed_score(rewards):
    s = scorer("reward=python", f"reward.function={rewards('near_float32_max')}",
               "reward.weights=[2]")  # fmt: skip
    scores = s(samples("1", "2"))
    assert scores.missing.tolist() == [True, False] and scores.total[1].item() == 1.0
    assert "the weighted sum of the components is inf in float32" in scores.errors[0]


def test_a_step_with_a_reward_beyond_float32_counts_it_and_trains(rewards):
    run = setup(compose([*TINY, "reward=python", f"reward.function={rewards('too_large')}"]))
    metrics = train_step(run)
    # It used to become inf: a NaN loss, the update skipped, and reward/errors 0.
    assert metrics["reward/errors"] == 1 and metrics["nonfinite/skipped_updates"] == 0
    run.scorer.close()


# --- what a function returns ---


@pytest.mark.parametrize("name", ["a_set", "a_frozenset"])
def test_a_set_of_scores_is_refused_as_other_wrong_types_are(rewards, name):
    s = scorer("reward=python", f"reward.function={rewards(name)}")
    kind = name.removeprefix("a_")
    with pytest.raises(Unscorable, match=f"returned a {kind}, not a list of scores"):
        s(samples("1", "2"))


def test_a_batch_call_with_the_wrong_count_is_not_retried_one_response_at_a_time(rewards):
    # Response by response, one score per prompt is one score per response: the fallback
    # would "work" with no error. The whole batch is unscored instead, saying why.
    s = scorer("reward=python", f"reward.function={rewards('one_per_prompt')}")
    batch = [Sample(p, "x", "47", {}, 5) for p in ["What is 1+1?"] * 2 + ["What is 2+2?"] * 2]
    with pytest.raises(Unscorable, match="returned 2 scores for 4 responses"):
        s(batch)
    scores = s.score(batch)
    assert torch.isnan(scores.total).all() and scores.metrics()["reward/errors"] == 4
