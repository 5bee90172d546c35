"""Rollout speed: tokens/s of sampler=vllm and sampler=hf on the same prompts and settings,
and the seconds one weight sync (learner -> engine) takes.

    .venv/bin/python scripts/bench_rollout.py                  # SmolLM2-135M, 4 prompts x 4
    .venv/bin/python scripts/bench_rollout.py model=tiny --repeats 5

Arguments other than --repeats are rlcli config overrides (trainer.prompts_per_step,
trainer.group_size, sampler.max_new_tokens, ...). Each sampler gets one untimed warm-up call.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rlcli.data.problems import render_prompt
from rlcli.rollout.hf import HFSampler
from rlcli.train.run import setup
from rlcli.validate import compose


def timed(fn, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args, overrides = parser.parse_known_args()
    cfg = compose(["algo.beta=0", "logger.progress=false", *overrides, "sampler=vllm"])
    run = setup(cfg)
    t, s = cfg.trainer, cfg.sampler
    problems = run.prompts.take(t.prompts_per_step)
    prompts = [render_prompt(run.tokenizer, p.question, cfg.data.system_prompt) for p in problems]
    ids, answers = [p.id for p in problems], [p.answer for p in problems]
    samplers = {
        "vllm": run.sampler,
        "hf": HFSampler(run.policy, run.tokenizer, s.temperature, s.top_p, s.max_new_tokens),
    }
    print(
        f"model {run.model_path} on {run.device}, {t.prompts_per_step} prompts x "
        f"{t.group_size} samples, <= {s.max_new_tokens} new tokens, {args.repeats} repeats"
    )
    print(f"{'sampler':8} {'tokens/s':>10} {'s/call':>8} {'tokens/call':>12}")
    for name, sampler in samplers.items():
        sampler.sample(prompts, t.group_size, ids, answers)  # warm-up
        tokens = []

        def call(sampler=sampler, tokens=tokens):
            batch = sampler.sample(prompts, t.group_size, ids, answers)
            tokens.append(int(batch.lengths.sum()))

        seconds = timed(call, args.repeats)
        rate = sum(tokens) / sum(seconds)
        print(
            f"{name:8} {rate:10.1f} {statistics.median(seconds):8.2f} "
            f"{sum(tokens) / len(tokens):12.1f}"
        )
    sync = timed(lambda: run.sampler.sync(run.policy), args.repeats)
    params = sum(p.numel() for p in run.policy.parameters()) / 1e6
    print(f"weight sync ({params:.0f}M parameters): {statistics.median(sync):.3f} s (median)")


if __name__ == "__main__":
    main()
