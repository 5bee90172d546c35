"""The run directory: one run owns it at a time, and what it says about the run is true.

- `claim`: a run holds an exclusive OS lock (`flock`) on `.rlcli-run` in its directory for as
  long as it lives; the same file marks the directory as rlcli's, and a foreign one is refused.
- `resume_changes`: what a resumed run may change (`FREE`, `APPLIED`; the rest is fixed).
- `record_config`: `config.yaml` is the config in force, then the directory's history.
- `discard_unused`: a command whose config fails validation leaves no directory behind.
docs/reliability.md ("Resuming", "One run per directory") says what a user sees of them.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from rlcli.config import ConfigError
from rlcli.tracking.trackers import flat_items

MARKER = ".rlcli-run"
HISTORY = "# history of this run directory:"
# Prefixes of fields a resumed run takes from the new command without comment: they say how
# long and how often, or how to fit the work on the machine, not what is trained.
FREE = (
    "trainer.max_steps",
    "trainer.save_every",
    "trainer.keep_last",
    "trainer.resume",
    "trainer.max_bad_steps",
    "trainer.eval_every",
    "trainer.val_before_train",
    "trainer.device",
    "trainer.micro_batch_size",
    "trainer.max_tokens_per_micro_batch",
    "trainer.attention",
    "trainer.bf16_weights",
    "trainer.compile",
    "model.gradient_checkpointing",
    "sampler.max_model_len",
    "sampler.gpu_memory_utilization",
    "sampler.tensor_parallel_size",
    "sampler.cpu_kv_cache_gb",
    "sampler.enforce_eager",
    "sampler.workers",
    "sampler.urls",
    "sampler.max_staleness",
    "sampler.transfer_address",
    "sampler.worker_timeout_s",
    "sampler.serve_port",
    "reward.timeout_s",
    "reward.batch_size",
    "logger.",
    "eval.",
    "filter.",
    "pairs.",
)
# Fields a resumed run takes from the new command from its next step on, with a line saying so
# (the checkpoint's optimiser and β are overwritten with them).
APPLIED = (
    "trainer.lr",
    "trainer.weight_decay",
    "trainer.warmup_steps",
    "trainer.lr_scheduler",
    "trainer.lr_scheduler_kwargs.",
    "trainer.max_grad_norm",
    "algo.beta",
    "algo.entropy_coef",
)
# Everything else is fixed for the life of a run: the model, data, reward, algorithm, sampling
# distribution, batch shape, seed and precision. A change there is a different run.

_held: dict[Path, int] = {}  # run directories this process holds: path -> the lock's fd


def kind_of_field(key: str) -> str:
    """'free', 'applied' or 'fixed': what a resumed run does when `key` changed."""
    if any(key == p or (p.endswith(".") and key.startswith(p)) for p in FREE):
        return "free"
    applied = any(key == p or (p.endswith(".") and key.startswith(p)) for p in APPLIED)
    return "applied" if applied else "fixed"


def resume_changes(
    saved: dict, current: dict, old_logp_now: str
) -> dict[str, list[tuple[str, object, object]]]:
    """The fields of `current` (the config now, as `config_dict` gives it) that differ from
    the checkpoint's config, by kind: {'fixed': [(key, old, new)], 'applied': [...], 'free':
    [...]}. Fields one side lacks (added to rlcli since) are not compared. `old_logp_now`:
    what `sampler.old_logp=auto` resolves to for this run."""
    old, new = flat_items(saved), flat_items(current)
    if new.get("sampler.old_logp") == "auto" and old.get("sampler.old_logp") != "auto":
        # An older rlcli saved `auto` as it resolved it: compare that with what it means now.
        new["sampler.old_logp"] = old_logp_now
    changes: dict[str, list] = {"fixed": [], "applied": [], "free": []}
    for key in sorted(old.keys() & new.keys()):
        if old[key] != new[key]:
            changes[kind_of_field(key)].append((key, old[key], new[key]))
    return changes


def check_resume(
    saved: dict | None, current: dict, old_logp_now: str, checkpoint: Path, step: int
) -> list[str]:
    """Lines to print for a resume from `checkpoint` (step `step`) with the config `current`
    (`resume_changes`); a ConfigError when a field that is fixed for the life of a run differs
    from the checkpoint's config."""
    if saved is None:
        return [f"rlcli: {checkpoint} does not record its config (an older rlcli wrote it): "
                "the config is not compared with it."]  # fmt: skip
    changes = resume_changes(saved, current, old_logp_now)
    if changes["fixed"]:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changes["fixed"])
        raise ConfigError(
            f"this command would continue {checkpoint} (step {step}), but it differs from that "
            f"run in fields that cannot change mid-run: {listed}. A run keeps its model, data, "
            "reward, algorithm, batch shape, seed and precision (docs/reliability.md). Either "
            "write this run to a new directory (hydra.run.dir=NEW), or, if you meant to "
            "start afresh rather than continue, set trainer.resume=null (it refuses a "
            "directory that already holds checkpoints); or drop those overrides to continue."
        )
    lines = [
        f"rlcli: {key} changed since step {step} ({old!r} -> {new!r}); it applies from step "
        f"{step + 1}."
        for key, old, new in changes["applied"]
    ]
    if changes["free"]:
        listed = ", ".join(f"{k}={new!r}" for k, _, new in changes["free"])
        lines.append(f"rlcli: taken from this command: {listed}.")
    return lines


def _is_rlcli_dir(run_dir: Path) -> bool:
    """Whether rlcli has written here: its marker, or (an older rlcli's run) its config.yaml."""
    if (run_dir / MARKER).is_file():
        return True
    try:
        saved = OmegaConf.load(run_dir / "config.yaml")
        return all(k in saved for k in ("algo", "trainer", "sampler", "model"))
    except Exception:  # noqa: BLE001 - missing, unreadable or not YAML: not an rlcli config
        return False


def _refuse_foreign(run_dir: Path, hydra_files: tuple[str, ...]) -> None:
    if _is_rlcli_dir(run_dir):
        return
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in hydra_files)
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ConfigError(
            f"hydra.run.dir={run_dir} is not empty and is not an rlcli run directory (it holds "
            f"{shown}). rlcli writes config.yaml, metrics.jsonl and checkpoints/ into its run "
            "directory and would overwrite files of those names: give a new or empty directory "
            "(hydra.run.dir=...), or the directory of an earlier rlcli run to continue it."
        )


def _holder(run_dir: Path) -> str:
    try:
        info = json.loads((run_dir / MARKER).read_text())
        return f"PID {info['pid']}, started {info['started']}: {info['command']}"
    except (OSError, ValueError, KeyError):
        return "PID unknown"


# Set by `launcher=ray` in each rank's environment: the launcher holds the run directory's
# lock for every rank.
RUN_DIR_HELD_VARIABLE = "RLCLI_RUN_DIR_HELD"


@contextmanager
def claim(run_dir: Path, command: str = "rlcli", hydra_files: tuple[str, ...] = (".hydra",)):
    """Hold `run_dir` for this process: refuse a foreign directory (a non-empty one without the
    marker or an older rlcli run's files is someone else's), then take the lock (a ConfigError
    naming the holder's PID when another process has it). The kernel drops the lock when the
    process ends, however it ends, so a killed run never blocks the next. `command` is what the
    lock file tells a second run; `hydra_files` are what Hydra itself wrote in the directory
    before the job started. Re-entrant within one process; a rank that `launcher=ray` started
    (RLCLI_RUN_DIR_HELD set) takes no lock, since its launcher holds it for every rank."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held or os.environ.get(RUN_DIR_HELD_VARIABLE):
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    _refuse_foreign(run_dir, hydra_files)
    fd = os.open(run_dir / MARKER, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"another rlcli run is writing to {run_dir} ({_holder(run_dir)}). Two runs in one "
            "directory would mix their metrics and overwrite each other's checkpoints. Wait "
            "for it to end, stop it, or give this run another directory (hydra.run.dir=...)."
        ) from None
    started = datetime.datetime.now().isoformat(timespec="seconds")
    info = json.dumps({"pid": os.getpid(), "started": started, "command": command})
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)
    _held[run_dir] = fd
    try:
        yield
    finally:
        del _held[run_dir]
        os.close(fd)  # releases the lock; the marker file stays, marking the directory


def record_config(run_dir: Path, config: dict, event: str) -> None:
    """Write config.yaml: the config in force now (`config_dict`), then the directory's history
    (carried over from the previous config.yaml) with `event` appended."""
    path = Path(run_dir) / "config.yaml"
    history: list[str] = []
    if path.is_file():
        text = path.read_text()
        if HISTORY in text:
            history = text[text.index(HISTORY) :].splitlines()[1:]
    now = datetime.datetime.now().isoformat(timespec="seconds")
    history.append(f"# {now} {event}")
    (Path(run_dir) / MARKER).touch()
    body = OmegaConf.to_yaml(config)
    path.write_text(body + "\n" + HISTORY + "\n" + "\n".join(history) + "\n")


# What a start writes in its run directory before the job gets going, besides Hydra's own
# `hydra_files` (its output subdir and the job log): rlcli's marker and config.yaml.
START_FILES = (MARKER, "config.yaml")
# What Hydra writes in its output subdir (.hydra/), and beside a sweep's jobs.
HYDRA_SAVED = ("config.yaml", "hydra.yaml", "overrides.yaml")
SWEEP_FILES = ("multirun.yaml",)

_new_dirs: set[Path] = set()  # directories this command noted missing before they were made


def note_new_dirs(path: Path | str) -> None:
    """Note `path` and each parent of it that does not exist yet: this command is about to make
    them (Hydra makes the run directory before the job validates its config), so
    `discard_unused` may remove them again. No ~ is expanded: Hydra expands none."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        if folder.exists():
            return
        _new_dirs.add(folder)


def forget_new_dirs() -> None:
    """A new command: what an earlier one in this process made is not its own."""
    _new_dirs.clear()


class NoteNewRunDir(Callback):
    """Hydra callback: notes the run directory (a sweep's directory under -m) as new when it does
    not exist yet, before Hydra makes it; `hydra.run.dir`'s ${now:...} resolves to the same
    time here as when Hydra makes it (Hydra caches it for the command)."""

    def on_run_start(self, config, **kwargs) -> None:
        note_new_dirs(config.hydra.run.dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        note_new_dirs(config.hydra.sweep.dir)


def _made_here(run_dir: Path) -> bool:
    return any(folder in _new_dirs for folder in (run_dir, *run_dir.parents))


def _holds_only_start_files(run_dir: Path, hydra_files: tuple[str, ...]) -> bool:
    """Whether `run_dir` holds nothing but what a start writes: Hydra's `hydra_files` (its
    output subdir, holding only Hydra's files, and the job log) and rlcli's START_FILES."""
    subdir = hydra_files[0]
    for entry in run_dir.iterdir():
        if entry.name not in (*hydra_files, *START_FILES) or entry.is_symlink():
            return False
        if entry.is_dir() != (entry.name == subdir):
            return False
    saved = run_dir / subdir
    return not saved.is_dir() or _holds_only(saved, HYDRA_SAVED)


def _holds_only(folder: Path, names: tuple[str, ...]) -> bool:
    """Whether each entry of `folder` is a plain file named in `names` (none: it is empty)."""
    return all(e.name in names and e.is_file() and not e.is_symlink() for e in folder.iterdir())


def discard_unused(run_dir: Path, hydra_files: tuple[str, ...]) -> bool:
    """Remove `run_dir`, which a job that stopped at a config error started in, when this command
    made it (`note_new_dirs`) and it holds nothing but what a start writes; then each parent
    this command made that is left empty (a sweep's directory: holding only Hydra's
    multirun.yaml). Held (`claim`) while it is checked and removed, so a run that took it
    meanwhile keeps it. A directory that existed before, or holds anything else (checkpoints,
    metrics, a user's file), is never removed. Returns whether it was removed; a failure to
    remove leaves it as it is, as the config error is what the user must see."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir() or not _made_here(run_dir):
        return False
    try:
        with claim(run_dir, "rlcli (removing a run directory whose config failed)", hydra_files):
            if not _holds_only_start_files(run_dir, hydra_files):
                return False
            shutil.rmtree(run_dir)
        for parent in run_dir.parents:
            if parent not in _new_dirs or not _holds_only(parent, SWEEP_FILES):
                break
            for name in SWEEP_FILES:
                (parent / name).unlink(missing_ok=True)
            parent.rmdir()  # fails, leaving it, if anything appeared there meanwhile
    except (ConfigError, OSError):  # another run holds it, or the disk refused
        return False
    return True
