"""Per-step metrics: one JSON object per line in `metrics.jsonl`, and the progress bar.

`MetricsLog` writes the file during a run; `read_metrics` reads it back for the curves
(`tracking.curves`) and sweep summaries (`rlcli.commands.sweep`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tqdm import tqdm

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends each step's metrics to `<run_dir>/metrics.jsonl` and updates a progress bar
    showing the step, the `headline` metric and the seconds per step."""

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        progress: bool,
        headline="reward/mean",
        first_step: int = 1,
    ):
        self.path, self.headline = run_dir / METRICS_FILE, headline
        if self.path.exists():
            # A resumed run redoes the steps after its checkpoint: drop their old rows.
            kept = [r for r in _rows(self.path) if r.get("step", 0) < first_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            tmp.replace(self.path)
        self.file = self.path.open("a")
        self.bar = tqdm(
            total=total_steps,
            initial=first_step - 1,
            desc="train",
            unit="step",
            disable=not progress,
        )

    def log(self, metrics: dict) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()
        if "time/step" not in metrics:  # an evaluation before the first step, not a step
            return
        self.bar.set_postfix(
            {
                self.headline: f"{metrics[self.headline]:.3f}",
                "step_s": f"{metrics['time/step']:.1f}",
            }
        )
        self.bar.update(1)

    def write(self, text: str) -> None:
        """Print a line above the progress bar without breaking it."""
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()
        self.file.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of `<run_dir>/metrics.jsonl`, nulls (non-finite numbers) as NaN.

    Raises FileNotFoundError when the run has no metrics file. A line that is not JSON is
    skipped: a job killed while writing leaves a partial last line.
    """
    rows = _rows(Path(run_dir) / METRICS_FILE)
    return [{k: math.nan if v is None else v for k, v in row.items()} for row in rows]


def _rows(path: Path) -> list[dict]:
    """The JSON objects of a metrics file, skipping a partial line left by a killed run."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
