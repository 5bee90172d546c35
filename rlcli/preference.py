"""Preference pairs for DPO: reading them (`data=pairs`) and making them on-policy
(`rlcli pairs`).

A `Pair` is a prompt (chat messages up to the reply), a chosen and a rejected response. The
records may be plain text (`{"prompt": str, "chosen": str, "rejected": str}`) or chat form
(prompt, chosen and rejected as lists of `{"role", "content"}` messages; without a prompt
field, the chosen conversation minus its last message is the prompt, as in Anthropic-HH).

`rlcli pairs` samples a group per training prompt with the sampler training uses, scores it
with the configured reward, and writes the best and the worst response of each group as a
pair; groups whose best and worst scores tie give none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from rlcli.config import Config, ConfigError, DataConfig


@dataclass(frozen=True)
class Pair:
    """One preference: `chosen` is the better reply to `prompt` than `rejected`."""

    id: str
    prompt: list[dict]  # chat messages, ending before the reply
    chosen: str
    rejected: str


def as_messages(value) -> list[dict] | None:
    """A prompt as chat messages: a string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return [{"role": m.get("role", "user"), "content": str(m["content"])} for m in value]
    return None


def reply_text(value) -> str | None:
    """A reply's text: a string, or the content of the last message of a conversation."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return None


def pair_from_record(record: dict, item_id: str, cfg: DataConfig, where: str) -> Pair:
    """The Pair of one record; `where` ("row 3 of data.path=...") names it in errors."""
    from rlcli.data import field_or_error

    chosen_raw = field_or_error(record, "chosen_field", cfg, where)
    rejected_raw = field_or_error(record, "rejected_field", cfg, where)
    try:
        prompt = as_messages(field_or_error(record, "prompt_field", cfg, where))
    except ConfigError:
        if not (isinstance(chosen_raw, list) and len(chosen_raw) > 1):
            raise
        prompt = as_messages(chosen_raw[:-1])  # implicit prompt: the shared conversation
    chosen, rejected = reply_text(chosen_raw), reply_text(rejected_raw)
    if prompt is None or chosen is None or rejected is None:
        raise ConfigError(
            f"In {where}, the prompt, chosen and rejected fields must each be text or a list of "
            f"chat messages with a 'content' (data.prompt_field={cfg.prompt_field}, "
            f"data.chosen_field={cfg.chosen_field}, data.rejected_field={cfg.rejected_field})."
        )
    if cfg.system_prompt is not None and prompt[0]["role"] != "system":
        prompt = [{"role": "system", "content": cfg.system_prompt}, *prompt]
    return Pair(item_id, prompt, chosen, rejected)


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
    from rlcli.data import load_splits, write_jsonl
    from rlcli.trainer import frozen_sampling, sample_and_score, seed_everything

    p, t = cfg.pairs, cfg.trainer
    seed_everything(t.seed)
    problems, _ = load_splits(cfg.data)
    scorer, model_path, tokenizer, sampler = frozen_sampling(cfg, problems)
    out = Path(p.out).expanduser() if p.out else run_dir / "pairs.jsonl"
    print(f"rlcli: sampling {p.k} responses for each of {len(problems)} prompts with {model_path}")

    rows: list[dict] = []
    bar = tqdm(total=len(problems), desc="pairs", unit="prompt", disable=not cfg.logger.progress)
    for start in range(0, len(problems), p.prompts_per_batch):
        chunk = problems[start : start + p.prompts_per_batch]
        batch, scores = sample_and_score(
            sampler, scorer, tokenizer, chunk, p.k, cfg.data.system_prompt
        )
        grouped = scores.total.view(len(chunk), p.k)
        for g, (problem, picked) in enumerate(
            zip(chunk, best_vs_worst(grouped, p.min_margin), strict=True)
        ):
            if picked is None:
                continue
            best, worst = picked
            rows.append(
                {
                    "prompt": problem.question,
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
