"""Whether this CPU multiplies bfloat16 faster than float32: measured once per machine, kept.

A CPU with AMX multiplies bfloat16 several times faster than float32, and one without
AVX512-BF16 emulates it, far slower. Between the two, a CPU with AVX512-BF16 and no AMX can
go either way: on some of this project's machines its bfloat16 matmuls were faster than
float32, on others slower, and the learner's step followed them (docs/performance.md,
"bfloat16 or float32 on a CPU without AMX"). So there rlcli times one matmul of a learner's
shape in each dtype and computes in bfloat16 only if it is not slower. The figures are kept in
the cache, one entry per CPU model, thread count and PyTorch version, so that every process on
a machine (the learner, its ranks, a rollout worker) makes the same choice.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import time
from pathlib import Path

import torch

# A decoder MLP's matmul at a micro-batch of 1,024 tokens (SmolLM2-135M's widths).
_SHAPE = (1024, 576, 1536)


def _cpu_key() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def matmul_gflops(repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of one `_SHAPE` matmul in bfloat16 and in float32, each the best of `repeats`
    timings, taken in turn so that anything else running slows both alike."""
    m, k, n = _SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    # Into a product allocated once: timing the kernel, not the C library's allocation of it.
    pairs = {d: (a.to(d), b.to(d), (a @ b).to(d)) for d in (torch.bfloat16, torch.float32)}
    best = dict.fromkeys(pairs, float("inf"))
    for x, y, product in pairs.values():
        torch.matmul(x, y, out=product)  # the first call sets up the kernel
    for _ in range(repeats):
        for dtype, (x, y, product) in pairs.items():
            began = time.perf_counter()
            torch.matmul(x, y, out=product)
            best[dtype] = min(best[dtype], time.perf_counter() - began)
    flops = 2 * m * k * n
    return {f"{str(d)[6:]}_gflops": round(flops / s / 1e9, 1) for d, s in best.items()}


def speeds(cache: Path) -> dict:
    """This CPU's matmul GFLOP/s in bfloat16 and float32, from `cache` (a JSON file) or
    measured and added to it. A lock beside it makes processes starting together measure once,
    one at a time. A cache that cannot be written only costs a measurement per process."""
    key = _cpu_key()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(cache.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = json.loads(cache.read_text()) if cache.exists() else {}
            if key not in known:
                known[key] = matmul_gflops()
                partial = cache.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(json.dumps(known, indent=1))
                partial.replace(cache)
            return known[key]
    except (OSError, ValueError):  # unwritable cache, or a damaged file: measure here
        return matmul_gflops()


@functools.cache
def cpu_bf16_not_slower(cache: Path) -> bool:
    """Whether this CPU's bfloat16 matmul is at least as fast as its float32 one."""
    found = speeds(cache)
    return found["bfloat16_gflops"] >= found["float32_gflops"]
