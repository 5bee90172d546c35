"""Advantage estimators as the trainer calls them, by `algo.advantage`.

Outcome estimators map each group's scalar rewards to one advantage per response:
`fn(rewards [P, G], prompt_ids [P], sas: SasTracker) -> [P, G]`. `gae` is token-level and
needs a critic, so the trainer computes it in `rlcli.critic`; it is listed in
`TOKEN_LEVEL` for validation. The math is in `rlcli.ops.advantages`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from rlcli.ops.advantages import (
    SasTracker,
    dr_grpo_advantages,
    grpo_advantages,
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

# Token-level estimators computed with a learned value model (PPO).
TOKEN_LEVEL = {"gae"}

ADVANTAGES = sorted([*OUTCOME, *TOKEN_LEVEL])
