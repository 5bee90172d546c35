"""Each torchrun rank's own state in a checkpoint (its random numbers, the sampler's state), and
what a resume on another number of ranks keeps of them (docs/scaling.md)."""

from __future__ import annotations

from pathlib import Path

RANK_KEYS = ("rng", "run_rng", "sampler")


def rank_state(state: dict, rank: int, world: int) -> dict | None:
    """Rank `rank`'s state in a checkpoint's `state` (`RANK_KEYS`), or None where the run that
    wrote it had fewer ranks. Checkpoints written before per-rank states held rank 0's alone,
    which every rank takes."""
    ranks = state.get("ranks") or [{k: state[k] for k in RANK_KEYS}] * world
    return ranks[rank] if rank < len(ranks) else None


def world_changed(checkpoint: Path, saved_world: int, world: int, prompts_per_step: int) -> str:
    """The line a resume on another number of ranks prints."""
    return (
        f"rlcli: {checkpoint} was written by {saved_world} process(es) and this run has {world}. "
        "The weights, the optimiser and scheduler, the data position and the estimators' state "
        f"continue whole; each process now takes {prompts_per_step // world} of the step's "
        f"{prompts_per_step} prompts and draws its own random numbers, so the steps from here "
        f"are not those {saved_world} process(es) would have taken."
    )
