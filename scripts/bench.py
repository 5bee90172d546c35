"""Training speed: per-phase seconds of `rlcli train` steps, samples/s, tokens/s, peak memory,
and the learner's achieved FLOP/s as a share of this machine's measured matmul peak.

    .venv/bin/python scripts/bench.py                       # GRPO, SmolLM2-135M, 4 x 4 x <=48
    .venv/bin/python scripts/bench.py algo=dapo --steps 6
    .venv/bin/python scripts/bench.py --shape worker       # sampling in a vLLM worker process
    .venv/bin/python scripts/bench.py --shape async        # ... one step ahead of the learner
    torchrun --nproc_per_node 2 scripts/bench.py sampler=hf  # data-parallel

Arguments other than --steps and --warmup are rlcli config overrides. The first `--warmup`
steps (1) are run but not counted: they include one-off costs (compiling, allocator growth).
Peak memory is the process's maximum resident set (CPU) or the largest CUDA allocation (GPU),
read when the run ends, before this script's own probes of the machine.

The FLOP limit is the step's work at this machine's measured matmul peak in the compute dtype:
6 FLOPs per parameter and token for the learner's forward and backward (2 for each extra
forward: reference, old log-probs; LoRA's backward 2), the LM head on response tokens only,
and for sampling 2 per parameter per prompt token (once per prompt: its samples share the
prefill) and per sampled token. Gradient checkpointing's recompute is not counted as work.
Decode is also bound by memory: each decode step of the batch reads every weight once, so
sampling cannot beat (longest response) x (weight bytes) / (measured read bandwidth).
"""

from __future__ import annotations  # noqa: I001 - rlcli before torch, below

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import rlcli  # noqa: F401 - before torch: it sets the CPU allocator's huge pages
import torch

from rlcli.runtime import distributed
from rlcli.runtime.models import compute_dtype
from rlcli.tracking.metrics import read_metrics
from rlcli.train.loop import train
from rlcli.validate import compose

PHASES = ["sample", "reward", "logprobs", "advantages", "learn", "sync", "rollout_wait", "step"]

# Where sampling runs (docs/scaling.md): the engine in the learner's process, one vLLM
# worker process, or that worker generating the next batches while the learner trains.
SHAPES = {
    "colocated": ["sampler=vllm"],
    "worker": ["sampler.workers=1"],
    "async": ["sampler.workers=1", "sampler.max_staleness=1"],
}


def best_seconds(device: torch.device, fn, repeats: int) -> float:
    """The fastest of `repeats` calls of `fn` (after one that warms up), waiting for the GPU."""
    best = float("inf")
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(
    device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 20
) -> float:
    """Best FLOP/s of an n x n matmul on `device`: the ceiling the learner is compared with."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    # Into one product: a fresh one each time costs the allocator's page faults on a CPU.
    product = torch.empty(n, n, device=device, dtype=dtype)
    return 2 * n**3 / best_seconds(device, lambda: torch.matmul(a, b, out=product), repeats)


def read_bandwidth(device: torch.device, gib: float = 0.5, repeats: int = 5) -> float:
    """Best bytes/s of summing a `gib` GiB float32 tensor: how fast the weights can be read."""
    x = torch.ones(int(gib * 2**30) // 4, device=device)
    return x.numel() * 4 / best_seconds(device, x.sum, repeats)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps counted")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first, not counted")
    parser.add_argument("--shape", choices=list(SHAPES), default=None, help="where sampling runs")
    args, overrides = parser.parse_known_args()
    overrides = [*SHAPES.get(args.shape, []), *overrides]
    total = args.warmup + args.steps
    cfg = compose(
        ["logger.progress=false", "trainer.save_every=0", *overrides,
         f"trainer.max_steps={total}"]
    )  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="rlcli-bench-") as run_dir:
        began = time.perf_counter()
        train(cfg, Path(run_dir))
        wall = time.perf_counter() - began
        # Read now: the matmul and bandwidth probes below allocate tensors of their own (the
        # bandwidth one 0.5 GiB), which would otherwise count in the run's peak.
        peak_gib = peak_memory_gib(device)
        every = read_metrics(Path(run_dir))
        rows = every[args.warmup :]
    # Everything outside the steps: loading, the engine's start-up (compiling, with
    # sampler.enforce_eager=false), the final checkpoint.
    outside_steps = wall - sum(r["time/step"] for r in every)
    world = distributed.world_size()
    if distributed.rank() != 0:
        return
    # The learner's matmuls run in the compute dtype (bfloat16 where the device is fast at it).
    compute = compute_dtype(cfg.trainer, device)

    def mean(key: str) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in rows)

    step = mean("time/step")
    samples = cfg.trainer.prompts_per_step * cfg.trainer.group_size
    # Learner FLOPs: a forward costs 2 per parameter per token it reads, a backward twice that;
    # the LM head only runs on response tokens. Forwards: reference (beta > 0), old log-probs
    # (several updates per batch), and one per epoch with its backward.
    body, head, total = _param_counts(cfg)
    tokens, responses = mean("batch/tokens"), mean("response/length_mean") * samples
    # The learner's passes read a group's shared prompt once (trainer.share_prompts).
    read = mean("batch/learner_tokens") or tokens
    forward = 2 * (body * read + head * responses) * world
    forwards = (cfg.algo.beta > 0) + (cfg.trainer.mini_batches * cfg.trainer.epochs > 1)
    # With LoRA the backward computes the activations' gradients only (the frozen weights get
    # none, the adapters' are negligible): one forward's worth, not two.
    update = 2 if cfg.model.lora.rank else 3
    flops = forward * (forwards + update * cfg.trainer.epochs)
    learner_seconds = mean("time/learn") + mean("time/logprobs")
    peak = matmul_peak(device, getattr(torch, compute)) * world
    # Sampling: each prompt's prefill once, then every sampled token through the whole model.
    prompts = cfg.trainer.prompts_per_step * mean("batch/gen_batches")
    prompt_tokens = (tokens - responses) / samples * prompts
    sampled = responses * mean("batch/gen_batches")
    rollout_flops = 2 * (body * prompt_tokens + total * sampled) * world
    step_limit = (flops + rollout_flops) / peak
    # The batch decodes together: its longest response is the number of decode steps, each of
    # which reads all the engine's weights (2 bytes each in bfloat16) at least once.
    weight_bytes = total * getattr(torch, compute).itemsize
    bandwidth = read_bandwidth(device)
    decode_steps = mean("response/length_max") * mean("batch/gen_batches")
    decode_bound = decode_steps * weight_bytes / bandwidth
    rollout_limit = max(rollout_flops / peak, decode_bound)
    report = {
        "steps": len(rows),
        "shape": args.shape or "as configured",
        # The step time's median and range over the counted steps (the mean is seconds/step).
        "step_median_s": round(statistics.median(r["time/step"] for r in rows), 3),
        "step_range_s": [
            round(min(r["time/step"] for r in rows), 3),
            round(max(r["time/step"] for r in rows), 3),
        ],
        "outside_steps_s": round(outside_steps, 1),
        "world_size": world,
        "compute_dtype": compute,
        **{f"seconds/{p}": round(mean(f"time/{p}"), 3) for p in PHASES},
        "samples_per_s": round(samples / step, 2),
        "tokens_per_s": round(mean("throughput/tokens_per_s"), 1),
        "peak_memory_gib": round(peak_gib, 2),
        "learner_gflop_per_s": round(flops / learner_seconds / 1e9, 2),
        "matmul_peak_gflop_per_s": round(peak / 1e9, 2),
        "learner_share_of_peak": round(flops / learner_seconds / peak, 4),
        "learner_padding_frac": round(mean("batch/padding_frac"), 4),
        "step_tflop": round((flops + rollout_flops) / 1e12, 3),
        "step_flop_limit_s": round(step_limit, 3),
        "step_over_flop_limit": round(step / step_limit, 2),
        "rollout_tokens_per_s": round(sampled / mean("time/sample"), 1),
        "memory_read_gb_per_s": round(bandwidth / 1e9, 1),
        "rollout_flop_limit_s": round(rollout_flops / peak, 3),
        "rollout_bandwidth_limit_s": round(decode_bound, 3),
        "rollout_share_of_limit": round(rollout_limit / mean("time/sample"), 4),
        "sync_share_of_step": round(mean("time/sync") / step, 4),
        "reward_mean": round(mean("reward/mean"), 4),
    }
    print(json.dumps(report, indent=1))


def _param_counts(cfg) -> tuple[int, int, int]:
    """(parameters outside the LM head and the input embedding, LM head parameters, all
    parameters) of the policy, read on the meta device (shapes only); a tied embedding counts
    once, as the head."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcli.runtime.models import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(cfg.model, cfg.trainer.seed))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())  # tied weights are listed once
    embedding = 0 if config.tie_word_embeddings else model.get_input_embeddings().weight.numel()
    return total - head - embedding, head, total


if __name__ == "__main__":
    main()
