"""Held-out evaluation: greedy accuracy and pass@k (`rlcli eval`, `trainer.eval_every`).

`evaluate` samples one greedy reply per held-out problem (accuracy: its reward above
`eval.correct_above`) and `eval.k` replies at `eval.temperature` for pass@k (`pass_at_k`),
with the share of greedy episodes that called a tool under env=...; docs/getting-started.md,
"Evaluate a model", says how each is measured. Each problem's replies come back too
(`Evaluation.problems`), for `eval_samples.jsonl` (`write_eval_samples`). Evaluation draws
from its own seed (`EVAL_SEED`), so evaluating during training leaves the training samples as
they would have been without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from rlcli.collect.sampling import scored_chunks
from rlcli.config import EvalConfig
from rlcli.data.problems import Problem, PromptRenderer, write_jsonl
from rlcli.rewards.scorer import Scorer, Scores, Unscorable, unscored_reason
from rlcli.rollout.batch import Rollout
from rlcli.rollout.contract import Sampler

# Evaluation's seed offset from trainer.seed, far from the training stream's call counts.
EVAL_SEED = 7_777_777
# Per-problem replies of an evaluation (rlcli eval; the latest held-out one of a training run).
EVAL_SAMPLES_FILE = "eval_samples.jsonl"


class UnscoredEvaluation(Unscorable):
    """No greedy reply of an evaluation could be scored: it measured nothing. `problems` holds
    its replies (as `Evaluation.problems`), which show why, for eval_samples.jsonl."""

    def __init__(self, problems: list[dict], why: str):
        super().__init__(len(problems), why, what="greedy reply of the held-out evaluation")
        self.problems = problems


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k of the n samples is correct, c of them being so: the
    unbiased estimator of Chen et al. 2021 (Codex, eq. 1), 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(k):  # C(n-c, k) / C(n, k) as a product, without huge factorials
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss


def pass_at_ks(correct: torch.Tensor) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, ... up to n, from correct [P, n] bool, averaged over problems."""
    n = correct.shape[1]
    counts = correct.sum(-1).tolist()
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    return {f"pass@{k}": sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks}


@dataclass
class Evaluation:
    """What an evaluation found: the metrics, and per problem what was sampled and scored."""

    metrics: dict[str, float]  # accuracy, tool_call_rate (env=...), pass@k
    # One record per problem: its prompt and answer, the greedy reply and the eval.k samples,
    # each with its reward, components and correctness (`reply_record`).
    problems: list[dict] = field(default_factory=list)


def share(flags: list[bool]) -> float:
    """The share of true flags, as an exact fraction (no float32 rounding)."""
    return sum(flags) / len(flags) if flags else 0.0


def reply_record(rollout: Rollout, scores: Scores, row: int, correct_above: float) -> dict:
    """One reply as eval_samples.jsonl holds it: the text, its reward (null where the reward
    failed) and components, whether it counts as correct, and whether it was cut off."""
    reward = scores.total[row].item()
    record = {
        "response": rollout.texts[row],
        "reward": None if math.isnan(reward) else round(reward, 6),
        "components": {
            name: None if math.isnan(v := values[row].item()) else round(v, 6)
            for name, values in scores.components.items()
        },
        "correct": bool(reward > correct_above),
        "truncated": bool(rollout.truncated[row]),
    }
    if rollout.tool_calls is not None:
        record["tool_calls"] = int(rollout.tool_calls[row])
    return record


def problem_record(problem: Problem, greedy: dict, samples: list[dict]) -> dict:
    """A problem's line of eval_samples.jsonl: its greedy reply and its k samples."""
    record = {
        "problem_id": problem.id,  # the key samples.jsonl uses
        "prompt": problem.question,
        "answer": problem.answer,
        "greedy": greedy,
        "samples": samples,
        "correct_samples": sum(r["correct"] for r in samples),
    }
    if problem.conversation is not None:  # conversational data: the prompt's messages
        record["conversation"] = problem.conversation
    return record


def evaluate(
    sampler: Sampler,
    scorer: Scorer,
    render: PromptRenderer,
    problems: list[Problem],
    cfg: EvalConfig,
    *,
    seed: int,
    progress: bool = False,
) -> Evaluation:
    """Greedy accuracy and pass@k of the sampler's current weights on `problems`, and what
    each problem's replies were. A reply whose reward failed counts as not correct;
    UnscoredEvaluation when no greedy reply could be scored (the evaluation measured
    nothing)."""
    problems = problems[: cfg.max_problems] if cfg.max_problems else problems
    # scorer.score: a chunk with no score is no error here (its replies are not correct); the
    # whole evaluation without one is, below.
    each = dict(sampler=sampler, scorer=scorer.score, render=render, problems=problems,
                chunk_size=cfg.prompts_per_batch)  # fmt: skip
    # One greedy reply and k samples per problem, chunk by chunk (the samples' seeds are one
    # above the greedy ones).
    chunks = zip(
        scored_chunks(**each, group=1, temperature=0.0, seed=seed),
        scored_chunks(
            **each, group=cfg.k, temperature=cfg.temperature, seed=seed + 1, top_p=cfg.top_p
        ),
        strict=True,
    )
    records, sampled, greedy_errors = [], [], []
    bar = tqdm(total=len(problems), desc="eval", unit="problem", disable=not progress)
    for (chunk, greedy, greedy_scores), (_, samples, sampled_scores) in chunks:
        greedy_errors += greedy_scores.errors
        for i, problem in enumerate(chunk):
            greedy_reply = reply_record(greedy, greedy_scores, i, cfg.correct_above)
            replies = [
                reply_record(samples, sampled_scores, j, cfg.correct_above)
                for j in range(i * cfg.k, (i + 1) * cfg.k)
            ]
            records.append(problem_record(problem, greedy_reply, replies))
        sampled.append((sampled_scores.total > cfg.correct_above).view(len(chunk), cfg.k))
        bar.update(len(chunk))
        bar.set_postfix(accuracy=f"{share([r['greedy']['correct'] for r in records]):.3f}")
    bar.close()
    greedy_replies = [r["greedy"] for r in records]
    if greedy_replies and all(r["reward"] is None for r in greedy_replies):
        raise UnscoredEvaluation(records, unscored_reason(greedy_errors))
    calls = (
        {"tool_call_rate": share([r["tool_calls"] > 0 for r in greedy_replies])}
        if greedy_replies and "tool_calls" in greedy_replies[0]
        else {}
    )  # env=...: the share of greedy episodes that called a tool
    metrics = {
        "accuracy": share([r["correct"] for r in greedy_replies]),
        **calls,
        **pass_at_ks(torch.cat(sampled)),
    }
    return Evaluation(metrics, records)


def write_eval_samples(problems: list[dict], path: Path, step: int | None = None) -> Path:
    """Each problem's record as a JSON line (with the training `step` it was evaluated at)."""
    stamp = {} if step is None else {"step": step}
    write_jsonl([{**stamp, **record} for record in problems], path)
    return path
