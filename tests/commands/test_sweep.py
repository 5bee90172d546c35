"""A sweep's job directories and chart title (rlcli/commands/sweep.py), on hand-made overrides;
the real two-job sweep through the CLI is tests/cli/test_cli.py's test_a_sweep_with_m_at_the_end."""

from rlcli.commands.sweep import JobSummary, chart_title, fixed_keys_override, job_dirname


def test_the_keys_given_one_value_are_left_out_of_job_directories():
    overrides = ["model=tiny", "algo=grpo,dapo", "+x.y=1", "trainer.lr=range(1,3)",
                 "hydra.sweep.dir=out"]  # fmt: skip
    key = "hydra.job.config.override_dirname.exclude_keys"
    assert fixed_keys_override(overrides) == [f"{key}=['model','x.y']"]
    assert fixed_keys_override([*overrides, f"{key}=[]"]) == []  # the user's own stands


def test_a_job_directory_is_its_number_and_what_varies_shortened():
    task = ["model=tiny", "algo=dapo", "trainer.lr=0.01"]
    assert job_dirname(3, task, ["model"]) == "3_algo=dapo,lr=0.01"
    assert job_dirname(0, ["model=tiny"], ["model"]) == "0"  # nothing varies
    # Keys ending alike keep their sections; a path keeps its last two parts, no '/'.
    task = ["trainer.seed=1", "data.seed=2", "recipe=cpu/dapo_qwen32b", "data.path=/d/e/f.jsonl"]
    assert job_dirname(1, task, []) == (
        "1_trainer.seed=1,data.seed=2,recipe=cpu-dapo_qwen32b,path=e-f.jsonl"
    )
    long = job_dirname(2, ["data.path=/data/" + "x" * 60 + ".jsonl"], [])
    assert long.startswith("2_path=~") and long.endswith("x.jsonl") and len(long) < 45


def test_the_chart_title_names_the_metrics_and_what_varied():
    jobs = [
        JobSummary("0", ["model=tiny", "algo=grpo", "trainer.lr=0.1"]),
        JobSummary("1", ["model=tiny", "algo=dapo", "trainer.lr=0.1"]),
        JobSummary("2", ["model=tiny", "algo=dapo", "trainer.lr=0.2"]),
    ]
    rows = [{"step": 1, "reward/mean": 0.5, "eval/accuracy": 0.1}]
    runs = {"a": rows, "b": [{"step": 1, "reward/mean": 0.4}]}
    assert chart_title(jobs, runs) == (
        "reward/mean and eval/accuracy for each algo × trainer.lr (3 jobs)"
    )
    assert chart_title(jobs[:1], {"a": rows[:0]}) == "no metrics (1 job)"
