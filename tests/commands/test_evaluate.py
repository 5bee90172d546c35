"""Held-out evaluation: the unbiased pass@k estimator, `rlcli eval` writing eval.json on a
tiny model's run directory (its newest checkpoint), and evaluation leaving the training samples
untouched."""

import contextlib
import json
import math
import signal

import pytest
import torch

from rlcli.data import load_splits
from rlcli.train.held_out import evaluate, pass_at_k, pass_at_ks
from rlcli.train.run import setup
from rlcli.validate import compose
from tests.train.test_train import rlcli


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_combinatorial_estimator(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected), (n, c, k)
    assert pass_at_k(2, 1, 1) == 0.5 and pass_at_k(2, 1, 2) == 1.0  # by hand


def test_pass_at_ks_averages_over_problems():
    correct = torch.tensor([[True, False, False, False], [False] * 4, [True] * 4])
    result = pass_at_ks(correct)
    assert list(result) == ["pass@1", "pass@2", "pass@4"]
    assert result["pass@1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert result["pass@2"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert result["pass@4"] == pytest.approx(2 / 3)


REWARD = """
def even_answers(prompts, responses, answers, **fields):
    return [1.0 if int(a) % 2 == 0 else 0.0 for a in answers]
"""


def test_rlcli_eval_of_a_run_directory_writes_accuracy_and_pass_at_k(tmp_path):
    from rlcli.train.loop import train

    # A finished run's directory, as `rlcli export` takes it: its newest checkpoint is evaluated.
    trained = tmp_path / "trained"
    tiny_run = ["model=tiny", "reward=space_rate", "sampler=hf", "sampler.max_new_tokens=8",
                "trainer.prompts_per_step=2", "trainer.save_every=1", "logger.progress=false",
                "trainer.max_steps=2"]  # fmt: skip
    train(compose(tiny_run), trained)
    (tmp_path / "reward.py").write_text(REWARD)
    data = ["data.num_train=8", "data.num_test=12"]
    out = rlcli(
        "eval", "model=tiny", f"model.path={trained}", *data, "reward=python",
        f"reward.function={tmp_path / 'reward.py'}:even_answers", "eval.k=4",
        "sampler.max_new_tokens=8", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["model"] == str(trained / "checkpoints" / "step_2")
    _, test = load_splits(compose(data).data)
    even = sum(int(p.answer) % 2 == 0 for p in test) / len(test)
    # The reward depends on the problem only: every sample of a problem is right or wrong.
    assert report["problems"] == 12 and report["accuracy"] == pytest.approx(even)
    assert report["pass@1"] == pytest.approx(even) and report["pass@4"] == pytest.approx(even)
    assert {"pass@2", "k", "temperature", "time_s"} <= set(report)
    # Exact fractions, not float32's 0.4166666567325592.
    assert report["accuracy"] == round(even, 6) and report["pass@1"] == round(even, 6)
    assert f"accuracy {even:.3f} (greedy)" in out.stdout
    # Each problem's replies, rewards and correctness, and the line saying where they are.
    samples = tmp_path / "run" / "eval_samples.jsonl"
    assert f"rlcli: each problem's replies, rewards and correctness in {samples}" in out.stdout
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    # The problem's id under samples.jsonl's name for it.
    assert [r["problem_id"] for r in records] == [p.id for p in test]
    assert all("id" not in r for r in records)
    for record, problem in zip(records, test, strict=True):
        right = int(problem.answer) % 2 == 0
        assert record["prompt"] == problem.question and record["answer"] == problem.answer
        assert len(record["samples"]) == 4 and record["correct_samples"] == 4 * right
        for reply in [record["greedy"], *record["samples"]]:
            assert reply["reward"] == float(right) and reply["correct"] is right
            assert list(reply["components"].values()) == [float(right)]  # its one component
            assert isinstance(reply["response"], str) and isinstance(reply["truncated"], bool)


def test_evaluation_is_greedy_and_leaves_the_training_samples_alone():
    overrides = ["model=tiny", "reward=space_rate", "sampler.max_new_tokens=12"]
    plain = setup(compose([*overrides, "trainer.prompts_per_step=2"]))
    collected = plain.collector.next_batch()
    expected = collected.rollout

    cfg = compose([*overrides, "trainer.prompts_per_step=2", "eval.k=2"])
    run = setup(cfg)
    _, test = load_splits(cfg.data)
    first = evaluate(run.sampler, run.scorer, run.render, test[:4], cfg.eval, seed=1)
    again = evaluate(run.sampler, run.scorer, run.render, test[:4], cfg.eval, seed=1)
    assert first == again  # the same seed: greedy and sampled replies repeat
    collected = run.collector.next_batch()
    batch = collected.rollout
    assert batch.texts == expected.texts  # evaluating did not move the training stream


def test_trainer_eval_every_logs_held_out_metrics(tmp_path):
    from rlcli.train.loop import train

    cfg = compose(
        [
            "model=tiny", "reward=space_rate", "sampler.max_new_tokens=8",
            "trainer.prompts_per_step=2", "trainer.max_steps=3", "trainer.eval_every=2",
            "eval.max_problems=4", "eval.k=2", "eval.correct_above=0.05", "logger.progress=false",
        ]
    )  # fmt: skip
    rows = [json.loads(line) for line in train(cfg, tmp_path).read_text().splitlines()]
    evaluated = [r["step"] for r in rows if "eval/accuracy" in r]
    assert evaluated == [2, 3]  # every 2 steps, and at the end
    for r in rows:
        if "eval/accuracy" in r:
            assert 0 <= r["eval/accuracy"] <= 1 and r["eval/pass@1"] <= r["eval/pass@2"]


def test_eval_top_p_shapes_the_pass_at_k_samples():
    from rlcli.commands.frozen_sampling import frozen_sampling
    from rlcli.rollout.vllm_shared import sampling_settings

    cfg = compose(["model=tiny", "sampler=hf", "reward=space_rate", "sampler.max_new_tokens=12"])
    problems = load_splits(cfg.data)[1][:2]
    _, _, _, sampler = frozen_sampling(cfg, problems)
    prompts = [p.question for p in problems]
    ids, answers = [p.id for p in problems], [p.answer for p in problems]
    greedy = sampler.sample(prompts, 1, ids, answers, temperature=0.0, seed=1).texts
    narrow = sampler.sample(prompts, 4, ids, answers, temperature=1.0, seed=1, top_p=1e-6).texts
    wide = sampler.sample(prompts, 4, ids, answers, temperature=1.0, seed=1).texts
    # A nucleus of one token is greedy decoding; the full distribution (top_p 1) is not.
    assert narrow == [greedy[0]] * 4 + [greedy[1]] * 4
    assert len(set(wide[:4])) > 1
    # vLLM gets the same override through its sampling parameters.
    assert sampling_settings(cfg.sampler, 4, {0}, 1.0, 0.7)["top_p"] == 0.7
    assert sampling_settings(cfg.sampler, 4, {0}, 1.0)["top_p"] == cfg.sampler.top_p


def test_val_before_train_logs_step_0_once_and_the_latest_replies(tmp_path, capsys):
    from rlcli.train.loop import train

    overrides = [
        "model=tiny", "reward=space_rate", "sampler=hf", "sampler.max_new_tokens=8",
        "trainer.prompts_per_step=2", "trainer.eval_every=2", "trainer.val_before_train=true",
        "eval.max_problems=3", "eval.k=2", "eval.correct_above=0.05", "logger.progress=false",
    ]  # fmt: skip
    train(compose([*overrides, "trainer.max_steps=2"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # Step 0 is a row of the held-out metrics alone, named as trainer.eval_every's.
    assert set(rows[0]) == {"step"} | {k for k in rows[2] if k.startswith("eval/")}
    shown = f"accuracy {rows[0]['eval/accuracy']:.3f}, pass@1 {rows[0]['eval/pass@1']:.3f}"
    assert f"rlcli: held-out before training (step 0): {shown}" in capsys.readouterr().out
    replies = [
        json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()
    ]
    assert len(replies) == 3 and {r["step"] for r in replies} == {2}  # the latest evaluation's

    # A resume does not evaluate the initial weights again.
    train(compose([*overrides, "trainer.max_steps=3"]), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "before training" not in capsys.readouterr().out


def test_val_before_train_without_a_held_out_split_says_so_and_trains(tmp_path, capsys):
    from rlcli.train.loop import train

    cfg = compose(
        ["model=tiny", "reward=space_rate", "sampler=hf", "sampler.max_new_tokens=4",
         "trainer.prompts_per_step=2", "trainer.max_steps=1", "trainer.val_before_train=true",
         "data.num_test=0", "logger.progress=false"]
    )  # fmt: skip
    train(cfg, tmp_path)
    out = capsys.readouterr().out
    assert (
        "rlcli: trainer.val_before_train: data=arith has no held-out split, so nothing is "
        "evaluated before step 1 (set data.num_test or data.test_path)." in out
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]


def test_a_run_directorys_damaged_newest_checkpoint_is_named_and_a_hub_id_left_alone(tmp_path):
    from rlcli.commands.evaluate import newest_checkpoint_of_a_run
    from rlcli.config import ConfigError

    newest = tmp_path / "run" / "checkpoints" / "step_3"
    newest.mkdir(parents=True)
    (newest / "trainer_state.json").write_text("{not json")  # cut short, no manifest
    cfg = compose(["model=tiny", f"model.path={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=f"newest checkpoint, {newest}, is damaged"):
        newest_checkpoint_of_a_run(cfg)
    cfg = compose(["model=tiny", "model.path=HuggingFaceTB/SmolLM2-135M-Instruct"])
    newest_checkpoint_of_a_run(cfg)
    assert cfg.model.path == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_ctrl_c_the_engine_start_swallowed_stops_eval_filter_and_pairs_before_sampling(
    monkeypatch,
):
    # In process, with a stand-in for the library: the sampler's start runs rlcli's Ctrl-C
    # handler and swallows the KeyboardInterrupt it raises, as compiled code in vLLM's engine
    # start did on CI. Training's case, with a real Ctrl-C: tests/cli/test_ctrl_c.py.
    from rlcli.commands import frozen_sampling as module
    from rlcli.lifecycle import guard

    monkeypatch.setattr(guard, "_ctrl_c_pressed", False)  # put back after the test
    real = module.make_sampler

    def swallowing(setup):
        made = real(setup)
        with contextlib.suppress(KeyboardInterrupt):
            guard._on_ctrl_c(signal.SIGINT, None)
        return made

    monkeypatch.setattr(module, "make_sampler", swallowing)
    cfg = compose(["model=tiny", "sampler=hf", "reward=space_rate", "sampler.max_new_tokens=12"])
    problems = load_splits(cfg.data)[1][:2]
    with pytest.raises(KeyboardInterrupt):
        module.frozen_sampling(cfg, problems)  # eval, filter and pairs all start here
