"""`rlcli filter`: drop the prompts a model already solves (DUPO's pre-filter, WebSailor §4).

For every prompt of the training split, sample `filter.k` responses with the model (the same
sampler training uses) and score them with the configured reward; a response is correct
when its reward is above `filter.correct_above`. The prompts whose k responses were all
correct (and, with `filter.drop_never_correct`, those never correct) are dropped, and the
rest of the dataset is written, record by record, as JSONL that loads again with
`data.path=` (for generated data: `data=jsonl data.path=`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from rlcli.collect.sampling import scored_chunks
from rlcli.commands.frozen_sampling import frozen_sampling
from rlcli.config import Config
from rlcli.data import load_splits
from rlcli.data.problems import Problem, write_records
from rlcli.runtime.seed import seed_everything


def verdicts(scores: torch.Tensor, correct_above: float) -> list[str]:
    """Per prompt: 'always', 'never' or 'mixed' correct. scores: [P, k], NaN = unscored.

    A prompt with an unscored response is 'mixed': its verdict is not known, so it is kept.
    """
    out = []
    for row in scores:
        correct = row > correct_above
        if row.isnan().any():
            out.append("mixed")
        elif correct.all():
            out.append("always")
        elif not correct.any():
            out.append("never")
        else:
            out.append("mixed")
    return out


def filter_dataset(cfg: Config, run_dir: Path) -> dict:
    """Write the filtered training split; return the report (also written as JSON)."""
    f, t = cfg.filter, cfg.trainer
    seed_everything(t.seed)
    problems, _ = load_splits(cfg.data)
    scorer, model_path, render, sampler = frozen_sampling(cfg, problems)
    out = Path(f.out).expanduser() if f.out else run_dir / "filtered.jsonl"
    print(f"rlcli: filtering {len(problems)} prompts with {model_path}, {f.k} samples each")

    kept: list[Problem] = []
    counts = {"always": 0, "never": 0, "mixed": 0}
    bar = tqdm(total=len(problems), desc="filter", unit="prompt", disable=not cfg.logger.progress)
    chunks = scored_chunks(sampler, scorer, render, problems, f.k, chunk_size=f.prompts_per_batch)
    for chunk, _, scores in chunks:
        for problem, verdict in zip(
            chunk, verdicts(scores.total.view(len(chunk), f.k), f.correct_above), strict=True
        ):
            counts[verdict] += 1
            if verdict == "mixed" or (verdict == "never" and not f.drop_never_correct):
                kept.append(problem)
        bar.update(len(chunk))
        bar.set_postfix(kept=len(kept), always=counts["always"], never=counts["never"])
    bar.close()

    out.parent.mkdir(parents=True, exist_ok=True)
    write_records(kept, out)
    report = {
        "prompts": len(problems),
        "kept": len(kept),
        "dropped_always_correct": counts["always"],
        "dropped_never_correct": counts["never"] if f.drop_never_correct else 0,
        "never_correct": counts["never"],
        "k": f.k,
        "correct_above": f.correct_above,
        "model": model_path,
        "out": str(out),
    }
    (run_dir / "filter_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"rlcli: kept {report['kept']} of {report['prompts']} prompts; dropped "
        f"{report['dropped_always_correct']} always correct and "
        f"{report['dropped_never_correct']} never correct (of {counts['never']})"
    )
    print(f"rlcli: wrote {out}")
    return report
