"""Where a run's metrics go: `Tracker` is what both training loops log to.

Always: `metrics.jsonl` and the progress bar (`rlcli.metrics.MetricsLog`), and `curves.png`
drawn from the metrics when the run finishes (`rlcli.plots`). With `logger=wandb`, also
Weights & Biases: the resolved config, every step's metrics at its step, and every
`logger.table_every` steps a table of that step's sampled responses. W&B reads WANDB_MODE
itself, so `WANDB_MODE=offline` keeps the run on disk (`<run_dir>/wandb/`) for `wandb sync`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlcli.config import Config, ConfigError, LoggerConfig
from rlcli.tracking.metrics import MetricsLog
from rlcli.tracking.plots import CURVES_FILE, plot_runs

SAMPLE_COLUMNS = ["step", "prompt", "response", "answer", "reward"]


@dataclass(frozen=True)
class ScoredSample:
    """One sampled response as the table of samples shows it."""

    prompt: str  # the question, before chat rendering
    response: str
    answer: str  # ground truth
    reward: float  # NaN when the reward failed


class RecordingScorer:
    """A scorer that also keeps what it scores while `recording()` is open.

    The trainer's step returns its metrics only; wrapping the scorer lets the loop show the
    step's responses with their prompts and rewards without changing the step. Recording is
    scoped so that scoring done outside the step (held-out evaluation) stays out.
    """

    def __init__(self, scorer):
        self.scorer = scorer
        self.recorded: list[ScoredSample] | None = None

    def __call__(self, samples):
        scores = self.scorer(samples)
        if self.recorded is not None:
            self.recorded += [
                ScoredSample(s.question, s.response, s.answer, reward)
                for s, reward in zip(samples, scores.total.tolist(), strict=True)
            ]
        return scores

    def __getattr__(self, name):
        return getattr(self.scorer, name)

    @contextmanager
    def recording(self) -> Iterator[list[ScoredSample]]:
        """A list that fills with every response scored inside the `with` block."""
        self.recorded = []
        try:
            yield self.recorded
        finally:
            self.recorded = None


class NoRemote:
    """No external tracker (logger=jsonl): every call does nothing, so no call needs an if."""

    def log(self, metrics: dict, samples: list[ScoredSample]) -> None:
        pass

    def finish(self) -> None:
        pass


class NoTracker:
    """The tracker of torchrun's other ranks: rank 0 alone logs, so every call does nothing."""

    path = None

    def log(self, metrics: dict, samples: Sequence[ScoredSample] = ()) -> None:
        pass

    def write(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbRun:
    """One Weights & Biases run: the config at init, each step's metrics at `step`."""

    def __init__(self, logger: LoggerConfig, config: dict, run_dir: Path):
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "logger=wandb needs the wandb package: pip install 'rlcli[wandb]' (or use "
                "logger=jsonl, the default)."
            ) from None
        self.wandb, self.table_every = wandb, logger.table_every
        # The run's W&B id is kept in the run directory, so a resumed run logs to the same run.
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(
            project=logger.project,
            entity=logger.entity,
            name=logger.run_name or run_dir.name,
            dir=str(run_dir),
            config=config,
            id=run_id,
            resume="allow",
        )

    def log(self, metrics: dict, samples: list[ScoredSample]) -> None:
        step = metrics["step"]
        payload = {k: v for k, v in metrics.items() if k != "step"}
        if samples and self.table_every and step % self.table_every == 0:
            # A new table per logged step: W&B shows the latest and keeps each one by step.
            rows = [[step, s.prompt, s.response, s.answer, s.reward] for s in samples]
            payload["samples"] = self.wandb.Table(columns=SAMPLE_COLUMNS, data=rows)
        self.run.log(payload, step=step)

    def finish(self) -> None:
        self.run.finish()


class Tracker:
    """A run's metrics: metrics.jsonl and the progress bar always, W&B with logger=wandb.

    `headline` is the metric the progress bar shows. `finish` closes everything and draws
    `curves.png` in the run directory.
    """

    def __init__(
        self, cfg: Config, run_dir: Path, headline: str = "reward/mean", first_step: int = 1
    ):
        self.run_dir = run_dir
        # W&B first: its start-up lines would otherwise break into the progress bar.
        self.remote = (
            WandbRun(cfg.logger, dataclasses.asdict(cfg), run_dir)
            if cfg.logger.name == "wandb"
            else NoRemote()
        )
        self.metrics = MetricsLog(
            run_dir, cfg.trainer.max_steps, cfg.logger.progress, headline, first_step
        )
        self.path = self.metrics.path

    def log(self, metrics: dict, samples: Sequence[ScoredSample] = ()) -> None:
        """One step's metrics (with its `step`), and the responses it sampled, if any."""
        self.metrics.log(metrics)
        self.remote.log(metrics, list(samples))

    def write(self, text: str) -> None:
        """Print a line above the progress bar."""
        self.metrics.write(text)

    def finish(self) -> Path:
        """Close metrics.jsonl and W&B; draw the run's curves. Returns the curves' path."""
        self.metrics.close()
        self.remote.finish()
        return plot_runs([self.run_dir], self.run_dir / CURVES_FILE)
