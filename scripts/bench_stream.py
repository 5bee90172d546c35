"""Where each second of a step goes with one rollout worker and one learner, for several
sampler.max_staleness values, each side pinned to a core of its own.

    .venv/bin/python scripts/bench_stream.py                      # max_staleness 0 1 2 4
    .venv/bin/python scripts/bench_stream.py --staleness 0 2 --steps 6 sampler.max_new_tokens=96

On two cores overlap is invisible unless the sides have a core each: the worker is
`rlcli rollout-server` under `taskset -c 0` and the learner `rlcli train sampler.urls=[it]`
under `taskset -c 1` with one OpenMP thread; one worker serves every run of the sitting (each
run's first push gives it that run's weights). Arguments other than the flags are rlcli
overrides for both. Per run, over `--steps` steps after the first `--warmup` (a run streaming
k ahead runs k more, not counted: the worker idles through them): the step's median
and range; the worker's share of the time generating (rollout/generating_share); the
learner's share computing (log-probs, rewards, advantages, update), waiting for a batch
(time/sample: for max_staleness 0 the whole sampling, otherwise the wait for a batch
sampled ahead) and pushing (time/sync); response tokens per second, per step and over the
counted steps together; the seconds a step the worker was paused for the push
(rollout/paused_s); and the step time the model of scripts/step_time.py predicts from the
synchronous run's phases and, streamed, that run's pauses.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from step_time import step_seconds  # noqa: E402

from rlcli.tracking.metrics import read_metrics  # noqa: E402

RLCLI = [sys.executable, "-m", "rlcli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(overrides: list[str], port: int, run_dir: Path) -> subprocess.Popen:
    cmd = ["taskset", "-c", "0", *RLCLI, "rollout-server", *overrides,
           f"sampler.serve_port={port}", f"hydra.run.dir={run_dir}"]  # fmt: skip
    log = open(run_dir.with_suffix(".log"), "w")  # noqa: SIM115 - open while it runs
    worker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker ended; see {log.name}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).ok:
                return worker
        except requests.RequestException:
            pass
        time.sleep(2)
    raise SystemExit(f"the worker did not start in 900 s; see {log.name}")


def train(overrides: list[str], url: str, staleness: int, steps: int, run_dir: Path) -> list[dict]:
    cmd = ["taskset", "-c", "1", *RLCLI, "train", *overrides, f"sampler.urls=[{url}]",
           f"sampler.max_staleness={staleness}", f"trainer.max_steps={steps}",
           "trainer.save_every=0", "logger.progress=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"rlcli train failed:\n{done.stderr[-3000:]}")
    return read_metrics(run_dir)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def share(rows: list[dict], key) -> str:
    return f"{statistics.median(key(r) for r in rows):.0%}"


def whole_run(rows: list[dict]) -> float:
    """Response tokens per second over the counted steps together: their tokens over their
    time (the steps' own rates vary with their responses' lengths)."""
    tokens = sum(r["throughput/tokens_per_s"] * r["time/step"] for r in rows)
    return tokens / sum(r["time/step"] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        worker = start_worker(overrides, port, Path(tmp) / "worker")
        try:
            # Counted: the steps after the warm-up, less the last k of a run streaming k ahead
            # (no rounds are asked for past the run's end, so the worker idles through them).
            total = args.steps + args.warmup
            runs = {
                k: train(overrides, f"http://127.0.0.1:{port}", k, total + k,
                         Path(tmp) / f"s{k}")[args.warmup : total]
                for k in args.staleness
            }  # fmt: skip
        finally:
            worker.terminate()
            worker.wait(60)

    def computing(r):  # the learner's work apart from sampling and the push
        return r["time/step"] - r["time/sample"] - r["time/sync"]

    sync = runs.get(0)
    if sync is not None:
        generate = statistics.median(r["time/sample"] for r in sync)
        learn = statistics.median(computing(r) for r in sync)
        push = statistics.median(r["time/sync"] for r in sync)
        print(f"measured apart (max_staleness=0): generate {generate:.2f} s, learn {learn:.2f} s,"
              f" push {push:.2f} s")  # fmt: skip
    print("| max_staleness | step s | predicted s | worker generating | worker paused s "
          "| learner computing | learner waiting | pushing | tokens/s, per step "
          "| tokens/s, whole run |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, rows in runs.items():
        # A streamed run's own pauses: the part of a push that stops generation.
        paused = statistics.median(r["rollout/paused_s"] for r in rows)
        predicted = (
            f"{step_seconds(generate, learn, push, k, paused):.2f}" if sync is not None else "-"
        )
        print(
            f"| {k} | {spread([r['time/step'] for r in rows])} | {predicted} "
            f"| {share(rows, lambda r: r['rollout/generating_share'])} | {paused:.2f} "
            f"| {share(rows, lambda r: computing(r) / r['time/step'])} "
            f"| {share(rows, lambda r: r['time/sample'] / r['time/step'])} "
            f"| {share(rows, lambda r: r['time/sync'] / r['time/step'])} "
            f"| {spread([r['throughput/tokens_per_s'] for r in rows])} | {whole_run(rows):.1f} |"
        )


if __name__ == "__main__":
    main()
