"""Advantage estimators as the trainer calls them, by `algo.advantage`.

Outcome estimators map each group's scalar rewards to one advantage per response:
`fn(rewards [P, G], prompt_ids [P], sas: SasTracker) -> [P, G]`; `outcome_advantages`
applies one to groups that may hold missing (NaN) rewards. The token-level estimators are
`gae`, which needs a critic (the trainer computes it in `rlcli.critic`), and
`grpo_process`, computed from step rewards by `process_advantages`. The math is in
`rlcli.ops.advantages`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlcli.ops.advantages import (
    SasTracker,
    dr_grpo_advantages,
    grpo_advantages,
    grpo_process_advantages,
    rloo_advantages,
)

OutcomeEstimator = Callable[[Tensor, list[str], SasTracker], Tensor]

OUTCOME: dict[str, OutcomeEstimator] = {
    "grpo": lambda rewards, ids, sas: grpo_advantages(rewards),
    "dr_grpo": lambda rewards, ids, sas: dr_grpo_advantages(rewards),
    "rloo": lambda rewards, ids, sas: rloo_advantages(rewards),
    # DCPO: stateful per prompt id, smoothed over the visits of that prompt.
    "dcpo_sas": lambda rewards, ids, sas: sas(ids, rewards),
}

# Token-level estimators: PPO's (with a learned value model) and GRPO with process rewards.
TOKEN_LEVEL = {"gae", "grpo_process"}

ADVANTAGES = sorted([*OUTCOME, *TOKEN_LEVEL])


def outcome_advantages(
    estimator: OutcomeEstimator, rewards: Tensor, ids: list[str], sas: SasTracker
) -> Tensor:
    """`estimator` over groups [P, G] whose missing rewards are NaN.

    A group with missing rewards is estimated from its scored responses alone, as if the
    group were that much smaller; missing responses get advantage 0 (and no loss: the
    trainer masks them out).
    """
    scored = ~rewards.isnan()
    if scored.all():
        return estimator(rewards, ids, sas)
    advantages = torch.zeros_like(rewards)
    for g in range(rewards.shape[0]):
        keep = scored[g]
        if keep.any():
            advantages[g, keep] = estimator(rewards[g, keep][None], [ids[g]], sas)[0]
    return advantages


def process_advantages(step_rewards: Tensor, group_size: int) -> Tensor:
    """GRPO with process supervision, group by group.

    step_rewards: ``[B, T]``, a step's reward at the token where it ends and NaN elsewhere;
    rows are consecutive groups of `group_size` -> advantages ``[B, T]``.
    """
    ends = ~step_rewards.isnan()
    rewards = step_rewards.nan_to_num(0.0)
    return torch.cat(
        [
            grpo_process_advantages(r, e)
            for r, e in zip(rewards.split(group_size), ends.split(group_size), strict=True)
        ]
    )
