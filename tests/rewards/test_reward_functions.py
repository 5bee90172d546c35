"""A user's own reward functions: rlcli's convention and TRL's, read from the signature before
any model loads; several functions weighted as TRL's reward_funcs and reward_weights, each its
own reward/<name>; what they print in train.log; and under DAPO's dynamic sampling, reward/mean
and the components over the same responses."""

import subprocess
import sys

import pytest
import torch

from rlcli.config import ConfigError
from rlcli.data.problems import Problem
from rlcli.rewards.conventions import BadSignature, call_keywords, call_plan
from rlcli.rewards.scorer import Sample, Scorer
from rlcli.tracking.console import job_log
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose

# --- conventions, from the signature alone ---------------------------------------------------


def trl(prompts, completions, **kwargs): ...
def rlcli_own(prompts, responses, answers, **fields): ...
def named_only(completions, solution, completion_ids): ...
def anything(**kwargs): ...
def neither(text, gold): ...
def by_position(completions, /, solution): ...


def keywords(fn, records):
    """fn's keywords for one response "r" to the prompt "p", answer "a", tokens [1, 2]."""
    return call_keywords(call_plan(fn, "f"), ["p"], ["r"], ["a"], records, lambda: [[1, 2]])


def test_each_convention_gets_its_own_keywords_and_the_records_fields():
    records = [{"solution": "4", "level": 1}]
    fields = {"solution": ["4"], "level": [1]}
    # TRL's **kwargs get completion_ids and trainer_state, as TRL passes them.
    trl_keywords = {"prompts": ["p"], "completions": ["r"], "completion_ids": [[1, 2]],
                    "trainer_state": {}, **fields}  # fmt: skip
    assert keywords(trl, records) == trl_keywords
    own = {"prompts": ["p"], "responses": ["r"], "answers": ["a"], **fields}
    assert keywords(rlcli_own, records) == own
    # Without **kwargs, only what it names: token ids too when it names completion_ids.
    named = {"completions": ["r"], "solution": ["4"], "completion_ids": [[1, 2]]}
    assert keywords(named_only, records) == named
    assert set(keywords(anything, records)) >= {"responses", "completions", "solution"}
    assert call_plan(named_only, "f").fields == ("solution",)  # to be found in the records


@pytest.mark.parametrize(("fn", "why"), [(neither, "names neither"), (by_position, "position")])
def test_a_signature_that_fits_neither_convention_is_named_with_both(fn, why):
    with pytest.raises(BadSignature) as err:
        call_plan(fn, "reward.function='r.py:f'")
    message = str(err.value)
    assert "reward.function='r.py:f'" in message and why in message
    assert f"{fn.__name__}(" in message  # the function and its parameters
    assert "fn(prompts, responses, answers, **fields)" in message
    assert "fn(prompts, completions, **kwargs)" in message


# --- the scorer, with functions in a file of the user's ----------------------------------------

USER_REWARDS = """
def accuracy(prompts, completions, solution, **kwargs):
    print(f"accuracy saw {len(completions)} completions")
    return [1.0 if c == s else 0.0 for c, s in zip(completions, solution)]


def length(completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def old_style(prompts, responses, answers, **fields):
    return [None if r == "skip" else 2.0 for r in responses]


def takes_text(text, gold):
    return [0.0]


def needs_reference(completions, reference, **kwargs):
    return [0.0] * len(completions)
"""


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def scorer(*overrides):
    cfg = compose(["sampler=hf", "reward=python", *overrides])
    return Scorer(cfg.reward, cfg.sampler.max_new_tokens, torch.device("cpu"), "float32")


def samples(*responses):
    ids = torch.arange(10)
    return [Sample("q", r, "4", {"solution": "4"}, 3, "p0", ids[: len(r)]) for r in responses]


def test_several_functions_are_weighted_components_each_logged(rewards_file):
    functions = ",".join(f"{rewards_file}:{name}" for name in ("accuracy", "length", "old_style"))
    s = scorer(f"reward.function=[{functions}]", "reward.weights=[1.0,0.5,0.25]")
    scores = s(samples("4", "12", "skip"))
    assert scores.components["accuracy"].tolist() == [1.0, 0.0, 0.0]
    assert scores.components["length"].tolist() == [1.0, 2.0, 4.0]  # len(completion_ids)
    assert scores.total[:2].tolist() == [1.0 + 0.5 + 0.5, 0.0 + 1.0 + 0.5]
    assert scores.missing.tolist() == [False, False, True]  # None: no reward for that one
    metrics = scores.metrics()
    assert {"reward/accuracy", "reward/length", "reward/old_style"} <= set(metrics)


def test_a_bad_signature_is_a_config_error_when_the_scorer_is_built(rewards_file):
    with pytest.raises(ConfigError, match=r"takes_text\(text, gold\) cannot be called"):
        scorer(f"reward.function={rewards_file}:takes_text")


def test_a_parameter_no_record_fills_is_named_before_training(rewards_file):
    s = scorer(f"reward.function={rewards_file}:needs_reference")
    problems = [Problem("p0", "q", "4", {"problem": "q", "solution": "4"})]
    with pytest.raises(ConfigError, match="'reference'.*fields: problem, solution"):
        s.check_records(problems, "jsonl")


def test_the_countdown_rule_names_the_record_fields_it_lacks():
    cfg = compose(["sampler=hf", "reward=countdown"])
    s = Scorer(cfg.reward, cfg.sampler.max_new_tokens, torch.device("cpu"), "float32")
    problems = [Problem("p0", "q", "4", {"problem": "q", "solution": "4"})]
    with pytest.raises(ConfigError, match="'countdown' needs records.*data=jsonl has no 'numbers'"):
        s.check_records(problems, "jsonl")
    s.check_records([Problem("p0", "q", "4", {"numbers": [1, 3], "target": 4})], "countdown")


def test_the_bad_signature_stops_the_run_before_the_model_loads(rewards_file, tmp_path):
    # The model path does not exist: loading it would be the error, were the reward not first.
    reward = ["reward=python", f"reward.function={rewards_file}:takes_text"]
    command = [sys.executable, "-m", "rlcli", "train", "model.source=hub",
               f"model.path={tmp_path / 'no_model'}", "sampler=hf", *reward,
               f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "takes_text(text, gold) cannot be called" in done.stderr
    assert "TRL's fn(prompts, completions, **kwargs)" in done.stderr


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["reward.function=[{f}:accuracy,{f}:length]", "reward.weights=[1.0]"],
         r"one finite number per component of \['accuracy', 'length'\]"),
        (["reward.function=[{f}:accuracy,other.py:accuracy]"], "another component .* 'accuracy'"),
        (["reward.function={f}:mean"], "'mean' is a name rlcli's own metrics use"),
        (["reward=math", "reward.function={f}:accuracy"], "would never be called"),
        (["reward.function=[]"], "needs reward.function"),
        (["reward.function={f}:accuracy", "algo.filter_metric=python"], "accuracy"),
    ],
)  # fmt: skip
def test_bad_function_configs_are_named(overrides, named, rewards_file):
    with pytest.raises(ConfigError, match=named):
        compose(["reward=python", *[o.format(f=rewards_file) for o in overrides]])


def test_what_a_function_prints_reaches_the_job_log_and_the_console(rewards_file, tmp_path, capsys):
    s = scorer(f"reward.function={rewards_file}:accuracy")
    with job_log(tmp_path / "train.log"):
        s(samples("4", "5"))
    assert "accuracy saw 2 completions\n" in capsys.readouterr().err
    assert "accuracy saw 2 completions\n" in (tmp_path / "train.log").read_text()


# --- DAPO: reward/mean and the components over the same responses ------------------------------

HALF_CONSTANT = '''
def half_constant(completions, answer, **kwargs):
    """1 for an even answer (its group all equal: dropped by dynamic sampling), else a share."""
    return [1.0 if int(a) % 2 == 0 else c.count(" ") / max(len(c), 1)
            for c, a in zip(completions, answer)]
'''


def test_dynamic_sampling_reports_mean_and_components_over_the_same_responses(tmp_path):
    (tmp_path / "half.py").write_text(HALF_CONSTANT)
    run = setup(compose(["model=tiny", "sampler=hf", "algo=dapo", "algo.overlong_filter=false",
                         "reward=python", f"reward.function={tmp_path / 'half.py'}:half_constant",
                         "sampler.max_new_tokens=8", "trainer.group_size=2",
                         "algo.max_gen_batches=2"]))  # fmt: skip
    metrics = train_step(run)
    run.scorer.close()
    assert metrics["batch/gen_batches"] > 1  # groups were dropped and more sampled
    assert metrics["reward/mean"] == pytest.approx(metrics["reward/half_constant"], abs=1e-6)


def test_reward_metrics_of_rounds_share_their_responses():
    from rlcli.collect.collector import reward_metrics
    from rlcli.rewards.scorer import Scores

    kept = Scores(torch.tensor([0.0, 1.0]), {"c": torch.tensor([0.0, 1.0])}, [])
    dropped = Scores(torch.tensor([1.0, 1.0]), {"c": torch.tensor([1.0, 1.0])}, [])
    metrics = reward_metrics([dropped, kept])
    assert metrics["reward/mean"] == metrics["reward/c"] == 0.75
    assert metrics["reward/std"] == pytest.approx(torch.tensor([1.0, 1, 0, 1]).std().item())
