"""Where a run's metrics go: `Tracker` is what both training loops log to.

Always: `metrics.jsonl` and the progress bar (`tracking.metrics.MetricsLog`), `samples.jsonl`
(`rlcli.tracking.samples`), and `curves.png` drawn from the metrics when the run finishes
(`tracking.curves`). `logger.backends` (`BACKENDS`) adds any combination of Weights & Biases
(`WandbRun`), TensorBoard (`TensorBoardRun`) and MLflow (`MlflowRun`), each through its own
library and each saying where its run is in one `rlcli:` line as the run starts;
docs/tracking.md says what each writes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import uuid
from collections.abc import Sequence
from pathlib import Path

from rlcli.config import ConfigError, LoggerConfig
from rlcli.rewards.scored import ScoredSample
from rlcli.tracking.curves import CURVES_FILE, plot_runs
from rlcli.tracking.metrics import MetricsLog
from rlcli.tracking.samples import SamplesLog

SAMPLE_COLUMNS = ["step", "prompt", "response", "answer", "reward"]


class NoTracker:
    """The tracker of torchrun's other ranks: rank 0 alone logs, so every call does nothing."""

    path = None

    def log(self, metrics: dict, samples: Sequence[ScoredSample] = (), advantages=None) -> None:
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
        # Silent: W&B's banner, its hints and its advertisements (Weave, on seeing vLLM's
        # openai import) are written to the "wandb" logger, which the job log sends to
        # train.log, instead of to the console; `where` is what the console shows.
        silent = wandb.Settings(silent=True)
        wandb.setup(settings=silent)
        wandb.termsetup(silent, logging.getLogger("wandb"))
        try:
            self.run = wandb.init(
                project=logger.project,
                entity=logger.entity,
                name=logger.run_name or run_dir.name,
                dir=str(run_dir),
                config=config,
                id=run_id,
                resume="allow",
                settings=silent,
            )
        except wandb.errors.UsageError as err:  # no API key, an unknown entity, ...
            wandb.teardown()  # its service's last records go to train.log, not after the error
            raise ConfigError(
                f"logger=wandb could not start a W&B run: {err} Or keep the run on disk with "
                "WANDB_MODE=offline (upload it later with `wandb sync`), or use another "
                "logger (logger=jsonl, tensorboard, mlflow)."
            ) from None
        self.where = self._where()

    def _where(self) -> str:
        if self.run.disabled:
            return "rlcli: W&B is disabled (WANDB_MODE=disabled); nothing is sent to it"
        files = Path(self.run.settings.sync_dir).resolve()
        if self.run.offline:
            return f"rlcli: W&B run kept offline in {files} (upload it: wandb sync {files})"
        return f"rlcli: W&B run at {self.run.url} (its files in {files})"

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
        # W&B's background service stops now, while the job log still takes its last records
        # (else they reach the console as the process exits).
        self.wandb.teardown()


def _finite_numbers(metrics: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if k != "step" and isinstance(v, int | float) and math.isfinite(v)
    }


class TensorBoardRun:
    """TensorBoard event files in <run_dir>/tensorboard: each metric a scalar at its step, and
    the resolved config as text."""

    def __init__(self, logger: LoggerConfig, config: dict, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        logs = (run_dir / "tensorboard").resolve()
        self.writer = SummaryWriter(log_dir=str(logs))
        self.where = f"rlcli: TensorBoard logs in {logs} (tensorboard --logdir {logs})"
        text = json.dumps(config, indent=1)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "))  # as code

    def log(self, metrics: dict, samples: list[ScoredSample]) -> None:
        for key, value in _finite_numbers(metrics).items():
            self.writer.add_scalar(key, value, global_step=metrics["step"])
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class MlflowRun:
    """An MLflow run in a SQLite file, <run_dir>/mlflow.db (experiment `logger.project`): the
    config as parameters, each step's metrics at its step. No server is needed; MLflow keeps
    its plain-file store in maintenance mode only, so the supported SQLite store it is. A
    resumed run logs to the same MLflow run."""

    def __init__(self, logger: LoggerConfig, config: dict, run_dir: Path):
        import mlflow

        self.mlflow = mlflow
        uri = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        mlflow.set_tracking_uri(uri)
        self.where = f"rlcli: MLflow runs in {uri} (mlflow ui --backend-store-uri {uri})"
        experiment = mlflow.get_experiment_by_name(logger.project)
        experiment_id = (
            experiment.experiment_id
            if experiment
            else mlflow.create_experiment(
                logger.project, artifact_location=(run_dir / "mlartifacts").resolve().as_uri()
            )
        )
        id_file = run_dir / "mlflow_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        self.run = mlflow.start_run(
            run_id=run_id, experiment_id=experiment_id, run_name=logger.run_name or run_dir.name
        )
        id_file.write_text(self.run.info.run_id)
        if run_id is None:
            params = {k: str(v)[:500] for k, v in flat_items(config).items()}  # MLflow's size limit
            items = sorted(params.items())
            for start in range(0, len(items), 100):  # at most 100 parameters a call
                mlflow.log_params(dict(items[start : start + 100]))

    def log(self, metrics: dict, samples: list[ScoredSample]) -> None:
        # MLflow refuses '@' in a metric's name: eval/pass@4 is logged as eval/pass_at_4.
        named = {k.replace("@", "_at_"): v for k, v in _finite_numbers(metrics).items()}
        self.mlflow.log_metrics(named, step=metrics["step"])

    def finish(self) -> None:
        self.mlflow.end_run()


def flat_items(tree: dict, prefix: str = "") -> dict:
    """A nested dict as {"section.key": value} (MLflow's parameters; run_dir's comparison)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat_items(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# logger.backends: each external tracker's class and the package it needs (jsonl: always on).
BACKENDS = {
    "jsonl": (None, None),
    "wandb": (WandbRun, "wandb"),
    "tensorboard": (TensorBoardRun, "tensorboard"),
    "mlflow": (MlflowRun, "mlflow"),
}


def check_backends(logger: LoggerConfig) -> None:
    """A ConfigError for a backend that does not exist or whose package is not installed."""
    for name in logger.backends:
        if name not in BACKENDS:
            raise ConfigError(
                f"logger.backends has {name!r}, which is not one of the valid backends: "
                f"{', '.join(BACKENDS)}."
            )
        package = BACKENDS[name][1]
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"logger {name} needs the {package} package, which is not installed: pip "
                f"install 'rlcli[{name}]' (or leave {name} out of logger.backends)."
            )


class Tracker:
    """A run's metrics: metrics.jsonl and the progress bar always, W&B with logger=wandb.

    `headline` is the metric the progress bar shows. `finish` closes everything and draws
    `curves.png` in the run directory.
    """

    def __init__(
        self,
        log: LoggerConfig,
        config: dict,  # the whole run's config as plain data, which remote trackers record
        max_steps: int,  # the bar's length
        run_dir: Path,
        headline: str = "reward/mean",
        first_step: int = 1,
    ):
        self.run_dir = run_dir
        # External trackers first: their start-up lines would otherwise break into the bar.
        self.remotes = [
            BACKENDS[name][0](log, config, run_dir)
            for name in dict.fromkeys(log.backends)
            if BACKENDS[name][0] is not None
        ]
        for remote in self.remotes:
            print(remote.where)
        self.metrics = MetricsLog(run_dir, max_steps, log.progress, headline, first_step)
        self.path = self.metrics.path
        self.samples = SamplesLog(run_dir, log.samples_every, log.print_samples_every, first_step)

    def log(
        self, metrics: dict, samples: Sequence[ScoredSample] = (), advantages: dict | None = None
    ) -> None:
        """One step's metrics (with its `step`), and the responses it scored, if any, with the
        advantages of those it trained on ({(problem id, response): advantage})."""
        self.metrics.log(metrics)
        self.samples.log(metrics["step"], samples, advantages or {}, self.metrics.write)
        for remote in self.remotes:
            remote.log(metrics, list(samples))

    def write(self, text: str) -> None:
        """Print a line above the progress bar."""
        self.metrics.write(text)

    def finish(self) -> Path:
        """Close metrics.jsonl and W&B; draw the run's curves. Returns the curves' path."""
        self.metrics.close()
        for remote in self.remotes:
            remote.finish()
        return plot_runs([self.run_dir], self.run_dir / CURVES_FILE)
