"""What a clipped-objective run warns of as it starts (console and train.log), settings it
runs with but should not: an exactly on-policy estimator learning from older samples, and
the python tool outside the sandbox.
"""

from __future__ import annotations

from rlcli.env.tools import unboxed_warning
from rlcli.train.pieces_chosen import advantage_piece


def start_warnings(cfg) -> list[str]:
    """What a run should hear at its start about its pieces' settings."""
    t, algo = cfg.trainer, cfg.algo
    lines = []
    if "on_policy" in advantage_piece(algo.advantage).needs and t.mini_batches * t.epochs > 1:
        lines.append(
            f"rlcli: warning: algo.advantage={algo.advantage} is meant for exactly on-policy "
            f"updates (one mini-batch, one epoch), but trainer.mini_batches={t.mini_batches} and "
            f"trainer.epochs={t.epochs} make every update after the first learn from an older "
            "policy's samples; its baseline no longer is the optimal one."
        )
    if (unboxed := unboxed_warning(cfg.env)) is not None:
        lines.append(unboxed)
    return lines
