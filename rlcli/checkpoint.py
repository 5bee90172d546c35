"""Checkpoints: `checkpoints/step_N/` holds a Hugging Face model directory (loadable by
transformers and vLLM), the tokenizer, the optimiser state and the trainer state.

A checkpoint is written to a temporary sibling and renamed into place, so a crash while
saving never leaves a half-written `step_N` behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer, state: dict) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=1))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
