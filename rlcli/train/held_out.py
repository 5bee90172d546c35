"""Held-out evaluation: greedy accuracy and pass@k (`rlcli eval`, `trainer.eval_every`).

- accuracy: one greedy reply (temperature 0) per held-out problem, correct when its reward is
  above `eval.correct_above`;
- pass@k: `eval.k` replies per problem at `eval.temperature` and `eval.top_p`, scored the
  same way, and the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with c correct of
  n samples, pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems, for k = 1, 2, 4, ...
  up to n;
- tool_call_rate (env=...): the share of greedy episodes that called a tool.

Evaluation draws from its own seed, so evaluating during training leaves the training
samples as they would have been without it.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from rlcli.config import EvalConfig
from rlcli.data.problems import Problem
from rlcli.rewards.sampling import scored_chunks
from rlcli.rewards.scorer import Scorer
from rlcli.rollout.samplers import Sampler

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
    sampler: Sampler,
    scorer: Scorer,
    tokenizer,
    problems: list[Problem],
    cfg: EvalConfig,
    system_prompt: str | None,
    seed: int,
    progress: bool = False,
) -> dict[str, float]:
    """Greedy accuracy and pass@k of the sampler's current weights on `problems`."""
    problems = problems[: cfg.max_problems] if cfg.max_problems else problems
    each = dict(
        sampler=sampler,
        scorer=scorer,
        tokenizer=tokenizer,
        problems=problems,
        system_prompt=system_prompt,
        chunk_size=cfg.prompts_per_batch,
    )
    # One greedy reply and k samples per problem, chunk by chunk (the samples' seeds are one
    # above the greedy ones).
    chunks = zip(
        scored_chunks(**each, group=1, temperature=0.0, seed=seed),
        scored_chunks(
            **each, group=cfg.k, temperature=cfg.temperature, seed=seed + 1, top_p=cfg.top_p
        ),
        strict=True,
    )
    greedy, sampled, calling = [], [], []
    bar = tqdm(total=len(problems), desc="eval", unit="problem", disable=not progress)
    for (chunk, rollout, greedy_scores), (_, _, sampled_scores) in chunks:
        greedy.append(greedy_scores.total > cfg.correct_above)
        if rollout.tool_calls is not None:  # env=...: did the greedy episode call a tool?
            calling.append(rollout.tool_calls > 0)
        sampled.append((sampled_scores.total > cfg.correct_above).view(len(chunk), cfg.k))
        bar.update(len(chunk))
        bar.set_postfix(accuracy=f"{torch.cat(greedy).float().mean():.3f}")
    bar.close()
    calls = {"tool_call_rate": torch.cat(calling).float().mean().item()} if calling else {}
    return {
        "accuracy": torch.cat(greedy).float().mean().item(),
        **calls,
        **pass_at_ks(torch.cat(sampled)),
    }
