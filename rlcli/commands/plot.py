"""`rlcli plot RUN_DIR... [--out FILE]`: redraw the curves of runs side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlcli.tracking.curves import CURVES_FILE, plot_runs
from rlcli.tracking.metrics import METRICS_FILE


def _fail(message: str) -> None:
    print(f"rlcli: error: {message}", file=sys.stderr)
    sys.exit(2)


def plot_command(argv: list[str]) -> None:
    """`rlcli plot RUN_DIR... [--out FILE]`."""
    parser = argparse.ArgumentParser(
        prog="rlcli plot",
        description="Redraw the training curves of runs side by side, as each run's "
        "curves.png (one line per run in each panel: reward, held-out accuracy, loss, gradient "
        "norm, response length, entropy, clip fraction, KL, a learning rate that moves, tool "
        "calls and errors).",
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="a run directory holding "
        f"{METRICS_FILE} (runs/<time>, or a sweep's job directory multirun/<time>/<job>)",
    )
    parser.add_argument("--out", type=Path, default=Path(CURVES_FILE), help="the PNG to write")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        if not (run_dir / METRICS_FILE).is_file():
            _fail(
                f"{run_dir} holds no {METRICS_FILE}, so it is not a run directory (for a "
                "sweep, pass its job directories: rlcli plot multirun/<time>/*)."
            )
    print(f"rlcli: curves in {plot_runs(args.run_dirs, args.out)}")
