"""Data parallelism under torchrun: who this process is, sharding, and reductions.

`torchrun --nproc_per_node N -m rlcli train ...` starts N ranks. Each samples and scores its
own share of the step's prompts with its own rollout engine, and the learner is one model
sharded across the ranks with FSDP2 (`shard`; NCCL on CUDA, gloo on CPU), each rank's loss its
share of the global loss, so that a step equals one process's on the whole batch
(docs/scaling.md, "torchrun: several processes, FSDP2"). Outside torchrun (no WORLD_SIZE in the
environment) every helper is the identity, so the single-process code path is the distributed
one with one rank.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """The rank that logs and writes checkpoints."""
    return rank() == 0


def init(device: torch.device) -> torch.device:
    """Join the process group torchrun set up; returns this rank's device."""
    if world_size() == 1 or dist.is_initialized():
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(minutes=30))
    return device


def shutdown() -> None:
    """Leave torchrun's process group, once every rank is done with it. Outside torchrun
    nothing: the default group there, if any, is the in-process vLLM engine's own."""
    if world_size() > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def end_process(code: int) -> NoReturn:
    """End a torchrun rank with exit code `code`, skipping Python's finalisation.

    A gloo worker thread can still hold the last reference to a finished collective (FSDP's
    all-gathers) whose tensors belong to Python objects. Freed while the interpreter is
    being finalised, it tries to take the GIL, and the process aborts ("terminate called
    without an active exception", SIGABRT) after the run has finished: 6 in 120 two-rank
    steps here when the CPU was busy. By the time this is called every file is written."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shard(wrapped: nn.Module, lm: nn.Module, param_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard `lm` across the ranks (each decoder layer), then `wrapped`, the module around it
    that the learner calls (`train.forward.TokenLogprobModel`, whose `warm_up()` runs a first
    forward), as the root; `lm`'s parameters become shards (DTensors) of the same names, in
    place. With `param_dtype` (bfloat16) the gathered weights the passes run over are in that
    dtype and the gradients are reduced and kept in float32, the shards' own dtype (FSDP2's
    mixed precision). Returns `wrapped`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layer_types = tuple(
        type(m) for m in lm.modules() if type(m).__name__ in (lm._no_split_modules or [])
    )
    for module in lm.modules():
        if isinstance(module, layer_types):
            fully_shard(module, mp_policy=policy)
    fully_shard(wrapped, mp_policy=policy)
    # Each rank's loss is already its share of the global loss (divided by the global token
    # count), so gradients are summed over the ranks, not averaged as FSDP would by default.
    for module in wrapped.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            # A plain SUM: gloo has no pre-multiplied sum, which the factor would use.
            module.set_force_sum_reduction_for_comms(True)
    # FSDP2 sets itself up on the first forward, which must go through the root: transformers'
    # generate would reach the layers first and make each its own root.
    with torch.no_grad():
        wrapped.warm_up()
    # The root keeps its weights gathered after a forward; the optimiser must see its shards.
    wrapped.reshard()
    return wrapped


@contextmanager
def gathered(root: nn.Module):
    """The sharded root's own parameters (embeddings, final norm, LM head) whole, for code
    that calls the LM outside the root's forward (transformers' generate); the decoder layers,
    sharded on their own, gather themselves in their forward."""
    if not hasattr(root, "unshard"):  # not sharded
        yield
        return
    root.unshard()
    try:
        yield
    finally:
        root.reshard()


def full_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of every parameter in turn, each gathered from its shards only when
    it is reached (a collective: every rank must iterate), so a sharded model is never held
    whole: at most one gathered parameter beside the shards."""
    for name, param in model.named_parameters():
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):  # a DTensor shard
            tensor = tensor.full_tensor()
        yield name, tensor


def full_weights(root: nn.Module) -> dict:
    """The LM's state dict gathered whole on rank 0 (on CPU; other ranks get an empty dict),
    for saving. `root` is `shard`'s result: the LM's keys lose its `lm.`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # The root stays gathered after a forward without backward (sampling, old log-probs); its
    # registered parameters must be the sharded ones the optimiser holds.
    root.reshard()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(root, options=options)
    return {name.removeprefix("lm."): tensor for name, tensor in weights.items()}


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    """The optimiser's state whole (on CPU), keyed by parameter name as in the LM's own state
    dict (no `lm.`), whatever the number of ranks: what a run on any other number resumes
    from (`load_optimizer_state`). Under torchrun rank 0 alone gets it (the others, empty);
    `model` is `shard`'s result there, else the module holding the optimiser's parameters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    if world_size() > 1:
        model.reshard()  # its registered parameters must be the shards the optimiser holds
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return _renamed(get_optimizer_state_dict(model, optimizer, options=options), "lm.", "")


def load_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """Put a whole optimiser state, saved by any number of ranks, into `optimizer` on this
    one's (sharding it where `model` is sharded). Also reads the two layouts checkpoints had
    before: one process's (parameters numbered) and torchrun's (names with the root's `lm.`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _names_in_order(model, optimizer)
    if any(isinstance(i, int) for g in state["param_groups"] for i in g["params"]):
        # One process's, before: the parameters numbered in the optimiser's order.
        number = {index: names[index] for index in range(len(names))}
        state = {
            "state": {number[int(k)]: v for k, v in state["state"].items()},
            "param_groups": [
                {**g, "params": [number[int(i)] for i in g["params"]]}
                for g in state["param_groups"]
            ],
        }
    state = _renamed(state, "lm.", "")
    prefix = "lm." if names and names[0].startswith("lm.") else ""
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, _renamed(state, "", prefix), options=options)


def _names_in_order(model: nn.Module, optimizer) -> list[str]:
    """The names in `model` of the optimiser's parameters, in the optimiser's order."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _renamed(state: dict, old: str, new: str) -> dict:
    """An optimiser state dict whose parameter names start with `new` instead of `old`."""

    def rename(name: str) -> str:
        return new + name.removeprefix(old) if name.startswith(old) else name

    if not state:  # a rank other than 0 gets nothing of a gathered state
        return state
    return {
        "state": {rename(k): v for k, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [rename(n) for n in g["params"]]} for g in state["param_groups"]
        ],
    }


def all_sum(value: float) -> float:
    """`value` summed over the ranks."""
    if world_size() == 1:
        return value
    tensor = _on_backend(torch.tensor([float(value)], dtype=torch.float64))
    dist.all_reduce(tensor)
    return float(tensor)


def all_max(value: int) -> int:
    if world_size() == 1:
        return value
    tensor = _on_backend(torch.tensor([value], dtype=torch.int64))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor)


def _on_backend(tensor: torch.Tensor) -> torch.Tensor:
    # NCCL reduces only CUDA tensors; gloo only CPU ones.
    return tensor.cuda() if dist.get_backend() == "nccl" else tensor


def mean_metrics(metrics: dict) -> dict:
    """Each numeric metric averaged over the ranks; times are the slowest rank's, maxima the
    largest, throughput and token counts the sum; other values are rank 0's."""
    if world_size() == 1:
        return metrics
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, metrics)
    out = dict(metrics)
    for key, value in metrics.items():
        if key == "step" or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        values = [m[key] for m in gathered if isinstance(m.get(key), int | float)]
        if key.startswith("time/") or key.endswith("_max"):
            out[key] = max(values)
        elif key.startswith("throughput/") or key == "batch/tokens":
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def all_ranks(value) -> list:
    """Every rank's `value` (any picklable object), in rank order, on every rank."""
    if world_size() == 1:
        return [value]
    out: list = [None] * world_size()
    dist.all_gather_object(out, value)
    return out


def from_main(value):
    """Rank 0's `value` on every rank (any picklable object); `value` itself in one process."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
