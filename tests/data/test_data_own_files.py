"""A user's own data file through `rlcli train`, as the first hour of a TRL or verl user goes:
records with their own field names, no held-out split (data=jsonl and data=parquet hold none
out by default), and the console kept to rlcli's own lines."""

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from rlcli.data import load_splits
from rlcli.data.problems import fit_prompts, prompt_renderer
from rlcli.runtime.models import load_tokenizer
from rlcli.validate import compose, section

# One step of the tiny model: a few seconds.
ONE_STEP = ["model=tiny", "sampler=hf", "trainer.max_steps=1", "trainer.prompts_per_step=2",
            "trainer.group_size=2", "sampler.max_new_tokens=8"]  # fmt: skip
RECORDS = [
    {"problem": f"What is {i} + {i}?", "solution": str(2 * i), "level": i % 3} for i in range(12)
]


def rlcli_train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rlcli", "train", *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.run(command, cwd=run_dir.parent, capture_output=True, text=True, timeout=600)


def test_an_empty_held_out_split_fits_as_it_is(tiny_model_dir):
    cfg = compose(["model=tiny", "sampler=hf"])
    render = prompt_renderer(cfg.data, cfg.env, load_tokenizer(tiny_model_dir))
    assert fit_prompts(cfg.sampler, cfg.data.name, render, [], "held-out") == []


def test_reading_a_file_draws_no_progress_bar(tmp_path, capfd):
    path = tmp_path / "fresh.jsonl"  # a file datasets has not cached: it prepares it anew
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    cfg = section("data", "jsonl", path=str(path), prompt_field="problem", answer_field="solution")
    train, test = load_splits(cfg)
    out, err = capfd.readouterr()
    assert len(train) == 12 and test == []
    assert "Generating" not in out + err and "examples/s" not in out + err
    assert datasets.is_progress_bar_enabled()  # as it was before the file was read


# A TRL user's reward functions (GRPOTrainer's reward_funcs): the record's columns in kwargs.
TRL_REWARDS = """
def accuracy(prompts, completions, solution, **kwargs):
    print(f"accuracy: {len(completions)} completions, level {kwargs['level'][0]}")
    return [1.0 if s in c else 0.0 for c, s in zip(completions, solution)]


def brevity(completions, completion_ids, **kwargs):
    return [-len(ids) / 8 for ids in completion_ids]
"""


def test_a_jsonl_file_with_trl_reward_functions_trains(tmp_path):
    (tmp_path / "my.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (tmp_path / "my_rewards.py").write_text(TRL_REWARDS)
    run_dir = tmp_path / "run"
    done = rlcli_train(
        run_dir, *ONE_STEP, "data=jsonl", "data.path=my.jsonl", "data.prompt_field=problem",
        "data.answer_field=solution", "trainer.eval_every=1", "reward=python",
        "reward.function=[my_rewards.py:accuracy,my_rewards.py:brevity]",
        "reward.weights=[1.0,0.5]",
    )  # fmt: skip
    console = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in console, console[-3000:]
    # No held-out split: evaluation is skipped, said once.
    assert console.count("has no held-out problems") == 1
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not any(key.startswith("eval/") for key in row)
    # Each function is a component of its own; the total weighs them.
    assert row["reward/brevity"] == -row["response/length_mean"] / 8  # from completion_ids
    total = row["reward/accuracy"] + 0.5 * row["reward/brevity"]
    assert row["reward/mean"] == pytest.approx(total)
    # What the function printed: on the console and in train.log, a line of its own.
    printed = "accuracy: 4 completions, level "
    assert printed in done.stderr
    assert any(
        line.startswith(printed) for line in (run_dir / "train.log").read_text().splitlines()
    )
    assert "Generating train split" not in console and "examples/s" not in console


def test_a_parquet_file_with_its_own_field_names_trains(tmp_path):
    datasets.Dataset.from_list(RECORDS).to_parquet(str(tmp_path / "my.parquet"))
    done = rlcli_train(
        tmp_path / "run", *ONE_STEP, "logger.progress=false", "data=parquet",
        "data.path=my.parquet", "data.prompt_field=problem", "data.answer_field=solution",
    )  # fmt: skip
    console = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in console, console[-3000:]
    assert "%|" not in console  # no library's progress bar (rlcli's own is off here)
    assert (tmp_path / "run" / "checkpoints" / "step_1").is_dir()
