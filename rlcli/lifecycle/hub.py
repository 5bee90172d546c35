"""Pushing a finished run's model to the Hugging Face hub (`trainer.push_to_hub=REPO`).

`check_push` runs before any model loads, so a run that could not push (no token, offline
mode, a malformed or empty repo id) fails in seconds, not at the end of hours of training. `push`
uploads the final checkpoint's model files with `huggingface_hub`; when that fails the
checkpoint is on disk and the message says how to push it by hand (`upload_command`) or by
running the command again: a finished run rerun with a push pushes its final checkpoint.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from rlcli.config import ConfigError
from rlcli.lifecycle.checkpoint import MANIFEST_FILE, STATE_FILE, TENSORS_FILE

# What a checkpoint holds for resuming rather than for using the model: not pushed.
TRAINING_STATE = [TENSORS_FILE, STATE_FILE, MANIFEST_FILE, "critic/*", ".rlcli-*"]


def upload_command(repo: str, checkpoint: Path | str) -> str:
    """The `hf upload` command that pushes what `push` would: the model without its training
    state (`hf` takes one pattern per --exclude)."""
    excludes = " ".join(f"--exclude {shlex.quote(pattern)}" for pattern in TRAINING_STATE)
    return f"hf upload {shlex.quote(repo)} {shlex.quote(str(checkpoint))} {excludes}"


def check_push(repo: str) -> None:
    """A ConfigError now for what would make `push(repo)` fail at the end of the run."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not repo.strip():
        raise ConfigError(
            f"trainer.push_to_hub={repo!r} is empty: give the hub repo to push the final model "
            "to (user/name or org/name), or leave it null (the default) to push nothing."
        )
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise ConfigError(
            f"trainer.push_to_hub={repo} is not a hub repo id: {err}. Give user/name or org/name."
        ) from None
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            f"trainer.push_to_hub={repo} but HF_HUB_OFFLINE is set: nothing can be pushed. "
            "Unset it, or drop trainer.push_to_hub and upload the checkpoint later with "
            f"`{upload_command(repo, 'RUN_DIR/checkpoints/step_N')}`."
        )
    if get_token() is None:
        raise ConfigError(
            f"trainer.push_to_hub={repo} needs a Hugging Face token with write access: run "
            "`hf auth login` or set HF_TOKEN, or drop trainer.push_to_hub."
        )


def push(checkpoint: Path, repo: str) -> str:
    """Upload `checkpoint`'s model files to `repo` (created when missing); the commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo,
            folder_path=checkpoint,
            commit_message=f"rlcli: {checkpoint.name} of {checkpoint.parent.parent.name}",
            ignore_patterns=TRAINING_STATE,
        )
    # Whatever the network, the hub or the token did, the run itself is done and saved: one
    # paragraph that says so, never a traceback that hides it.
    except Exception as err:  # noqa: BLE001
        text = str(err).strip()
        first = f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
        raise ConfigError(
            f"trainer.push_to_hub={repo}: the push failed ({first}). The run finished and its "
            f"checkpoint is saved in {checkpoint}; push it later with "
            f"`{upload_command(repo, checkpoint)}`, or run the same command again (a finished "
            "run pushes its final checkpoint)."
        ) from None
    return str(commit.commit_url)
