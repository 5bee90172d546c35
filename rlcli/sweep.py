"""Sweep summaries: after `rlcli train -m ...`, one row per job and every job's reward curve.

`write_summary(sweep_dir)` writes into the sweep directory
- `summary.csv` and `summary.md`: per job its overrides, steps, final and best reward
  (`reward/mean`; DPO: `reward/accuracy`), held-out accuracy (the last `eval/accuracy`, else
  `accuracy` of the job's eval.json), training time (the sum of `time/step`) and the mean
  `throughput/tokens_per_s`; a job that wrote no metrics (it failed) has empty cells;
- `summary.png`: every job's reward curve on one chart.

`SweepSummary` is the Hydra callback (registered under `hydra.callbacks` in conf/config.yaml)
that calls it. A job is any directory under the sweep holding Hydra's `.hydra/overrides.yaml`.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from rlcli.tracking.metrics import METRICS_FILE, read_metrics
from rlcli.tracking.plots import REWARD, draw_curves, panel_key, series


@dataclass
class JobSummary:
    """One job's row; None where the job did not log the value (an empty cell)."""

    job: str  # the job directory, relative to the sweep directory
    overrides: list[str]  # the job's command-line overrides
    steps: int | None = None
    final_reward: float | None = None
    best_reward: float | None = None
    eval_accuracy: float | None = None
    train_time_s: float | None = None
    tokens_per_s: float | None = None


# The columns of summary.csv (JobSummary's fields) and of summary.md: header, decimals.
COLUMNS = {
    "job": ("job", 0),
    "overrides": ("overrides", 0),
    "steps": ("steps", 0),
    "final_reward": ("final reward", 3),
    "best_reward": ("best reward", 3),
    "eval_accuracy": ("eval accuracy", 3),
    "train_time_s": ("train time (s)", 1),
    "tokens_per_s": ("tokens/s", 1),
}


def natural_key(text: str) -> list:
    """Sorts `10_x` after `9_x`: Hydra names job directories by their number first."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job directories, in job order."""
    found = [p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")]
    return sorted(found, key=lambda d: natural_key(d.relative_to(sweep_dir).as_posix()))


def finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def eval_accuracy(job_dir: Path, rows: list[dict]) -> float | None:
    """The last held-out accuracy logged during training, else that of `rlcli eval`."""
    logged = finite(series(rows, "eval/accuracy")[1])
    if logged:
        return logged[-1]
    report = job_dir / "eval.json"
    if report.is_file():
        return json.loads(report.read_text()).get("accuracy")
    return None


def summarize_job(sweep_dir: Path, job_dir: Path) -> JobSummary:
    """One job's row, from its overrides, metrics.jsonl and eval.json."""
    overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
    summary = JobSummary(job_dir.relative_to(sweep_dir).as_posix(), [str(o) for o in overrides])
    rows = read_metrics(job_dir) if (job_dir / METRICS_FILE).is_file() else []
    summary.eval_accuracy = eval_accuracy(job_dir, rows)
    if not rows:
        return summary
    summary.steps = rows[-1]["step"]
    reward_key = panel_key(REWARD, rows)
    rewards = finite(series(rows, reward_key)[1]) if reward_key else []
    if rewards:
        summary.final_reward, summary.best_reward = rewards[-1], max(rewards)
    step_times = finite(series(rows, "time/step")[1])
    summary.train_time_s = sum(step_times) if step_times else None
    throughput = finite(series(rows, "throughput/tokens_per_s")[1])
    summary.tokens_per_s = sum(throughput) / len(throughput) if throughput else None
    return summary


def shared_overrides(jobs: list[JobSummary]) -> list[str]:
    """The overrides every job has (none for a single job: its overrides are what it ran)."""
    if len(jobs) < 2:
        return []
    return [o for o in jobs[0].overrides if all(o in job.overrides for job in jobs[1:])]


def swept(job: JobSummary, shared: list[str]) -> str:
    """The job's own overrides, those that set it apart from the other jobs."""
    return " ".join(o for o in job.overrides if o not in shared)


def job_number(sweep_dir: Path, job: JobSummary) -> str:
    """Hydra's number of the job (`hydra.job.num`), else its directory's name."""
    hydra_file = sweep_dir / job.job / ".hydra" / "hydra.yaml"
    if hydra_file.is_file():
        hydra_job = (yaml.safe_load(hydra_file.read_text()) or {}).get("hydra", {}).get("job")
        if isinstance(hydra_job, dict) and isinstance(hydra_job.get("num"), int):
            return str(hydra_job["num"])
    return Path(job.job).name


def markdown_cell(value, digits: int) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")


def markdown_table(sweep_dir: Path, jobs: list[JobSummary]) -> str:
    """summary.md: the overrides all jobs share above, each job's own in its row."""
    shared = shared_overrides(jobs)
    header = [title for title, _ in COLUMNS.values()]
    lines = [
        f"# Sweep {sweep_dir}",
        "",
        f"{len(jobs)} jobs" + (f", all with `{' '.join(shared)}`." if shared else "."),
        "Reward: `reward/mean` (DPO: `reward/accuracy`), final and best over the steps; eval "
        "accuracy: the last held-out accuracy; train time: the sum of `time/step`; tokens/s: "
        "the mean throughput. Empty cells were not logged (a job that failed has none).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for job in jobs:
        values = {**asdict(job), "overrides": swept(job, shared)}
        cells = [markdown_cell(values[k], digits) for k, (_, digits) in COLUMNS.items()]
        cells[0] = f"[{job_number(sweep_dir, job)}](<{job.job}>)"  # the long name as a link
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, jobs: list[JobSummary]) -> None:
    """summary.csv: every field of every job, the overrides space-separated, numbers in full."""
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(COLUMNS))
        writer.writeheader()
        for job in jobs:
            row = {**asdict(job), "overrides": " ".join(job.overrides)}
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def write_summary(sweep_dir: Path) -> list[JobSummary]:
    """Write summary.md, summary.csv and summary.png into `sweep_dir`; return the rows."""
    sweep_dir = Path(sweep_dir)
    dirs = job_dirs(sweep_dir)
    jobs = [summarize_job(sweep_dir, d) for d in dirs]
    (sweep_dir / "summary.md").write_text(markdown_table(sweep_dir, jobs))
    write_csv(sweep_dir / "summary.csv", jobs)
    shared = shared_overrides(jobs)
    curves = {
        swept(job, shared) or job.job: read_metrics(d)
        for job, d in zip(jobs, dirs, strict=True)
        if (d / METRICS_FILE).is_file()
    }
    draw_curves(curves, sweep_dir / "summary.png", f"sweep {sweep_dir.name}", (REWARD,))
    return jobs


class SweepSummary(Callback):
    """Hydra callback: the sweep's summary after every job and at the end of the sweep.

    Rewritten after each job because Hydra's basic sweeper re-raises a failed job's error
    once all jobs ran, and then never calls `on_multirun_end`; so a sweep with a failed job
    still gets its summary, the failed job with empty cells.
    """

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        try:
            write_summary(Path(config.hydra.sweep.dir))
        except Exception as err:  # a summary must not stop the jobs still to run
            print(f"rlcli: warning: sweep summary not written: {err!r}", file=sys.stderr)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        write_summary(sweep_dir)
        print(f"rlcli: sweep summary in {sweep_dir / 'summary.md'} (and .csv, .png)")
