"""A roofline model of the learner's step on a GPU, computed on the CPU: predicted H100 and H200
seconds and model FLOP utilisation for a model shape and a configuration of the learner's
levers, with the bytes moved per trained token, the kernels, the matmul FLOPs with recompute,
the GPU syncs and the peak of live memory.

It runs the learner's own code (`train.learner.learn`: passes, the chunked head's log-probs,
`policy_objective`, backward, clipping, fused AdamW) over bfloat16 working weights and float32
masters, as rlcli runs on one GPU, on a model of the shape built from its config under
PyTorch's `FakeTensorMode` (tensors with shapes and no data, so a 1.5B model costs nothing).
A dispatch mode below it records every operator the step issues; each one's time on a card is

    max(FLOPs / matmul rate, bytes read and written / bandwidth, a per-kernel floor)

with attention timed at the rate the card's measured per-layer times imply, and each read of a
value on the host (`.item()`, `float(tensor)`) a sync that leaves the GPU idle for `sync_s`.

    python scripts/roofline.py                       # the ladder: Qwen2.5-1.5B, 16k-token passes
    python scripts/roofline.py --shape 3b            # Qwen2.5-3B's shape
    python scripts/roofline.py --shape 2-layer       # its widths with 2 layers (the test's)

Two things no recording sees, modelled instead: a fused kernel (torch.compile, Liger) is the
element-wise operators between two matrix products or attention calls taken as one kernel that
reads what the chain reads from outside and writes the chain's last output (`fuse`); and the
FSDP wrapper, which rlcli does not put on one rank. What each lever changes is in `LADDER`;
docs/performance.md ("A roofline model of the GPU step") has the ladder and the calibration.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

sys.path.insert(0, str(Path(__file__).parent))
from gpu_check import QWEN25_3B, QWEN25_15B, SMALL, synthetic_batch  # noqa: E402

aten = torch.ops.aten

# Qwen2.5-1.5B's widths and vocabulary with 2 layers: the test's, every per-layer and head
# cost of the full shape at a fourteenth of its operators.
TWO_LAYERS = {**QWEN25_15B, "num_hidden_layers": 2}
SHAPES = {"1.5b": QWEN25_15B, "3b": QWEN25_3B, "2-layer": TWO_LAYERS, "small": SMALL}


@dataclass(frozen=True)
class Card:
    """What the model knows of a GPU: its data-sheet bfloat16 peak (for MFU), the matmul rate
    and copy bandwidth it reaches, and the seconds per layer of attention at the reference
    shape (16 rows of 1,024 tokens, 12 heads of 128, 2 KV heads, forward and backward) with the
    dense shared-prompt mask (sdpa) and with flex_attention's block mask."""

    name: str
    peak: float  # FLOP/s, dense bfloat16, the data sheet's
    matmul: float  # FLOP/s reached by large bfloat16 products
    bandwidth: float  # bytes/s reached by memory-bound kernels
    dense_layer_s: float
    flex_layer_s: float
    kernel_s: float = 4e-6  # the least a kernel takes, launch included
    sync_s: float = 50e-6  # GPU idle per host read: drain, read, launch the next kernels


# H200: the matmul rate, both attention times and the step times below were measured on one
# H200 (docs/performance.md, "One H200, before issue 43"); bandwidth 85% of the 4.8 TB/s data
# sheet. H100 SXM: the same GH100 compute (so the same rates, unmeasured) and 85% of 3.35 TB/s;
# its attention is taken as the H200's, which reads little memory.
CARDS = {
    "H100": Card("H100 SXM", 989e12, 762e12, 0.85 * 3.35e12, 1.59e-3, 0.88e-3),
    "H200": Card("H200", 989e12, 762e12, 0.85 * 4.8e12, 1.59e-3, 0.88e-3),
}
# The FLOPs of one reference layer's attention forward and backward (sdpa's formula).
REFERENCE_ATTENTION = 3.5 * 4 * 16 * 12 * 1024 * 1024 * 128

ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: "forward",
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: "backward",
    aten._scaled_dot_product_flash_attention.default: "forward",
    aten._scaled_dot_product_flash_attention_backward.default: "backward",
    aten._scaled_dot_product_efficient_attention.default: "forward",
    aten._scaled_dot_product_efficient_attention_backward.default: "backward",
}
MATMULS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
# Operators that make no kernel: views, metadata, a fresh tensor's header.
NO_KERNEL = {aten.detach, aten.lift_fresh, aten.alias, aten._unsafe_view, aten.empty_strided,
             aten.empty, aten.lift_fresh_copy}  # fmt: skip


# Operators between two sweeps of the live storages: the peak may count a tensor freed since
# the last sweep, so it errs high.
SWEEP_EVERY = 16


@dataclass
class Op:
    name: str
    kind: str  # matmul, attention, memory
    flops: float
    bytes: float
    reads: list[int] = field(default_factory=list)  # storages read (for `fuse`)
    writes: list[int] = field(default_factory=list)
    # "head" inside the chunked LM head; "batch" on the batch's tables alone (the passes'
    # layout, masks, advantages: nothing compiles them); else "body"
    region: str = "body"


def _bytes(t: torch.Tensor) -> int:
    """The bytes a kernel touches of `t`: its elements, a broadcast dimension counted once."""
    elements = math.prod(s for s, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    return elements * t.element_size()


def _is_real(value) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)


def _storage(t: torch.Tensor) -> int:
    return id(t.untyped_storage())


class Recorder(TorchDispatchMode):
    """Records each operator of the fake step as an `Op`, counts host reads, and keeps the sum
    of live storages' bytes (and its peak). Operators on real tensors only (the batch's
    bookkeeping) run for real; `host` is true where rlcli runs them on the CPU (the passes'
    layout), false where a GPU run would issue them as kernels."""

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []
        self.syncs = 0
        self.host = False
        self.region = "body"
        self.live = self.peak = 0
        self._live: dict[int, torch.UntypedStorage] = {}  # id -> a storage still held
        self._kept: list = []
        self._calls = 0

    def hold(self, tensors) -> None:
        """Count `tensors` (made before recording: weights, masters) as live."""
        for t in tensors:
            self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        # A storage is live while anything but this recorder holds it: its C++ use count,
        # read at each sweep, passes the one reference kept here. (Weak references to fake
        # tensors or storages, with or without a callback, corrupted the heap of the step.)
        # Every storage is kept (a fake one holds no memory), so its id names it alone.
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._live:
            self._kept.append(storage)
            self._live[key] = storage
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)

    def _sweep(self) -> None:
        for key, storage in list(self._live.items()):
            if torch._C._storage_Use_Count(storage._cdata) == 1:  # held here only
                self.live -= storage.nbytes()
                del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            t = args[0]
            self.syncs += not self.host  # a read from the device
            if not isinstance(t, FakeTensor):
                with _disable_current_modes():
                    return func(*args, **kwargs)
            # A fake value has none to read: a made-up one, and the step goes on.
            return True if t.dtype == torch.bool else 1 if not t.dtype.is_floating_point else 0.5
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_fakes = any(isinstance(a, FakeTensor) for a in inputs)
        if not on_fakes:
            with _disable_current_modes():
                out = func(*args, **kwargs)
            if self.host:
                return out
        elif func._schema.is_mutable and _is_real(args[0]):
            # A fake value summed into a real tensor (a loss into its running sum): the real
            # one is left as it is, and the kernel is counted.
            out = args[0]
        else:
            out = func(*args, **kwargs)
        self._calls += 1
        if self._calls % SWEEP_EVERY == 0:
            self._sweep()
        outputs = [a for a in tree_leaves(out) if isinstance(a, torch.Tensor)]
        if not outputs:  # an operator that only writes its arguments (fused AdamW's)
            written = [
                value
                for arg, value in zip(func._schema.arguments, args, strict=False)
                if arg.alias_info is not None and arg.alias_info.is_write
            ]
            outputs = [a for a in tree_leaves(written) if isinstance(a, torch.Tensor)]
        for t in outputs:
            if isinstance(t, FakeTensor):
                self._track(t)
            else:  # a real one (the batch's bookkeeping, small) kept so that its id is its own
                self._kept.append(t.untyped_storage())
        if func.is_view or func._overloadpacket in NO_KERNEL or not outputs:
            return out
        packet = func._overloadpacket
        moved = sum(_bytes(t) for t in inputs) + sum(_bytes(t) for t in outputs)
        reads, writes = [_storage(t) for t in inputs], [_storage(t) for t in outputs]
        kind, flops = "memory", 0.0
        if func in ATTENTION:
            forward = ATTENTION[func] == "forward"
            formula = flop_registry[
                aten._scaled_dot_product_flash_attention
                if forward
                else aten._scaled_dot_product_flash_attention_backward
            ]
            kind, flops = "attention", formula(*args[: 3 if forward else 4], out_val=out)
        elif packet in MATMULS:
            kind, flops = "matmul", flop_registry[packet](*args, **kwargs, out_val=out)
        region = self.region if on_fakes else "batch"
        self.ops.append(Op(func.__name__, kind, flops, moved, reads, writes, region))
        return out


def fuse(ops: list[Op], regions=("body", "head")) -> list[Op]:
    """The element-wise operators between two matrix products or attention calls in `regions`
    as one kernel each (what torch.compile or Liger's kernels do): it reads what the chain
    reads from outside it and writes the chain's last output. An upper bound on fusion's gain:
    a fused kernel that must also write a tensor kept for the backward writes more."""
    fused: list[Op] = []
    chain: list[Op] = []

    def close():
        if not chain:
            return
        made = {s for op in chain for s in op.writes}
        outside = {s for op in chain for s in op.reads if s not in made}
        # Bytes per storage: the largest any op of the chain moved of it, read once.
        size = {}
        for op in chain:
            share = op.bytes / max(len(op.reads) + len(op.writes), 1)
            for s in [*op.reads, *op.writes]:
                size[s] = max(size.get(s, 0.0), share)
        moved = sum(size[s] for s in outside) + sum(size[s] for s in chain[-1].writes)
        region = chain[-1].region
        fused.append(Op("fused", "memory", 0.0, moved, sorted(outside), chain[-1].writes, region))
        chain.clear()

    for op in ops:
        if chain and op.region != chain[-1].region:
            close()
        if op.kind == "memory" and op.region in regions:
            chain.append(op)
        else:
            close()
            fused.append(op)
    close()
    return fused


def op_seconds(op: Op, card: Card, attention: str) -> float:
    if op.kind == "attention":
        per_layer = card.flex_layer_s if attention == "flex" else card.dense_layer_s
        rate = REFERENCE_ATTENTION / per_layer  # FLOP/s the measured layer implies
        return max(op.flops / rate, card.kernel_s)
    compute = op.flops / card.matmul if op.kind == "matmul" else 0.0
    return max(compute, op.bytes / card.bandwidth, card.kernel_s)


@dataclass(frozen=True)
class Setup:
    """The learner's levers, as the model runs them."""

    chunk: str = "device"  # the head's chunks: "device" (CUDA's size) or "cpu" (2^24 logits)
    checkpointing: str = "full"  # what the backward recomputes: none, selective or full
    attention: str = "sdpa"  # sdpa with the dense shared-prompt mask, or flex (its block mask)
    host_layout: bool = True  # passes laid out on the CPU and moved (false: built on the GPU)
    # Element-wise chains as single kernels (modelled: `fuse`) in these regions: "body" (the
    # decoder layers, the loss: trainer.compile's layers), "head" (its compiled chunks).
    fused: tuple[str, ...] = ()


_NEVER_FREED: list = []


def simulate(shape: dict, tokens: int, passes: int, setup: Setup) -> dict:
    """One optimiser step of `learn` over `passes` shared-prompt passes of `tokens` tokens (rows
    of a 256-token prompt and 4 responses of 192; 32 and 24 for the small shape), recorded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcli.ops import logprobs
    from rlcli.runtime.memory import checkpointing_kwargs
    from rlcli.runtime.precision import WorkingWeights
    from rlcli.train import learner as learner_module
    from rlcli.train import passes as passes_module
    from rlcli.train.forward import TokenLogprobModel
    from rlcli.train.learner import UpdatePlan, learn
    from rlcli.train.objective_config import objective_from_config
    from rlcli.validate import compose

    config = AutoConfig.for_model("qwen2", **shape)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        lm = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="sdpa"
        )
    if setup.checkpointing != "none":
        lm.gradient_checkpointing_enable(checkpointing_kwargs(setup.checkpointing))
    lm.train()
    working = WorkingWeights(lm)  # bfloat16 copy over float32 masters, as on one GPU
    model = TokenLogprobModel(working.model)
    with fake:
        optimizer = torch.optim.AdamW(list(lm.parameters()), lr=1e-6, fused=True)
    prompt_len, response_len, group = (32, 24, 4) if shape is SMALL else (256, 192, 4)
    row = prompt_len + group * response_len
    rows = max(tokens // row, 1)
    batch = synthetic_batch(
        shape["vocab_size"], rows * passes, group, prompt_len, response_len, "cpu"
    )
    cfg = compose(["algo=grpo", "algo.beta=0"])
    objective = objective_from_config(cfg.algo, cfg.sampler, norm_len=response_len)
    plan = UpdatePlan(1, 10**6, rows * row, max_grad_norm=1.0)
    recorder = Recorder()
    recorder.hold([*lm.parameters(), *working.model.parameters()])

    real_passes, real_to_device = passes_module.passes, passes_module.to_device

    def passes_on_host(*args, **kwargs):
        # The layout's operators are the host's while the generator runs, up to the move.
        layout = real_passes(*args, **kwargs)
        while True:
            recorder.host = setup.host_layout
            try:
                item = next(layout)
            except StopIteration:
                return
            finally:
                recorder.host = False
            yield item

    def moved(*args, **kwargs):
        out = real_to_device(*args, **kwargs)
        recorder.host = False  # the mask is made on the device
        return out

    real_forward, real_backward = logprobs._ChunkedHead.forward, logprobs._ChunkedHead.backward

    def in_head(method):
        def tagged(*args, **kwargs):
            recorder.region = "head"
            try:
                return method(*args, **kwargs)
            finally:
                recorder.region = "body"

        return staticmethod(tagged)

    logprobs._ChunkedHead.forward = in_head(real_forward)
    logprobs._ChunkedHead.backward = in_head(real_backward)
    # On the CPU device the head would take the CPU's chunks; the model runs the GPU's.
    chunks = dict(logprobs.CHUNK_ELEMENTS)
    if setup.chunk == "device":
        logprobs.CHUNK_ELEMENTS["cpu"] = chunks["cuda"]
    learner_module.passes, passes_module.to_device = passes_on_host, moved
    try:
        with fake, recorder:
            learn(model, optimizer, objective, batch, plan)
    finally:
        learner_module.passes, passes_module.to_device = real_passes, real_to_device
        logprobs.CHUNK_ELEMENTS.update(chunks)
        logprobs._ChunkedHead.forward = staticmethod(real_forward)
        logprobs._ChunkedHead.backward = staticmethod(real_backward)
    # Never freed: freeing the fake model and its optimiser state aborts PyTorch now and then
    # ("corrupted double-linked list"); the process ends without it (`main`).
    _NEVER_FREED.append((lm, working, model, optimizer, fake, recorder))
    params = sum(p.numel() for p in lm.parameters())
    head = lm.get_output_embeddings().weight.numel()
    read, trained = rows * passes * row, rows * passes * group * response_len
    ops = fuse(recorder.ops, setup.fused) if setup.fused else recorder.ops
    return {
        "ops": ops,
        "syncs": recorder.syncs,
        "peak_bytes": recorder.peak,
        "useful_flops": 6 * ((params - head) * read + head * trained),
        "trained_tokens": trained,
        "parameters": params,
    }


def predict(trace: dict, setup: Setup, cards: dict[str, Card] = CARDS) -> dict:
    """The trace's figures, and its seconds and MFU on each card."""
    ops = trace["ops"]
    matmul_flops = sum(op.flops for op in ops if op.kind == "matmul")
    out = {
        "kernels": len(ops),
        "syncs": trace["syncs"],
        "bytes_per_trained_token": round(sum(op.bytes for op in ops) / trace["trained_tokens"]),
        "matmul_tflop": round(matmul_flops / 1e12, 3),
        "peak_gib": round(trace["peak_bytes"] / 2**30, 2),
        "fits_80gb": trace["peak_bytes"] < 80e9,
    }
    for name, card in cards.items():
        by_kind: dict[str, float] = {}
        for op in ops:
            by_kind[op.kind] = by_kind.get(op.kind, 0.0) + op_seconds(op, card, setup.attention)
        by_kind["syncs"] = trace["syncs"] * card.sync_s
        seconds = sum(by_kind.values())
        out[name] = {
            "seconds": round(seconds, 4),
            "mfu": round(trace["useful_flops"] / seconds / card.peak, 4),
            "seconds_by_kind": {k: round(v, 4) for k, v in by_kind.items()},
        }
    return out


# The ladder: each lever on top of the ones before it, in issue 56's order. "before" is rlcli
# as the H200 measured it, less what cannot be undone here (the reads once per step).
LADDER = {
    "before": Setup(chunk="cpu", checkpointing="full", host_layout=False),
    "1 head chunks sized for the GPU": Setup(checkpointing="full", host_layout=False),
    "2 selective recompute": Setup(checkpointing="selective", host_layout=False),
    "3 flex_attention block mask": Setup("device", "selective", "flex", host_layout=False),
    "4 compiled decoder layers": Setup(
        "device", "selective", "flex", host_layout=False, fused=("body",)
    ),
    "5 compiled head chunks": Setup(
        "device", "selective", "flex", host_layout=False, fused=("body", "head")
    ),
    "6 passes laid out on the host": Setup(
        "device", "selective", "flex", True, fused=("body", "head")
    ),
    "no recompute (where it fits)": Setup("device", "none", "flex", True, fused=("body", "head")),
}


def predicted(shape: str, tokens: int, passes: int, setup: Setup, card: dict | None = None) -> dict:
    """`predict(simulate(...))` in a process of its own: a second fake step in one process
    crashed PyTorch (a segmentation fault in the next step's first real operator), as did
    freeing the first one's objects. `card`, a `Card`'s fields (a calibrated one), is
    predicted as "this card" beside CARDS."""
    settings = json.dumps(vars(setup))
    extra = ["--card", json.dumps(card)] if card else []
    done = subprocess.run(
        [sys.executable, __file__, "--shape", shape, "--tokens", str(tokens),
         "--passes", str(passes), "--one", settings, *extra],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"roofline: the step under {settings} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="1.5b")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per pass")
    parser.add_argument("--passes", type=int, default=2, help="passes per optimiser step")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a Setup as JSON: that one alone
    parser.add_argument("--card", help=argparse.SUPPRESS)  # with --one: a calibrated Card
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    tokens = min(args.tokens, 512) if args.shape == "small" else args.tokens
    if args.one:
        settings = json.loads(args.one)
        setup = Setup(**{**settings, "fused": tuple(settings["fused"])})
        cards = {**CARDS, "this card": Card(**json.loads(args.card))} if args.card else CARDS
        trace = simulate(shape, tokens, args.passes, setup)
        print(json.dumps(predict(trace, setup, cards)), flush=True)
        # Out without Python's finalisation: collecting the fake step's objects at exit crashes
        # PyTorch (a segmentation fault while garbage-collecting), after the answer is out.
        os._exit(0)
    results = {
        name: predicted(args.shape, tokens, args.passes, setup) for name, setup in LADDER.items()
    }
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"Qwen2.5 shape {args.shape}, {args.passes} passes of {tokens} tokens a step")
    print("| configuration | H100 s | H100 MFU | H200 s | H200 MFU | bytes/trained token "
          "| kernels | syncs | matmul TFLOP | peak GiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['H100']['seconds']:.3f} | {r['H100']['mfu']:.1%} | "
            f"{r['H200']['seconds']:.3f} | {r['H200']['mfu']:.1%} | "
            f"{r['bytes_per_trained_token'] / 1e6:.1f} MB | {r['kernels']} | {r['syncs']} | "
            f"{r['matmul_tflop']:.1f} | {r['peak_gib']:.1f} |"
        )


if __name__ == "__main__":
    main()
