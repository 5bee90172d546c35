"""Per-step metrics: one JSON object per line in `metrics.jsonl`, and the progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tqdm import tqdm


class MetricsLog:
    """Appends each step's metrics to `<run_dir>/metrics.jsonl` and updates a progress bar
    showing the step, the `headline` metric and the seconds per step."""

    def __init__(self, run_dir: Path, total_steps: int, progress: bool, headline="reward/mean"):
        self.path, self.headline = run_dir / "metrics.jsonl", headline
        self.file = self.path.open("a")
        self.bar = tqdm(total=total_steps, desc="train", unit="step", disable=not progress)

    def log(self, metrics: dict) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()
        self.bar.set_postfix(
            {
                self.headline: f"{metrics[self.headline]:.3f}",
                "step_s": f"{metrics['time/step']:.1f}",
            }
        )
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.file.close()
