"""Held-out evaluation: greedy accuracy and pass@k (`rlcli eval`, `trainer.eval_every`).

- accuracy: one greedy reply (temperature 0) per held-out problem, correct when its reward is
  above `eval.correct_above`;
- pass@k: `eval.k` replies per problem at `eval.temperature`, scored the same way, and the
  unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with c correct of n samples,
  pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems, for k = 1, 2, 4, ... up to n.

Evaluation draws from its own seed, so evaluating during training leaves the training
samples as they would have been without it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from rlcli.config import Config, EvalConfig
from rlcli.data import Problem, load_splits
from rlcli.scoring import Scorer

# Evaluation's seed offset from trainer.seed, far from the training stream's call counts.
EVAL_SEED = 7_777_777


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k of the n samples is correct, c of them being so."""
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(k):  # C(n-c, k) / C(n, k) as a product, without huge factorials
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss


def pass_at_ks(correct: torch.Tensor) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, ... up to n, from correct [P, n] bool."""
    n = correct.shape[1]
    counts = correct.sum(-1).tolist()
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    return {f"pass@{k}": sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks}


def evaluate(
    sampler, scorer: Scorer, tokenizer, problems: list[Problem], cfg: EvalConfig,
    system_prompt: str | None, seed: int, progress: bool = False,
) -> dict[str, float]:  # fmt: skip
    """Greedy accuracy and pass@k of the sampler's current weights on `problems`."""
    from rlcli.trainer import sample_and_score

    problems = problems[: cfg.max_problems] if cfg.max_problems else problems
    greedy, sampled = [], []
    bar = tqdm(total=len(problems), desc="eval", unit="problem", disable=not progress)
    for start in range(0, len(problems), cfg.prompts_per_batch):
        chunk = problems[start : start + cfg.prompts_per_batch]
        call = dict(sampler=sampler, scorer=scorer, tokenizer=tokenizer, problems=chunk)
        _, scores = sample_and_score(
            **call, group=1, system_prompt=system_prompt, temperature=0.0, seed=seed + start
        )
        greedy.append(scores.total > cfg.correct_above)
        _, scores = sample_and_score(
            **call, group=cfg.k, system_prompt=system_prompt, temperature=cfg.temperature,
            seed=seed + start + 1,
        )  # fmt: skip
        sampled.append((scores.total > cfg.correct_above).view(len(chunk), cfg.k))
        bar.update(len(chunk))
        bar.set_postfix(accuracy=f"{torch.cat(greedy).float().mean():.3f}")
    bar.close()
    return {
        "accuracy": torch.cat(greedy).float().mean().item(),
        **pass_at_ks(torch.cat(sampled)),
    }


def evaluate_model(cfg: Config, run_dir: Path) -> dict:
    """`rlcli eval`: evaluate the configured model on the held-out split; write eval.json."""
    from rlcli.trainer import frozen_sampling, seed_everything

    t = cfg.trainer
    seed_everything(t.seed)
    _, test = load_splits(cfg.data)
    if not test:
        from rlcli.config import ConfigError

        raise ConfigError(
            f"data={cfg.data.name} has no held-out problems to evaluate on: set "
            "data.num_test (or data.test_path)."
        )
    scorer, model_path, tokenizer, sampler = frozen_sampling(cfg, test)
    n = min(len(test), cfg.eval.max_problems or len(test))
    print(f"rlcli: evaluating {model_path} on {n} held-out problems of data={cfg.data.name}")
    start = time.perf_counter()
    results = evaluate(
        sampler, scorer, tokenizer, test, cfg.eval, cfg.data.system_prompt,
        t.seed + EVAL_SEED, progress=cfg.logger.progress,
    )  # fmt: skip
    report = {
        "model": model_path,
        "data": cfg.data.name,
        "reward": cfg.reward.name,
        "problems": n,
        **results,
        "k": cfg.eval.k,
        "temperature": cfg.eval.temperature,
        "correct_above": cfg.eval.correct_above,
        "time_s": time.perf_counter() - start,
    }
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    passes = ", ".join(f"{k} {v:.3f}" for k, v in results.items() if k.startswith("pass@"))
    print(f"rlcli: accuracy {results['accuracy']:.3f} (greedy); {passes}")
    print(f"rlcli: wrote {run_dir / 'eval.json'}")
    return report
