"""Checkpoints: `checkpoints/step_N/` holds everything a run needs to continue exactly: the
policy as a Hugging Face directory (transformers and vLLM load it as any model), `optimizer.pt`
(optimiser and scheduler state dicts), `trainer_state.json` (the step, data position, RNG
states and whatever else the loop keeps between steps) and `manifest.json` (every file's size
and SHA-256, written last, so that a checkpoint damaged afterwards is found: `damage`).

A checkpoint is written into a hidden temporary sibling marked in progress (`IN_PROGRESS`) and
renamed into place, so `step_N` exists only once it is complete; old ones are pruned the same
way (marked, renamed, then deleted). docs/reliability.md, "Checkpoints", says what a user sees.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from rlcli.config import ConfigError, TrainerConfig
from rlcli.runtime.lora import ADAPTER_CONFIG

STATE_FILE = "trainer_state.json"
# Tensors, numbers and lists only: read back with torch.load(weights_only=True), which refuses
# arbitrary pickled objects.
TENSORS_FILE = "optimizer.pt"
MANIFEST_FILE = "manifest.json"
IN_PROGRESS = ".rlcli-in-progress"  # in a directory rlcli is writing or deleting
UNMARKED_TEMP = re.compile(r"\.step_\d+-\w+$")  # the name mkdtemp gives a checkpoint being written
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointWriteError(ConfigError):
    """A checkpoint could not be written (disk full, read-only, permissions); older ones are
    intact. A ConfigError, so the CLI prints it as a message with exit code 2."""


def python_rng_state(rng) -> list:
    """The state of `random` (the module or a `random.Random`) as a JSON-ready list."""
    version, keys, gauss = rng.getstate()
    return [version, list(keys), gauss]


def set_python_rng_state(rng, state: list) -> None:
    version, keys, gauss = state
    rng.setstate((version, tuple(keys), gauss))


def rng_state() -> dict:
    """Python, numpy and torch RNG states as JSON-ready lists."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": python_rng_state(random),
        "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict) -> None:
    set_python_rng_state(random, state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [
        (int(m.group(1)), p)
        for p in (root.iterdir() if root.is_dir() else [])
        if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return [p for _, p in sorted(found)]


def checkpoint_at(path: Path) -> Path | None:
    """What `rlcli export PATH` and `rlcli eval model.path=PATH` read: PATH itself when it is a
    model or a LoRA checkpoint, else the newest checkpoint of the run directory it is (None if
    it is neither)."""
    if (path / ADAPTER_CONFIG).is_file() or (path / "config.json").is_file():
        return path
    found = list_checkpoints(path)
    return found[-1] if found else None


def _remove(path: Path) -> None:
    """Delete a directory so that no half-deleted `step_N` can be mistaken for a checkpoint."""
    (path / IN_PROGRESS).touch()
    doomed = path.with_name(f".deleting-{path.name}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_incomplete(run_dir: Path) -> list[str]:
    """Delete the directories rlcli marked in progress: checkpoints whose writing (or deletion)
    was interrupted. A process killed between creating `.step_N-*` and marking it leaves that
    directory empty, so an empty one with rlcli's name goes too. Other hidden directories
    without the marker are not rlcli's and stay."""
    root = Path(run_dir) / "checkpoints"
    stale = [p for p in root.glob(".*") if _is_stale(p)] if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in stale]


def _is_stale(path: Path) -> bool:
    if (path / IN_PROGRESS).is_file():
        return True
    return bool(UNMARKED_TEMP.match(path.name)) and path.is_dir() and not any(path.iterdir())


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_manifest(directory: Path) -> None:
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and p.name not in (MANIFEST_FILE, IN_PROGRESS)
    )
    entries = {
        str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in files
    }
    (directory / MANIFEST_FILE).write_text(json.dumps({"files": entries}, indent=1))


def damage(path: Path) -> str | None:
    """What is wrong with a checkpoint directory (a truncated copy, a full disk, a bad sector),
    or None when every file matches its manifest.

    A checkpoint written before rlcli kept manifests is checked for a readable state file only.
    """
    try:
        if not (path / MANIFEST_FILE).is_file():
            json.loads((path / STATE_FILE).read_text())
            return None
        files = json.loads((path / MANIFEST_FILE).read_text())["files"]
        for name, written in files.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            size = file.stat().st_size
            if size != written["size"]:
                return f"{name} holds {size:,} bytes where {written['size']:,} were written"
            if _sha256(file) != written["sha256"]:
                return f"{name} does not match the checksum written with it"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"it cannot be read ({type(err).__name__}: {err})"
    return None


def _tensor_bytes(*values) -> int:
    """Bytes of the tensors in (nested) state dicts, each storage counted once (tied weights)."""
    seen: dict[int, int] = {}

    def visit(value) -> None:
        if isinstance(value, torch.Tensor):
            seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, list | tuple):
            for v in value:
                visit(v)

    for value in values:
        visit(value)
    return sum(seen.values())


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _write_failed(root: Path, step: int, why: str, needed: int) -> CheckpointWriteError:
    free = shutil.disk_usage(root).free if root.exists() else 0
    older = [p.name for p in list_checkpoints(root.parent)]
    kept = (
        f"The older checkpoints ({', '.join(older)}) are intact."
        if older
        else "No earlier checkpoint exists."
    )
    return CheckpointWriteError(
        f"could not write checkpoint step_{step} in {root}: {why}. It needs about "
        f"{_size(needed)} (weights and optimiser state); {_size(free)} is free there. {kept} "
        "Free some space (or keep fewer checkpoints: trainer.keep_last), then run the same "
        "command again: it continues from the newest intact checkpoint."
    )


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    tensors: dict,
    state: dict,
    keep_last: int | None = None,
    extra_models: dict | None = None,
    weights: dict | None = None,
) -> Path:
    """Write `checkpoints/step_{step}` atomically, then keep only the newest `keep_last`.

    `tensors` maps names to state dicts (optimiser, scheduler); `state` is JSON-ready;
    `extra_models` maps sub-directory names to models saved beside the policy (PPO's critic);
    `weights`, when given, is the model's whole state dict (gathered from torchrun's shards).
    """
    root = Path(run_dir) / "checkpoints"
    extras = [m.state_dict() for m in (extra_models or {}).values()]
    needed = _tensor_bytes(model.state_dict() if weights is None else weights, tensors, *extras)
    needed = int(needed * 1.02) + 2**20  # the tokenizer and the JSON files
    try:
        root.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(root).free < needed:
            raise OSError(errno.ENOSPC, "not enough free space to start writing it")
        target = _write_atomically(
            root, step, model, tokenizer, tensors, state, extra_models, weights
        )
    except (OSError, RuntimeError, SafetensorError) as err:  # torch and safetensors wrap OSError
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise _write_failed(root, step, why.strip().splitlines()[0], needed) from None
    if keep_last:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            _remove(old)
    return target


def _as_umask_allows(directory: Path) -> None:
    """mkdtemp makes the directory private (0700) and safetensors its file (0600): give them the
    modes any file the user writes gets, as the umask decides (group-readable by default)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for path in directory.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _write_atomically(root, step, model, tokenizer, tensors, state, extra_models, weights) -> Path:
    target = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}-", dir=root))
    (tmp / IN_PROGRESS).touch()
    try:
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        save_tokenizer(tokenizer, tmp)
        for name, extra in (extra_models or {}).items():
            extra.save_pretrained(tmp / name, safe_serialization=True)
        torch.save(tensors, tmp / TENSORS_FILE)
        # The state file goes last: list_checkpoints counts a directory only when it is there.
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}))
        _write_manifest(tmp)
        _as_umask_allows(tmp)
        if target.exists():
            _remove(target)
        os.replace(tmp, target)
        (target / IN_PROGRESS).unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_tokenizer(tokenizer, directory: Path) -> None:
    """`tokenizer.save_pretrained`, its failures as OSError: the tokenizers library reports a
    full disk as a plain Exception ("No space left on device (os error 28)"), which callers
    that catch the write's OSError would let through as a traceback."""
    try:
        tokenizer.save_pretrained(directory)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - the Rust writer's errors have no finer type
        raise OSError(f"the tokenizer could not be written: {err}") from err


def load_checkpoint(path: Path) -> tuple[dict, dict]:
    """(state, tensors) of a checkpoint directory; tensors are read without unsafe pickle."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
        tensors = torch.load(path / TENSORS_FILE, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: torch's truncated zip
        raise ConfigError(
            f"the checkpoint {path} cannot be read ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Resume from an earlier one "
            "(trainer.resume=PATH/step_N) or start afresh in a new directory."
        ) from None
    return state, tensors


def apply_optimizer_settings(optimizer, t: TrainerConfig, scheduler=None) -> None:
    """Put this command's learning rate and weight decay into a restored optimiser (a state
    dict brings back the saved ones), so a resumed run trains with the values it reports.
    With `scheduler` (its state loaded: the updates done), the rate is this command's schedule
    (`train.run.lr_schedule`) at that point."""
    if scheduler is not None:
        scheduler.base_lrs = [t.lr for _ in optimizer.param_groups]
    for i, group in enumerate(optimizer.param_groups):
        group["weight_decay"] = t.weight_decay
        group["initial_lr"] = t.lr
        factor = scheduler.lr_lambdas[i](scheduler.last_epoch) if scheduler is not None else 1.0
        group["lr"] = t.lr * factor


def read_state(path: Path) -> dict:
    """A checkpoint's trainer_state.json (its step, and the config that wrote it)."""
    return json.loads((path / STATE_FILE).read_text())


def _set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint out of the `step_N` pattern: never resumed, pruned or
    overwritten, and never deleted."""
    kept, n = path.with_name(f"{path.name}.damaged"), 1
    while kept.exists():
        n += 1
        kept = path.with_name(f"{path.name}.damaged-{n}")
    os.replace(path, kept)
    return kept


def newest_sound(run_dir: Path, say: Callable[[str], None], set_aside: bool) -> Path | None:
    """The newest checkpoint of `run_dir` that matches its manifest (None when there is none).
    Each damaged one on the way is named in a line and, when `set_aside`, renamed."""
    found = list_checkpoints(run_dir)
    for path in reversed(found):
        problem = damage(path)
        if problem is None:
            return path
        kept = _set_aside(path) if set_aside else path
        say(
            f"rlcli: warning: checkpoint {path} is damaged: {problem}. It is kept, as {kept}; "
            "the run goes on from the newest sound checkpoint before it."
        )
    if found:
        raise ConfigError(
            f"every checkpoint in {Path(run_dir) / 'checkpoints'} is damaged (the lines above "
            "say how), so there is nothing sound to continue from. Start afresh in a new "
            "directory (hydra.run.dir=...); the damaged checkpoints are kept for inspection."
        )
    return None


def resume_point(
    resume: str | None, run_dir: Path, say: Callable[[str], None] = print, set_aside: bool = True
) -> Path | None:
    """The checkpoint `trainer.resume` names: `auto` is the run directory's newest sound one
    (None when there is none: a fresh start), a path is a checkpoint or a run directory. A
    damaged checkpoint (`damage`) is passed over with a line, and in this run's own
    directory set aside (`set_aside`, on one process only under torchrun)."""
    if resume is None:
        existing = list_checkpoints(run_dir)
        if existing:
            raise ConfigError(
                f"trainer.resume=null but {run_dir} already holds checkpoints (newest: "
                f"{existing[-1].name}); starting over would overwrite them. Continue with "
                "trainer.resume=auto, or write to another directory (hydra.run.dir=...)."
            )
        return None
    if resume == "auto":
        return newest_sound(run_dir, say, set_aside)
    path = Path(resume).expanduser()
    if (path / STATE_FILE).is_file():
        if problem := damage(path):
            raise ConfigError(
                f"trainer.resume={resume}: that checkpoint is damaged: {problem}. Name an "
                "earlier one, or the run directory (its newest sound checkpoint is taken)."
            )
        return path
    if list_checkpoints(path):
        return newest_sound(path, say, set_aside=False)
    raise ConfigError(
        f"trainer.resume={resume} is neither a checkpoint (a directory with {STATE_FILE}) nor "
        "a run directory holding checkpoints/step_N; use trainer.resume=auto (the newest "
        "checkpoint of this run directory), null (start afresh) or such a path."
    )
