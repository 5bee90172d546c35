"""Batch shaping: which groups a step trains on (DAPO dynamic sampling, DUPO fill).

Pure functions over group rewards; the `Collector` (`collector.py`) does the sampling they ask
for.
"""

from __future__ import annotations

import math
import random

from torch import Tensor

from rlcli.rewards.scorer import Scores


def informative_groups(rewards: Tensor) -> Tensor:
    """Groups whose rewards are not all equal: only those carry gradient. [P, G] -> [P] bool

    Missing (NaN) rewards are left out of the comparison.
    """
    scored = ~rewards.isnan()
    highest = rewards.masked_fill(~scored, -math.inf).amax(-1)
    lowest = rewards.masked_fill(~scored, math.inf).amin(-1)
    return highest > lowest


def dupo_fill(informative: list[bool], rng: random.Random) -> list[int]:
    """DUPO (WebSailor): replace each zero-signal group by a random informative one.

    Returns, for every slot of the batch, the index of the group to train on there; the
    batch keeps its size. With no informative group the batch is returned unchanged.
    """
    keep = [i for i, ok in enumerate(informative) if ok]
    if not keep:
        return list(range(len(informative)))
    return [i if ok else rng.choice(keep) for i, ok in enumerate(informative)]


def group_rows(groups: list[int], group_size: int) -> list[int]:
    """Response rows of the given groups, in order."""
    return [g * group_size + j for g in groups for j in range(group_size)]


def filter_values(scores: Scores, metric: str, components: list[str]) -> Tensor:
    """What dynamic sampling and DUPO compare within a group (`algo.filter_metric`): the total
    reward, or one component's unweighted score (correctness: the first component).  # [B]"""
    name = components[0] if metric == "correctness" else metric
    return scores.total if name == "total" else scores.components[name]
