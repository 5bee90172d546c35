"""The same GRPO step in TRL, for comparison with scripts/bench.py: seconds per step and peak
memory of TRL's GRPOTrainer on rlcli's setup (SmolLM2-135M in fp32, the arithmetic prompts,
4 prompts x 4 completions of <= 48 tokens, the math reward, beta 0.04, one update per batch).

    pip install trl                          # not an rlcli dependency; only this script uses it
    .venv/bin/python scripts/bench_trl.py --steps 3
    .venv/bin/python scripts/bench_trl.py --steps 3 --bf16   # bfloat16 autocast, as rlcli

TRL samples with transformers' generate here (no vLLM server on this CPU machine). The first
step is run but not counted, as in scripts/bench.py.
"""

from __future__ import annotations

import argparse
import json
import resource
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

    def on_step_begin(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.starts[-1])


def main() -> None:
    from trl import GRPOConfig, GRPOTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps counted")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (rlcli's default)")
    args = parser.parse_args()
    cfg = compose(["logger.progress=false"])
    train, _ = load_splits(cfg.data)
    prompts = 4
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
