"""How much memory a device has free, what the learner's activations will take of it, and how
much of them to recompute: what `model.gradient_checkpointing=auto` decides by
(`train.run.checkpointing_mode`; docs/performance.md, "What the learner does").

Full checkpointing keeps one layer's activations instead of all of them, for a third more
forward compute (a quarter of a forward and backward's matmuls), which buys nothing where all
of them fit in the memory that is free; selective checkpointing recomputes only the
element-wise work between each layer's products (`KEPT_OPERATORS`).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# Bytes each token keeps per decoder layer for the backward without checkpointing, per unit of
# hidden and intermediate (MLP) width: 16 x (hidden + intermediate). Set above what was
# measured: SmolLM2 on CPU kept 0.86 GiB more for 1,536 tokens (30 layers; 20 kB per token and
# layer against 34 kB here), Qwen2.5-1.5B's shape on an H200 63 GiB more for 16,384 tokens
# (28 layers; 147 kB against 168 kB), docs/performance.md.
BYTES_PER_WIDTH = 16
# The same under selective checkpointing, which keeps the products' outputs in bfloat16: at
# Qwen2.5-1.5B's shape 42 kB per token and layer by this rule, 35 kB in scripts/roofline.py's
# count of the live tensors (40.8 against 25.9 GiB of peak for 16,384-token passes).
SELECTIVE_BYTES_PER_WIDTH = 4

# The operators whose outputs selective checkpointing keeps: the linear layers' products and
# the fused attention kernels (sdpa's, on CUDA and the CPU). Not `bmm`: eager attention's
# scores are [heads, L, L] per row, which are recomputed rather than kept. The element-wise work
# between them (norms, rotary, SiLU, residual adds) is recomputed, for about a third of the
# memory of keeping everything.
_aten = torch.ops.aten
KEPT_OPERATORS = frozenset(
    (
        _aten.mm.default,
        _aten.addmm.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
    )
)


def activation_bytes(config, tokens: int, selective: bool = False) -> int:
    """What a pass of `tokens` tokens through a transformers model of `config` keeps for its
    backward without checkpointing, or with `selective` checkpointing."""
    layers = config.num_hidden_layers
    width = config.hidden_size + getattr(config, "intermediate_size", 4 * config.hidden_size)
    per_width = SELECTIVE_BYTES_PER_WIDTH if selective else BYTES_PER_WIDTH
    return per_width * width * layers * tokens


def _keep_products(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPERATORS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpointing_kwargs(mode: str) -> dict:
    """transformers' `gradient_checkpointing_enable` arguments for `mode`, "full" or
    "selective". Non-reentrant: a LoRA model's frozen embeddings would leave reentrant
    checkpoints no gradient, and selective checkpointing needs it."""
    kwargs: dict = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _keep_products
        )
    return kwargs


def free_bytes(device: torch.device) -> int:
    """Memory free on `device` now: the GPU's (with what PyTorch's allocator holds unused), or
    the machine's available RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    import psutil

    return psutil.virtual_memory().available
