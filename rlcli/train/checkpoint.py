"""Checkpoints: `checkpoints/step_N/` holds everything a run needs to continue exactly.

- the policy as a Hugging Face directory (`model.safetensors`, config, tokenizer), which
  transformers and vLLM load as any model;
- `optimizer.pt`: optimiser and scheduler state dicts (tensors, numbers and lists only, read
  back with `torch.load(weights_only=True)`, which refuses arbitrary pickled objects);
- `trainer_state.json`: the step, data position, RNG states, DCPO's SAS state, the KL
  controller's beta and whatever else the loop keeps between steps.

A checkpoint is written into a hidden temporary sibling and renamed into place, so `step_N`
exists only once it is complete; a run killed while saving leaves a `.step_N-*` directory that
the next resume removes. Old checkpoints are pruned the same way (renamed, then deleted).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from rlcli.config import ConfigError

STATE_FILE = "trainer_state.json"
TENSORS_FILE = "optimizer.pt"
STEP_DIR = re.compile(r"^step_(\d+)$")


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


def _remove(path: Path) -> None:
    """Delete a directory so that no half-deleted `step_N` can be mistaken for a checkpoint."""
    doomed = path.with_name(f".deleting-{path.name}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_incomplete(run_dir: Path) -> list[str]:
    """Delete the temporary directories of checkpoints whose writing was interrupted."""
    root = Path(run_dir) / "checkpoints"
    stale = [p for p in root.glob(".*") if p.is_dir()] if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in stale]


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
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}-", dir=root))
    try:
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, extra in (extra_models or {}).items():
            extra.save_pretrained(tmp / name, safe_serialization=True)
        torch.save(tensors, tmp / TENSORS_FILE)
        # The state file goes last: list_checkpoints counts a directory only when it is there.
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}))
        if target.exists():
            _remove(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if keep_last:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            _remove(old)
    return target


def load_checkpoint(path: Path) -> tuple[dict, dict]:
    """(state, tensors) of a checkpoint directory; tensors are read without unsafe pickle."""
    state = json.loads((path / STATE_FILE).read_text())
    tensors = torch.load(path / TENSORS_FILE, map_location="cpu", weights_only=True)
    return state, tensors


def resume_point(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint `trainer.resume` names: `auto` is the run directory's newest complete one
    (None when there is none: a fresh start), a path is a checkpoint or a run directory."""
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
        found = list_checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if (path / STATE_FILE).is_file():
        return path
    found = list_checkpoints(path)
    if found:
        return found[-1]
    raise ConfigError(
        f"trainer.resume={resume} is neither a checkpoint (a directory with {STATE_FILE}) nor "
        "a run directory holding checkpoints/step_N; use trainer.resume=auto (the newest "
        "checkpoint of this run directory), null (start afresh) or such a path."
    )
