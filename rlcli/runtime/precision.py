"""The learner's bfloat16 working weights over float32 master weights.

Autocast over float32 weights casts every weight to bfloat16 in each forward, again in each
recompute of gradient checkpointing, and casts each weight gradient back: on SmolLM2 on CPU a
forward and backward spent about a quarter of its time in those copies
(`scripts/bench_learner.py`). Mixed-precision trainers (FSDP2's `MixedPrecisionPolicy`,
DeepSpeed's bf16 optimiser) instead run the passes over a bfloat16 copy of the weights and
keep float32 master weights, gradient sums and optimiser state. `WorkingWeights` is that for
one process; under torchrun FSDP2's policy does the same (`distributed.shard`).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn


def _add_to_master(master: nn.Parameter, working: nn.Parameter) -> None:
    """A backward's finished bfloat16 gradient of `working`, summed into `master.grad` in
    float32 (so micro-batches add up in float32) and dropped from the working copy."""
    if master.grad is None:
        master.grad = working.grad.to(master.dtype)
    else:
        master.grad.add_(working.grad)
    working.grad = None


class WorkingWeights:
    """A copy of `master` with its parameters in `dtype` (buffers, such as the rotary
    frequencies, as they are) for the learner's forward and backward passes.

    The gradients land in the master's parameters, in float32, as each backward finishes
    with them; the optimiser, clipping, checkpoints and the weight push to the sampler all see
    the float32 master as without the copy. `refresh()` copies the master's values in: after
    every optimiser step (`follow`)."""

    def __init__(self, master: nn.Module, dtype: torch.dtype = torch.bfloat16):
        params = list(master.parameters())  # each tied parameter once
        # Pre-filled deepcopy memo: the copy gets new parameters in `dtype` in place of the
        # master's (tied ones stay tied) and never holds a second float32 copy.
        memo = {
            id(p): nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad) for p in params
        }
        self.model = copy.deepcopy(master, memo)
        self.pairs = [(memo[id(p)], p) for p in params]
        for working, main in self.pairs:
            if working.requires_grad:
                working.register_post_accumulate_grad_hook(functools.partial(_add_to_master, main))

    @torch.no_grad()
    def refresh(self) -> None:
        for working, main in self.pairs:
            working.copy_(main)

    def follow(self, optimizer: torch.optim.Optimizer) -> None:
        """Refresh after each of `optimizer`'s steps (which update the master)."""
        optimizer.register_step_post_hook(lambda *_: self.refresh())
