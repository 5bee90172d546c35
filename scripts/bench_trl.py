"""The same GRPO step in TRL, for comparison with scripts/bench.py: seconds per step and peak
memory of TRL's GRPOTrainer on rlcli's setup (SmolLM2-135M in fp32, the arithmetic prompts,
4 prompts x 4 completions of <= 48 tokens, the math reward, beta 0.04, one update per batch).

    pip install trl                          # not an rlcli dependency; only this script uses it
    .venv/bin/python scripts/bench_trl.py --steps 3
    .venv/bin/python scripts/bench_trl.py --steps 3 --bf16   # bfloat16 autocast, as rlcli
    .venv/bin/python scripts/bench_trl.py --bf16 --prompts 16 --max-new-tokens 256  # bigger

TRL samples with transformers' generate here (no vLLM server on this CPU machine). The first
step is run but not counted, as in scripts/bench.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time

from datasets import Dataset
from transformers import TrainerCallback

from rlcli.data import load_splits
from rlcli.rewards.rules import accuracy
from rlcli.runtime.models import resolve_model_path
from rlcli.validate import compose


class StepTimer(TrainerCallback):
    def __init__(self):
        self.starts, self.seconds = [], []
        self.tokens = self.logged = 0  # completion tokens over the counted steps' logs

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs and state.global_step > 1:
            self.tokens += float(logs["completions/mean_length"]) * args.per_device_train_batch_size
            self.logged += 1

    def on_step_begin(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.starts[-1])


def main() -> None:
    from trl import GRPOConfig, GRPOTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps counted")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (rlcli's default)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (4 samples each)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="response cap")
    args = parser.parse_args()
    cap = [] if args.max_new_tokens is None else [f"sampler.max_new_tokens={args.max_new_tokens}"]
    cfg = compose(["logger.progress=false", *cap])
    train, _ = load_splits(cfg.data)
    prompts = args.prompts
    rows = train[: prompts * (args.steps + 1)]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p.question}], "answer": p.answer} for p in rows]
    )

    def math_reward(completions, answer, **_):
        return [accuracy(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=prompts * 4,  # completions per step
            num_generations=4,
            max_completion_length=cfg.sampler.max_new_tokens,
            learning_rate=cfg.trainer.lr,
            beta=cfg.algo.beta,
            epsilon=cfg.algo.eps_low,
            temperature=cfg.sampler.temperature,
            max_steps=args.steps + 1,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=args.bf16,
            seed=cfg.trainer.seed,
            dataloader_num_workers=0,
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=resolve_model_path(cfg.model, cfg.trainer.seed),
            reward_funcs=math_reward,
            args=config,
            train_dataset=dataset,
            callbacks=[timer],
        )
        trainer.train()
    counted = timer.seconds[1:]
    print(
        json.dumps(
            {
                "steps": len(counted),
                "seconds/step": round(sum(counted) / len(counted), 2),
                "step_median_s": round(statistics.median(counted), 2),
                "completion_tokens_per_step": round(timer.tokens / max(timer.logged, 1), 1),
                "step_seconds": [round(s, 2) for s in counted],
                "peak_memory_gib": round(
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2
                ),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
