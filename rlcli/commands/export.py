"""`rlcli export CHECKPOINT OUT_DIR`: a checkpoint as one plain Hugging Face model directory.

A LoRA run's checkpoints hold only the adapters (PEFT format); export merges them into the
base model they name, so that transformers, vLLM, `rlcli eval` or the hub take the result as
any model. A full fine-tuning checkpoint is written without its optimiser and run state.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
from pathlib import Path

from safetensors import SafetensorError

from rlcli.config import ConfigError
from rlcli.lifecycle.checkpoint import STATE_FILE, checkpoint_at, damage
from rlcli.runtime.lora import base_model_path, export_merged, is_adapter_dir


def _checkpoint(path: Path) -> Path:
    """`path` itself when it is a checkpoint, else the newest one of a run directory."""
    found = checkpoint_at(path)
    if found is None:
        raise ConfigError(
            f"{path} is neither a checkpoint (a directory with adapter_config.json or "
            "config.json) nor a run directory holding checkpoints/step_N."
        )
    return found


def export_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="rlcli export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="checkpoints/step_N, or a run directory")
    parser.add_argument("out", type=Path, help="a new (or empty) directory to write")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="dtype of the written weights (default float32, as training keeps them)",
    )
    args = parser.parse_args(argv)
    source = _checkpoint(args.checkpoint.expanduser())
    # A checkpoint of rlcli's is checked against its manifest; a plain model directory is not.
    if (source / STATE_FILE).is_file() and (problem := damage(source)):
        raise ConfigError(f"the checkpoint {source} is damaged: {problem}. Export another one.")
    out = args.out.expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"{out} already holds files; export writes into a new or empty directory, so "
            "nothing there is overwritten. Name another one."
        )
    if is_adapter_dir(source):
        base = base_model_path(source)
        if not Path(base).is_dir():
            raise ConfigError(
                f"{source} holds LoRA adapters for the base model {base}, which is not on this "
                "machine: export where the run was trained, or put the base model there."
            )
    made = not out.exists()
    try:
        # Made before the (slow) merge, so that a place nothing can be written to (/proc,
        # /sys, a read-only disk) is named at once.
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(_unwritable(out, err)) from None
    if is_adapter_dir(source):
        print(f"rlcli: merging the LoRA adapters of {source} into {base} ...")
    _no_progress_bars()
    try:
        export_merged(source, out, args.dtype)
    # Whatever stops it midway leaves no half-written model behind: a full disk is an OSError
    # from torch, a SafetensorError, or a plain Exception from the tokenizers library (its
    # tokenizer.json cut short beside a complete model.safetensors); Ctrl-C as well.
    except BaseException as err:
        _remove_written(out, made)
        if not isinstance(err, Exception):
            raise
        raise ConfigError(_unwritable(out, err)) from None
    print(f"rlcli: wrote a Hugging Face model to {out} (load it with model.path={out})")


def _no_progress_bars() -> None:
    """transformers and the hub draw a bar for every load and write ("Loading weights",
    "Writing model shards"); rlcli's lines say what is done (off for the rest of the command)."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()


def _remove_written(out: Path, made: bool) -> None:
    """What a failed export wrote: `out` itself when it made it, else what it put in it (it was
    empty before)."""
    with contextlib.suppress(OSError):
        if made:
            shutil.rmtree(out)
            return
        for path in list(out.iterdir()):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def _unwritable(out: Path, err: Exception) -> str:
    what = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, OSError) and err.strerror and err.filename:
        what = f"{err.strerror} ({err.filename})"
    # The tokenizers library's errors carry the OS's words ("... (os error 28)"), not a type.
    if not isinstance(err, OSError | SafetensorError) and "os error" not in what:
        return (
            f"the export to {out} failed: {type(err).__name__}: {what}. Nothing was exported "
            "and the checkpoint is unchanged."
        )
    return (
        f"{out} cannot be written: {what}. Nothing was exported and the checkpoint is "
        "unchanged; name a directory on a writable disk with room for the model."
    )
