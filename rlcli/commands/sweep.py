"""Sweep summaries: after `rlcli train -m ...`, one row per job and every job's reward curve.

`write_summary(sweep_dir)` writes `summary.csv`, `summary.md` (with a table over seeds when the
jobs differ only in `trainer.seed`) and `summary.png` into the sweep directory; docs/tracking.md
says what each holds. `SweepSummary` is the Hydra callback (under `hydra.callbacks` in
conf/config.yaml) that calls it; a job is any directory under the sweep holding Hydra's
`.hydra/overrides.yaml`. Each job's directory is named by `job_dirname` (the `rlcli_job_dirname`
resolver in `hydra.sweep.subdir`) from the overrides that vary across the sweep, which
`rlcli train -m` tells from the fixed ones (`fixed_keys_override`).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from rlcli.tracking.curves import HELD_OUT, REWARD, draw_curves, panel_key, series
from rlcli.tracking.metrics import METRICS_FILE, read_metrics


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
    groups = seed_groups(jobs)
    if groups:
        lines += seeds_table(groups, shared)
    return "\n".join(lines) + "\n"


# Two-sided 95% Student-t critical values t(0.975, df) for df = 1..30, from the standard
# tables; past 30 degrees of freedom the normal 1.96 is within 2% of them.
T_975 = tuple(
    float(t)
    for t in """12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160
    2.145 2.131 2.120 2.110 2.101 2.093 2.086 2.080 2.074 2.069 2.064 2.060 2.056 2.052 2.048
    2.045 2.042""".split()
)


def mean_interval(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% Student-t interval (NaN for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    df = len(values) - 1
    t = T_975[df - 1] if df <= len(T_975) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def without_seed(job: JobSummary) -> str:
    """The job's overrides but `trainer.seed`: jobs equal in this are seeds of one config."""
    return " ".join(o for o in job.overrides if not o.startswith("trainer.seed="))


def seed_groups(jobs: list[JobSummary]) -> dict[str, list[JobSummary]]:
    """Jobs grouped by config when the sweep varied `trainer.seed`, else {}."""
    groups: dict[str, list[JobSummary]] = {}
    for job in jobs:
        groups.setdefault(without_seed(job), []).append(job)
    return groups if any(len(g) > 1 for g in groups.values()) else {}


def interval_cell(values: list[float | None], digits: int) -> str:
    """`mean ± half-width (n)` over the values logged; empty when none was."""
    logged = [v for v in values if v is not None and math.isfinite(v)]
    if not logged:
        return ""
    mean, half = mean_interval(logged)
    spread = "" if math.isnan(half) else f" ± {half:.{digits}f}"
    return f"{mean:.{digits}f}{spread} (n={len(logged)})"


def seeds_table(groups: dict[str, list[JobSummary]], shared: list[str]) -> list[str]:
    """summary.md's table over seeds: each config's mean and 95% interval."""
    lines = [
        "",
        "## Over seeds",
        "",
        "Mean ± the half-width of the 95% Student-t interval over the seeds that logged it.",
        "",
        "| config | seeds | eval accuracy | final reward | train time (s) |",
        "|---|---|---|---|---|",
    ]
    for config, group in groups.items():
        own = " ".join(o for o in config.split() if o not in shared) or "(all shared)"
        seeds = ", ".join(
            o.split("=", 1)[1] for j in group for o in j.overrides if o.startswith("trainer.seed=")
        )
        cells = [
            interval_cell([j.eval_accuracy for j in group], 3),
            interval_cell([j.final_reward for j in group], 3),
            interval_cell([j.train_time_s for j in group], 1),
        ]
        lines.append(f"| {markdown_cell(own, 0)} | {seeds} | " + " | ".join(cells) + " |")
    return lines


def write_csv(path: Path, jobs: list[JobSummary]) -> None:
    """summary.csv: every field of every job, the overrides space-separated, numbers in full."""
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(COLUMNS))
        writer.writeheader()
        for job in jobs:
            row = {**asdict(job), "overrides": " ".join(job.overrides)}
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def override_key(override: str) -> str:
    """The key an override sets, as Hydra's `key_or_group` (no +/~ prefix, no @package)."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"
# Longest value kept in a job directory's name; a longer one keeps its end (a file's name).
VALUE_CHARS = 32


def fixed_keys_override(overrides: list[str]) -> list[str]:
    """`[hydra.job.config.override_dirname.exclude_keys=[...]]`: the keys of a sweep's command
    line that take one value (not `a,b`, `range(...)`, ...), so that each job's directory is
    named by the others; [] when the command line sets exclude_keys itself."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(override_key(o) == EXCLUDE_KEYS for o in overrides):
        return []
    own = [o for o in overrides if not override_key(o).startswith("hydra")]
    parsed = OverridesParser.create().parse_overrides(own)
    fixed = sorted({o.key_or_group for o in parsed if not o.is_sweep_override()})
    return [f"{EXCLUDE_KEYS}=[{','.join(repr(k) for k in fixed)}]"]


def short_value(value: str) -> str:
    """A value fit for a directory name: a path's last two parts joined by '-', at most
    VALUE_CHARS characters (the end kept)."""
    parts = [part for part in value.split("/") if part] or [value]
    value = "-".join(parts[-2:])
    return value if len(value) <= VALUE_CHARS else "~" + value[-(VALUE_CHARS - 1) :]


def unquoted(value: str) -> str:
    """A value without the quotes Hydra's grammar reads it in ('/data/dätä.jsonl': rlcli quotes
    a value holding characters the grammar takes only quoted)."""
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
    return value[1:-1] if quoted else value


def job_dirname(num, task_overrides, fixed_keys) -> str:
    """A sweep job's directory: its number, then its overrides whose keys are not in
    `fixed_keys`, each key by its last part where no other such key ends the same
    (`3_algo=dapo,lr=0.01`); the number alone when nothing varies. The number keeps it unique."""
    fixed = {str(k) for k in fixed_keys or ()}
    varied = [str(o) for o in task_overrides or () if override_key(str(o)) not in fixed]
    keys = [override_key(o) for o in varied]
    last = [k.replace("/", ".").rsplit(".", 1)[-1] for k in keys]
    parts = []
    for override, key, short in zip(varied, keys, last, strict=True):
        name = short if last.count(short) == 1 else key.replace("/", ".")
        parts.append(f"{name}={short_value(unquoted(override.split('=', 1)[-1]))}")
    return "_".join([str(num), ",".join(parts)]) if parts else str(num)


def varied_keys(jobs: list[JobSummary]) -> list[str]:
    """The keys whose overrides differ between the jobs, in the order the first job lists them
    (none for a single job)."""
    if len(jobs) < 2:
        return []
    shared = set(shared_overrides(jobs))
    keys = [override_key(o) for job in jobs for o in job.overrides if o not in shared]
    return list(dict.fromkeys(keys))


def chart_title(jobs: list[JobSummary], runs: dict[str, list[dict]]) -> str:
    """summary.png's title: the metrics drawn and what varied, `reward/mean and eval/accuracy
    for each algo × trainer.lr (4 jobs)`."""
    drawn = [panel_key(p, rows) for p in (REWARD, HELD_OUT) for rows in runs.values()]
    metrics = " and ".join(dict.fromkeys(k for k in drawn if k)) or "no metrics"
    keys = varied_keys(jobs)
    over = f" for each {' × '.join(keys)}" if keys else ""
    return f"{metrics}{over} ({len(jobs)} job{'s' if len(jobs) != 1 else ''})"


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
    title = chart_title(jobs, curves)
    draw_curves(curves, sweep_dir / "summary.png", title, (REWARD, HELD_OUT))
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
