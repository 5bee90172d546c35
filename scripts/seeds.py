"""Held-out accuracy before and after training, over N seeds: the mean and its 95% interval.

    .venv/bin/python scripts/seeds.py [--seeds 3] [--out DIR] [overrides...]
    e.g. scripts/seeds.py --seeds 3 --out runs/demo                 # the default demo
         scripts/seeds.py --out runs/dapo recipe=cpu/dapo_qwen32b   # a CPU twin

1. `rlcli eval OVERRIDES` scores the model before training (into DIR/before/eval.json).
   Greedy accuracy does not depend on the seed, so one evaluation serves every seed.
2. `rlcli train -m trainer.seed=0,...,N-1 trainer.eval_every=<max_steps> OVERRIDES` trains
   each seed and evaluates it on the same held-out problems at its last step (DIR/runs; the
   sweep's summary.md has its own table over the seeds).
3. Prints and writes DIR/seeds.md: accuracy before, after (per seed, mean ± the half-width of
   the 95% Student-t interval) and the gain, and the training seconds (the sum of time/step).

The overrides are those `rlcli train` takes; eval.max_problems and eval.k shape both
evaluations alike (eval.k=1 keeps the pass@k samples cheap when only accuracy is wanted).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rlcli.commands.recipes import check_recipe_choices, register_recipes
from rlcli.commands.sweep import interval_cell, write_summary
from rlcli.config import ConfigError
from rlcli.validate import compose


def rlcli(*args: str) -> None:
    """Run an rlcli command in a child process; stop here if it fails."""
    done = subprocess.run([sys.executable, "-m", "rlcli", *args])
    if done.returncode:
        sys.exit(f"seeds: `rlcli {' '.join(args)}` exited {done.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--out", default="runs/seeds", help="output directory")
    args, overrides = parser.parse_known_args()
    out = Path(args.out).resolve()
    # `recipe=NAME` is a group only once the recipes are registered, as `rlcli train` does.
    register_recipes()
    try:
        check_recipe_choices(overrides)
        max_steps = compose(overrides).trainer.max_steps  # also checks the overrides up front
    except ConfigError as err:
        sys.exit(f"seeds: {err}")

    before = out / "before"
    if not (before / "eval.json").is_file():
        rlcli("eval", *overrides, f"hydra.run.dir={before}")
    seeds = ",".join(str(s) for s in range(args.seeds))
    runs = out / "runs"
    rlcli(
        "train",
        "-m",
        f"trainer.seed={seeds}",
        f"trainer.eval_every={max_steps}",
        *overrides,
        f"hydra.sweep.dir={runs}",
    )

    jobs = write_summary(runs)
    base = json.loads((before / "eval.json").read_text())["accuracy"]
    after = [job.eval_accuracy for job in jobs]
    gains = [a - base for a in after if a is not None]
    seconds = [job.train_time_s for job in jobs]
    lines = [
        f"# `{' '.join(overrides) or '(defaults)'}` over {args.seeds} seeds",
        "",
        "| | accuracy (greedy) |",
        "|---|---|",
        f"| before training | {base:.3f} |",
        *(
            f"| after, seed {seed} | {'' if a is None else f'{a:.3f}'} |"
            for seed, a in zip(range(args.seeds), after, strict=True)
        ),
        f"| after, mean ± 95% interval | {interval_cell(after, 3)} |",
        f"| gain, mean ± 95% interval | {interval_cell(gains, 3)} |",
        f"| training seconds (sum of time/step) | {interval_cell(seconds, 1)} |",
    ]
    text = "\n".join(lines) + "\n"
    (out / "seeds.md").write_text(text)
    print(text + f"\nwritten to {out / 'seeds.md'}")


if __name__ == "__main__":
    main()
