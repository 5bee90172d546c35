"""How much memory a device has free, what the learner's activations will take of it, and how
much of them to recompute: what `model.gradient_checkpointing=auto` decides by
(`train.run.checkpointing_mode`; docs/performance.md, "What the learner does").

Full checkpointing keeps one layer's activations instead of all of them, for a third more
forward compute (a quarter of a forward and backward's matmuls), which buys nothing where all
of them fit in the memory that is free; selective checkpointing recomputes only the
element-wise work between each layer's products (`KEPT_OPERATORS`).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# Bytes each token keeps per decoder layer for the backward without checkpointing, per unit of
# hidden and intermediate (MLP) width: 16 x (hidden + intermediate). Set above what was
# measured (docs/performance.md, "On a CUDA GPU"): SmolLM2 on CPU 7.9 (0.86 GiB more for 1,536
# tokens), Qwen2.5-1.5B's shape on an H200 12.0 (54 GiB of activations at the peak for
# 16,384-token passes over bfloat16 weights).
BYTES_PER_WIDTH = 16
# The same under selective checkpointing, which keeps the products' outputs in bfloat16:
# 6.4-6.5 measured on the H200 (Qwen2.5-1.5B's and 3B's shapes, 16,384-token passes).
SELECTIVE_BYTES_PER_WIDTH = 8
# With compiled layers (trainer.compile), which keep fewer of the element-wise intermediates:
# 8.4-8.9 without checkpointing and 2.1 with selective measured on the same H200.
COMPILED_BYTES_PER_WIDTH = 10
COMPILED_SELECTIVE_BYTES_PER_WIDTH = 3

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


def activation_bytes(config, tokens: int, selective: bool = False, compiled: bool = False) -> int:
    """What a pass of `tokens` tokens through a transformers model of `config` keeps for its
    backward without checkpointing, or with `selective` checkpointing; fewer where its layers
    are `compiled`."""
    layers = config.num_hidden_layers
    width = config.hidden_size + getattr(config, "intermediate_size", 4 * config.hidden_size)
    per_width = {
        (False, False): BYTES_PER_WIDTH,
        (True, False): SELECTIVE_BYTES_PER_WIDTH,
        (False, True): COMPILED_BYTES_PER_WIDTH,
        (True, True): COMPILED_SELECTIVE_BYTES_PER_WIDTH,
    }[selective, compiled]
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


# glibc's M_MMAP_THRESHOLD (mallopt's parameter number) and the size from which a CPU tensor's
# memory is its own mapping, returned to the system when the tensor is freed.
_M_MMAP_THRESHOLD, OWN_MAPPING_BYTES = -3, 2 * 2**20


def return_freed_tensors(device: torch.device, compute: str) -> None:
    """Where the learner computes in bfloat16 on the CPU, make each tensor of 2 MiB or more its
    own memory mapping, handed back to the system when it is freed. glibc raises that size by
    itself after the first large frees (up to 32 MiB), and freed blocks below it then stay in
    the heap, resident, where later steps' tensors do not always fit, which raised the default
    run's peak. In float32 mapping each tensor afresh cost more time than the memory was worth,
    so float32 runs keep glibc's own size (the figures: docs/performance.md, "Peak memory").
    A no-op on a GPU and where the C library is not glibc."""
    if device.type != "cpu" or compute != "bfloat16":
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, OWN_MAPPING_BYTES)
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator, as it is
        pass
