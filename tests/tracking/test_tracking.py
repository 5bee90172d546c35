"""Tracking and what is drawn from it: curves.png of every run, W&B (offline), `rlcli plot`,
and the summary Hydra writes into a sweep's directory. Runs use the tiny model through the
real CLI; the curve and summary functions are also checked on hand-written metrics files."""

import csv
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.commands.sweep import write_summary
from rlcli.config import ConfigError
from rlcli.tracking.curves import PANELS, draw_curves, panel_lines, series
from rlcli.tracking.metrics import read_metrics
from rlcli.train.loop import train
from rlcli.validate import compose
from tests.conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rlcli(*args, cwd=None, env=None):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlcli", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def metrics_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


# ---- (a) a two-job sweep through the real CLI ----


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("sweep")
    out = rlcli(
        "train", "-m", "model=tiny", "reward=space_rate", "trainer.max_steps=2",
        "trainer.lr=1e-3,1e-2", "logger.progress=false", "sampler.max_new_tokens=8",
        f"hydra.sweep.dir={sweep_dir}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"sweep summary in {sweep_dir / 'summary.md'}" in out.stdout
    return sweep_dir


def test_sweep_summary_has_a_row_per_job_matching_its_metrics(sweep):
    with (sweep / "summary.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 2
    lrs = []
    for row in rows:
        job_dir = sweep / row["job"]
        metrics = metrics_rows(job_dir)
        rewards = [m["reward/mean"] for m in metrics]
        assert int(row["steps"]) == 2
        assert float(row["final_reward"]) == pytest.approx(rewards[-1], rel=1e-12)
        assert float(row["best_reward"]) == pytest.approx(max(rewards), rel=1e-12)
        step_time = sum(m["time/step"] for m in metrics)
        assert float(row["train_time_s"]) == pytest.approx(step_time, rel=1e-12)
        throughput = [m["throughput/tokens_per_s"] for m in metrics]
        assert float(row["tokens_per_s"]) == pytest.approx(sum(throughput) / 2, rel=1e-12)
        assert row["eval_accuracy"] == ""  # trainer.eval_every=0: never evaluated
        assert "model=tiny" in row["overrides"].split()
        lrs += [o for o in row["overrides"].split() if o.startswith("trainer.lr=")]
    assert lrs == ["trainer.lr=0.001", "trainer.lr=0.01"]  # in job order

    markdown = (sweep / "summary.md").read_text()
    assert "2 jobs, all with `" in markdown  # the overrides the jobs share, once
    for row, lr in zip(rows, lrs, strict=True):
        line = next(x for x in markdown.splitlines() if f"| {lr} |" in x)
        assert f"(<{row['job']}>)" in line  # links the job's directory
        assert f"| {float(row['final_reward']):.3f} |" in line
        assert f"| {float(row['train_time_s']):.1f} |" in line


def test_sweep_writes_a_reward_chart_and_each_job_its_curves(sweep):
    assert is_png(sweep / "summary.png")
    jobs = [d for d in sweep.iterdir() if (d / "metrics.jsonl").exists()]
    assert len(jobs) == 2
    assert all(is_png(d / "curves.png") for d in jobs)


# ---- (b) logger=wandb, offline ----


def wandb_records(path: Path):
    """The protobuf records of a `.wandb` file (wandb 0.31 ships no Python reader for them).

    The file is a 7-byte header (`:W&B`, magic, version), then LevelDB-log chunks in 32 KiB
    blocks: each chunk is crc32c (4 bytes), length (2, little endian) and type (1: full,
    2: first, 3: middle, 4: last) before its data; a block's last < 7 bytes are padding.
    """
    from wandb.proto import wandb_internal_pb2

    data, block, head = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    pos, record = head, b""
    while pos + head <= len(data):
        if block - pos % block < head:
            pos += block - pos % block  # padding at the end of a block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + head])
        chunk, pos = data[pos + head : pos + head + length], pos + head + length
        if kind == 0:  # zero-filled pre-allocated space
            continue
        record = chunk if kind in (1, 2) else record + chunk
        if kind in (1, 4):
            message = wandb_internal_pb2.Record()
            message.ParseFromString(record)
            yield message


def wandb_history(run_dir: Path) -> tuple[object, list[dict]]:
    """The offline run's `run` record and its history rows, as {key: value}."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run, history = None, []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return run, history


# Where wandb keeps its settings, caches and staged files: the test's own directory.
WANDB_HOME_VARS = ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")


def test_wandb_offline_gets_config_every_step_and_a_samples_table(tmp_path):
    run_dir = tmp_path / "run"
    wandb_home = {k: str(tmp_path / "wandb_home") for k in WANDB_HOME_VARS}
    out = rlcli(
        "train", "model=tiny", "reward=space_rate", "sampler=hf", "trainer.max_steps=3",
        "sampler.max_new_tokens=8", "logger=wandb", "logger.table_every=2",
        "logger.progress=false", f"hydra.run.dir={run_dir}",
        env={"WANDB_MODE": "offline", **wandb_home},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = metrics_rows(run_dir)  # metrics.jsonl is written as with every logger
    run, history = wandb_history(run_dir)
    assert run.display_name == "run"  # the run directory's name
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"]["max_steps"] == 3 and config["logger"]["name"] == "wandb"

    assert [h["_step"] for h in history] == [1, 2, 3]  # metrics.jsonl's step is W&B's step
    for row, logged in zip(rows, history, strict=True):
        assert logged["reward/mean"] == row["reward/mean"]
        assert logged["actor/entropy"] == row["actor/entropy"]
        assert set(row) - {"step"} <= set(logged)

    assert [any(k.startswith("samples/") for k in h) for h in history] == [False, True, False]
    table_file = next(run_dir.glob("wandb/offline-run-*/files")) / history[1]["samples/path"]
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "prompt", "response", "answer", "reward"]
    assert len(table["data"]) == 16  # the step's 4 prompts x 4 responses
    assert all(r[0] == 2 and r[1].startswith("What is") for r in table["data"])
    rewards = [r[4] for r in table["data"]]
    assert sum(rewards) / len(rewards) == pytest.approx(rows[1]["reward/mean"], rel=1e-5)
    assert is_png(run_dir / "curves.png")


def test_wandb_without_an_api_key_is_a_config_error_naming_offline(tmp_path, monkeypatch):
    from rlcli.tracking.trackers import WandbRun

    for name in (*WANDB_HOME_VARS, "HOME"):
        monkeypatch.setenv(name, str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no stored key either
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    logger = compose(["model=tiny", "sampler=hf", "logger=wandb"]).logger
    with pytest.raises(ConfigError, match=r"No API key configured.*WANDB_MODE=offline"):
        WandbRun(logger, {}, tmp_path)


# ---- (c) rlcli plot ----


def test_rlcli_plot_draws_runs_side_by_side(sweep, tmp_path):
    jobs = sorted(str(d) for d in sweep.iterdir() if d.is_dir())
    out = rlcli("plot", *jobs, cwd=tmp_path)  # default output: curves.png here
    assert out.returncode == 0, out.stderr
    assert is_png(tmp_path / "curves.png")


def test_rlcli_plot_on_a_dir_without_metrics_exits_2_with_one_line(sweep, tmp_path):
    job = next(str(d) for d in sweep.iterdir() if d.is_dir())
    out = rlcli("plot", job, str(tmp_path), "--out", str(tmp_path / "x.png"))
    assert out.returncode == 2
    assert out.stderr.startswith(f"rlcli: error: {tmp_path} holds no metrics.jsonl")
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr + out.stdout
    assert not (tmp_path / "x.png").exists()


# ---- (d) curves and summaries of hand-written metrics ----


def write_metrics(run_dir: Path, rows: list[dict], tail: str = "") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows) + tail
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


# An RL run: entropy is null at step 2 (non-finite), KL to a reference is logged.
RL_ROWS = [
    {"step": 1, "reward/mean": 0.1, "actor/entropy": 2.0, "loss/kl": 0.0, "time/step": 1.0,
     "throughput/tokens_per_s": 10.0},
    {"step": 2, "reward/mean": None, "actor/entropy": None, "loss/kl": 0.01, "time/step": 2.0,
     "throughput/tokens_per_s": 20.0},
    {"step": 3, "reward/mean": 0.5, "actor/entropy": 1.5, "loss/kl": 0.02, "time/step": 0.5,
     "throughput/tokens_per_s": None, "eval/accuracy": 0.25},
    {"step": 4, "reward/mean": 0.3, "actor/entropy": 1.0, "loss/kl": 0.03, "time/step": 1.5,
     "throughput/tokens_per_s": 30.0},
]  # fmt: skip
# An RL run with beta = 0: no kl, no entropy, only the policy's approx_kl.
NO_KL_ROWS = [{"step": s, "reward/mean": 0.2 * s, "policy/approx_kl": 0.001} for s in (1, 2)]
DPO_ROWS = [{"step": s, "reward/accuracy": 0.5 + 0.25 * s, "loss/policy": 0.7 / s} for s in (1, 2)]


def test_series_turns_null_and_absent_values_into_gaps():
    steps, values = series(RL_ROWS[:2], "actor/entropy")
    assert steps == [1, 2] and values[0] == 2.0 and math.isnan(values[1])  # null
    assert all(math.isnan(v) for v in series(NO_KL_ROWS, "actor/entropy")[1])  # never logged


def test_panels_only_for_metrics_a_run_has(tmp_path):
    from rlcli.tracking.metrics import read_metrics

    # A partial last line (a job killed mid-write) is skipped, not an error.
    rl = read_metrics(write_metrics(tmp_path / "rl", RL_ROWS, tail='{"step": 5, "rew'))
    assert [r["step"] for r in rl] == [1, 2, 3, 4] and math.isnan(rl[1]["actor/entropy"])
    runs = {"rl": rl, "no_kl": NO_KL_ROWS, "dpo": DPO_ROWS}
    lines = panel_lines(runs)
    assert lines == [
        {"rl": "reward/mean", "no_kl": "reward/mean", "dpo": "reward/accuracy"},
        {"rl": "eval/accuracy"},  # logged at some steps only: drawn as joined points
        {"dpo": "loss/policy"},  # the only run here that logs a loss
        {"rl": "actor/entropy"},  # absent from the other runs: one line
        {"rl": "loss/kl", "no_kl": "policy/approx_kl"},
    ]  # no response length or clip fraction: no run logged them
    assert panel_lines({"dpo": DPO_ROWS}, PANELS[3:]) == []
    out = draw_curves(runs, tmp_path / "plots" / "curves.png", "hand-written")
    assert is_png(out)


def make_job(sweep_dir: Path, name: str, overrides: list[str], rows=None, eval_json=None):
    job = sweep_dir / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if rows is not None:
        write_metrics(job, rows)
    if eval_json is not None:
        (job / "eval.json").write_text(json.dumps(eval_json))
    return job


def test_write_summary_on_hand_written_jobs(tmp_path):
    make_job(tmp_path, "10_dpo", ["model=tiny", "algo=dpo"], DPO_ROWS, {"accuracy": 0.75})
    make_job(tmp_path, "2_failed", ["model=tiny", "algo=dapo"])  # no metrics.jsonl
    make_job(tmp_path, "1_grpo", ["model=tiny", "algo=grpo"], RL_ROWS)
    jobs = write_summary(tmp_path)
    assert [j.job for j in jobs] == ["1_grpo", "2_failed", "10_dpo"]  # job order, not text

    with (tmp_path / "summary.csv").open() as file:
        grpo, failed, dpo = list(csv.DictReader(file))
    assert grpo == {
        "job": "1_grpo",
        "overrides": "model=tiny algo=grpo",
        "steps": "4",
        "final_reward": "0.3",  # the last logged value; step 2's null is skipped
        "best_reward": "0.5",
        "eval_accuracy": "0.25",
        "train_time_s": "5.0",  # 1 + 2 + 0.5 + 1.5
        "tokens_per_s": "20.0",  # mean of 10, 20, 30: the null is left out
    }
    assert failed["overrides"] == "model=tiny algo=dapo"
    assert all(failed[k] == "" for k in ("steps", "final_reward", "eval_accuracy"))
    assert (dpo["final_reward"], dpo["best_reward"]) == ("1.0", "1.0")  # reward/accuracy
    assert dpo["eval_accuracy"] == "0.75"  # from eval.json
    assert dpo["train_time_s"] == dpo["tokens_per_s"] == ""

    markdown = (tmp_path / "summary.md").read_text()
    assert "3 jobs, all with `model=tiny`." in markdown
    assert "| [2_failed](<2_failed>) | algo=dapo |  |  |  |  |  |  |" in markdown
    assert "| [1_grpo](<1_grpo>) | algo=grpo | 4 | 0.300 | 0.500 | 0.250 | 5.0 | 20.0 |" in (
        markdown
    )
    assert is_png(tmp_path / "summary.png")


def test_a_sweep_over_seeds_gets_means_and_95_percent_intervals(tmp_path):
    accuracies = {("grpo", 0): 0.30, ("grpo", 1): 0.40, ("grpo", 2): 0.35}
    accuracies |= {("dapo", 0): 0.20, ("dapo", 1): 0.20}
    for n, ((algo, seed), accuracy) in enumerate(accuracies.items()):
        overrides = ["model=tiny", f"trainer.seed={seed}", f"algo={algo}"]
        make_job(tmp_path, f"{n}_{algo}_{seed}", overrides, None, {"accuracy": accuracy})
    write_summary(tmp_path)
    markdown = (tmp_path / "summary.md").read_text()
    assert "## Over seeds" in markdown
    # grpo: mean 0.35, sample std 0.05, t(0.975, 2) = 4.303: 4.303 * 0.05 / sqrt(3) = 0.124
    assert "| algo=grpo | 0, 1, 2 | 0.350 ± 0.124 (n=3) |  |  |" in markdown
    assert "| algo=dapo | 0, 1 | 0.200 ± 0.000 (n=2) |  |  |" in markdown


def test_a_sweep_without_repeated_seeds_has_no_seed_table(tmp_path):
    make_job(tmp_path, "0_a", ["trainer.seed=0", "algo=grpo"], None, {"accuracy": 0.5})
    make_job(tmp_path, "1_b", ["trainer.seed=1", "algo=dapo"], None, {"accuracy": 0.5})
    write_summary(tmp_path)
    assert "Over seeds" not in (tmp_path / "summary.md").read_text()


def test_seeds_script_reports_before_and_after_over_seeds(tmp_path):
    # scripts/seeds.py end to end on the tiny model: one evaluation before, a run per seed,
    # each evaluated at its last step, and the table over seeds.
    overrides = ["model=tiny", "reward=space_rate", "sampler=hf", "trainer.max_steps=2"]
    overrides += ["sampler.max_new_tokens=8", "eval.max_problems=4", "eval.k=1"]
    overrides += ["logger.progress=false", "eval.correct_above=0.1"]
    script = REPO / "scripts" / "seeds.py"
    out = subprocess.run(
        [sys.executable, str(script), "--seeds", "2", "--out", str(tmp_path), *overrides],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    before = json.loads((tmp_path / "before" / "eval.json").read_text())["accuracy"]
    jobs = sorted((tmp_path / "runs").glob("*/metrics.jsonl"))
    after = [metrics_rows(j.parent)[-1]["eval/accuracy"] for j in jobs]
    assert len(after) == 2
    table = (tmp_path / "seeds.md").read_text()
    assert f"| before training | {before:.3f} |" in table
    assert f"| after, seed 1 | {after[1]:.3f} |" in table
    assert "| after, mean ± 95% interval | " in table and "(n=2)" in table
    assert "## Over seeds" in (tmp_path / "runs" / "summary.md").read_text()


def test_seeds_script_takes_a_recipe_and_names_an_unknown_one(tmp_path):
    # `recipe=NAME` is registered by the script as by `rlcli train`; a wrong name is one
    # paragraph naming the valid recipes, before any evaluation starts.
    script = REPO / "scripts" / "seeds.py"
    out = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path), "recipe=cpu/no_such_twin"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "recipe=cpu/no_such_twin is not one of the recipes" in out.stderr
    assert "cpu/dapo_qwen32b" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "before").exists()


def test_samples_jsonl_holds_every_scored_response_with_its_advantage(tmp_path, capsys):
    cfg = compose(["model=tiny", "sampler=hf", "reward=space_rate", "trainer.max_steps=2",
                   "sampler.max_new_tokens=8", "logger.progress=false",
                   "logger.print_samples_every=2"])  # fmt: skip
    train(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 16 + [2] * 16  # 4 prompts x 4 responses a step
    for r in rows:
        assert r["prompt"].startswith("What is") and 0 < r["length"] <= 8
        assert r["reward"] == pytest.approx(r["components"]["space_rate"])
    # GRPO's advantages are normalised within each group: they sum to zero over its 4 responses.
    for start in range(0, 32, 4):
        group = rows[start : start + 4]
        assert len({r["problem_id"] for r in group}) == 1
        assert sum(r["advantage"] for r in group) == pytest.approx(0, abs=1e-5)
    out = capsys.readouterr().out
    assert "[step 2] samples (16 scored" in out and "[step 1] samples" not in out


def test_every_backend_gets_the_metrics_and_reads_them_back(tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = compose(["model=tiny", "sampler=hf", "reward=space_rate", "trainer.max_steps=2",
                   "sampler.max_new_tokens=8", "logger.progress=false",
                   "logger.backends=[jsonl,tensorboard,mlflow]", "trainer.eval_every=2",
                   "eval.max_problems=2", "eval.k=2"])  # fmt: skip
    train(cfg, tmp_path)
    rewards = [r["reward/mean"] for r in read_metrics(tmp_path)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2]
    assert [e.value for e in events.Scalars("reward/mean")] == pytest.approx(rewards)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = (tmp_path / "mlflow_run_id").read_text()
    history = client.get_metric_history(run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [
        (1, pytest.approx(rewards[0])),
        (2, pytest.approx(rewards[1])),
    ]
    assert client.get_run(run_id).data.params["trainer.max_steps"] == "2"
    # MLflow refuses '@' in a name: pass@k arrives as pass_at_k.
    evaluated = read_metrics(tmp_path)[-1]["eval/pass@2"]
    [(step, value)] = [
        (m.step, m.value) for m in client.get_metric_history(run_id, "eval/pass_at_2")
    ]
    assert (step, value) == (2, pytest.approx(evaluated))


def test_an_unknown_backend_is_named():
    with pytest.raises(ConfigError, match="logger.backends has 'neptune', which is not one of"):
        compose(["logger.backends=[jsonl,neptune]"])


def test_the_console_table_of_samples_escapes_control_characters(tmp_path):
    from rlcli.tracking.samples import SamplesLog
    from rlcli.tracking.trackers import ScoredSample

    # A response that would clear the screen, recolour it, set its title and reverse the line.
    response = "4\x1b[31m red\x1b]0;owned\x07 \u202eevil\x9b2J"
    sample = ScoredSample("What is\x1b[2J 2+2?", response, "4", 1.0, "p0")
    printed = []
    SamplesLog(tmp_path, every=1, print_every=1).log(1, [sample], {}, printed.append)
    (table,) = printed
    assert not any(char in table for char in "\x1b\x07\u202e\x9b")
    assert "What is\\x1b[2J 2+2?" in table
    assert "4\\x1b[31m red\\x1b]0;owned\\x07 \\u202eevil\\x9b2J" in table
    # samples.jsonl keeps the text as the model wrote it (JSON escapes it there).
    (row,) = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert row["response"] == response and row["prompt"] == sample.prompt
