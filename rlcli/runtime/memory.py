"""How much memory a device has free, and what the learner's activations will take of it:
what `model.gradient_checkpointing=auto` decides by (`train.run.checkpointing_wanted`).

Checkpointing keeps one layer's activations instead of all of them for a third more forward
compute (a quarter of a forward and backward's matmuls): where the activations of the
largest pass fit in the memory that is free, recomputing them only costs time.
"""

from __future__ import annotations

import torch

# Bytes each token keeps per decoder layer for the backward without checkpointing, per unit of
# hidden and intermediate (MLP) width: 16 x (hidden + intermediate). Set above what was
# measured: SmolLM2 on CPU kept 0.86 GiB more for 1,536 tokens (30 layers; 20 kB per token and
# layer against 34 kB here), Qwen2.5-1.5B's shape on an H200 63 GiB more for 16,384 tokens
# (28 layers; 147 kB against 168 kB), docs/performance.md.
BYTES_PER_WIDTH = 16


def activation_bytes(config, tokens: int) -> int:
    """What a pass of `tokens` tokens through a transformers model of `config` keeps for its
    backward without checkpointing."""
    layers = config.num_hidden_layers
    width = config.hidden_size + getattr(config, "intermediate_size", 4 * config.hidden_size)
    return BYTES_PER_WIDTH * width * layers * tokens


def free_bytes(device: torch.device) -> int:
    """Memory free on `device` now: the GPU's (with what PyTorch's allocator holds unused), or
    the machine's available RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    import psutil

    return psutil.virtual_memory().available
