"""The weight push from a learner to one rollout worker, timed push by push.

    .venv/bin/python scripts/bench_push.py [--pushes 8] [overrides...]
    e.g. scripts/bench_push.py trainer.bf16_autocast=false     # a float32 worker

Starts `rlcli rollout-server` with the overrides (the default model, SmolLM2-135M-Instruct)
under `taskset -c 0`, and a learner in this process on core 1 with one thread
(`sampler.urls=[it]`, the setup's push joining the transfer group), then pushes the
learner's weights `--pushes` times, as a step's `sync` does (paused for `pause?mode=keep` as
with sampler.max_staleness >= 1, though nothing is generating). Prints the dtype the worker
holds and is sent (and how long the first asking took), the bytes of one push, and the median and
range of the push's seconds and of the part of it the worker spends paused (with gloo it
receives the tensors unpaused, and pauses only to load them).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_stream import free_port, start_worker  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=8)
    args, overrides = parser.parse_known_args()
    os.sched_setaffinity(0, {1})
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from rlcli.rollout.workers.client import held_dtype, worker_session
    from rlcli.runtime.lora import sampler_weight_shapes
    from rlcli.train.run import setup
    from rlcli.validate import compose

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        worker = start_worker(overrides, port, Path(tmp) / "worker")
        try:
            url = f"http://127.0.0.1:{port}"
            # The question the setup asks each worker once, timed here where it is first
            # asked (vLLM caches what its answer collects about the machine).
            asked = time.perf_counter()
            held_dtype(worker_session(), url, 60)
            asked = time.perf_counter() - asked
            cfg = compose([*overrides, f"sampler.urls=[{url}]", "sampler.max_staleness=1"])
            run = setup(cfg)
            sampler = run.sampler
            shapes = sampler_weight_shapes(run.policy, sampler.weights.dtype)
            dtype = shapes[0][1]
            sent = sum(math.prod(shape) * d.itemsize for _, d, shape in shapes)
            seconds, paused = [], []
            sampler.client.busy.paused_seconds()  # not the setup's push
            for _ in range(args.pushes):
                start = time.perf_counter()
                sampler.sync(run.policy)
                seconds.append(time.perf_counter() - start)
                paused.append(sampler.client.busy.paused_seconds())  # rollout/paused_s's clock
            sampler.close()
        finally:
            worker.terminate()
            worker.wait(60)
    held = str(dtype).removeprefix("torch.")
    print(f"worker holds {held} (asking it first took {asked:.2f} s)")
    print(f"one push sends {sent / 1e6:.0f} MB")
    for what, values in (("push", seconds), ("paused", paused)):
        print(
            f"{what} s over {args.pushes}: median {statistics.median(values):.3f} "
            f"({min(values):.3f}-{max(values):.3f}); each: " + ", ".join(f"{s:.3f}" for s in values)
        )


if __name__ == "__main__":
    main()
