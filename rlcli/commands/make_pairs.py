"""`rlcli pairs`: on-policy preference pairs for `algo=dpo`.

Samples a group per training prompt with the sampler training uses, scores it with the
configured reward, and writes the best and the worst response of each group as a pair;
groups whose best and worst scores tie give none.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from rlcli.collect.sampling import scored_chunks
from rlcli.commands.frozen_sampling import frozen_sampling
from rlcli.config import Config, ConfigError
from rlcli.data import load_splits
from rlcli.data.problems import write_jsonl
from rlcli.runtime.seed import seed_everything


def best_vs_worst(scores: torch.Tensor, min_margin: float = 0.0) -> list[tuple[int, int] | None]:
    """Per group, (index of the best, index of the worst) response, or None when their scores
    differ by no more than `min_margin` (a tie: no preference to learn). scores: [P, G], NaN
    (unscored) responses are never picked."""
    pairs = []
    for row in scores:
        scored = (~row.isnan()).nonzero().flatten()
        if len(scored) < 2:
            pairs.append(None)
            continue
        values = row[scored]
        best, worst = scored[values.argmax()].item(), scored[values.argmin()].item()
        pairs.append((best, worst) if row[best] - row[worst] > min_margin else None)
    return pairs


def make_pairs(cfg: Config, run_dir: Path) -> dict:
    """`rlcli pairs`: write best-vs-worst pairs of the training prompts; return the report."""
    p, t = cfg.pairs, cfg.trainer
    if cfg.env.name != "none":
        raise ConfigError(
            f"rlcli pairs writes single replies; env={cfg.env.name}'s episodes hold tool turns "
            "that a preference pair cannot carry: run it with env=none."
        )
    seed_everything(t.seed)
    problems, _ = load_splits(cfg.data)
    scorer, model_path, render, sampler = frozen_sampling(cfg, problems)
    out = Path(p.out).expanduser() if p.out else run_dir / "pairs.jsonl"
    print(f"rlcli: sampling {p.k} responses for each of {len(problems)} prompts with {model_path}")

    rows: list[dict] = []
    bar = tqdm(total=len(problems), desc="pairs", unit="prompt", disable=not cfg.logger.progress)
    chunks = scored_chunks(sampler, scorer, render, problems, p.k, chunk_size=p.prompts_per_batch)
    for chunk, batch, scores in chunks:
        grouped = scores.total.view(len(chunk), p.k)
        for g, (problem, picked) in enumerate(
            zip(chunk, best_vs_worst(grouped, p.min_margin), strict=True)
        ):
            if picked is None:
                continue
            best, worst = picked
            rows.append(
                {
                    # a conversation stays one: data=pairs reads chat messages as the prompt
                    "prompt": problem.conversation or problem.question,
                    "chosen": batch.texts[g * p.k + best],
                    "rejected": batch.texts[g * p.k + worst],
                    "chosen_score": grouped[g, best].item(),
                    "rejected_score": grouped[g, worst].item(),
                    "answer": problem.answer,
                }
            )
        bar.update(len(chunk))
        bar.set_postfix(pairs=len(rows))
    bar.close()
    write_jsonl(rows, out)
    report = {"prompts": len(problems), "pairs": len(rows), "k": p.k, "out": str(out)}
    (run_dir / "pairs_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"rlcli: wrote {len(rows)} pairs from {len(problems)} prompts (ties skipped) to {out}")
    if not rows:
        raise ConfigError(
            f"No group of {p.k} responses had differing rewards, so there are no pairs: "
            "raise pairs.k, use another reward, or another model or dataset."
        )
    return report
