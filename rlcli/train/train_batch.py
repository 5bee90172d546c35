"""The batch the step builds and the learner consumes.

B responses, T response tokens (the width of `rollout.response_mask`). The rollout's
`response_mask` already leaves out the responses that must not train (a failed reward, DAPO's
overlong filter), so every tensor here can be read under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlcli.rollout.batch import Rollout


@dataclass(frozen=True)
class TrainBatch:
    """One step's sampled responses with everything the objective reads about them."""

    rollout: Rollout  # tokens, masks, and the sampler's own log-probs (vLLM)
    rewards: Tensor  # [B] each response's reward; NaN where it failed
    advantages: Tensor  # [B] outcome estimators, or [B, T] token-level ones (gae, grpo_process)
    # [B, T] the learner's log-probs before this step's updates; None when there is a single
    # update per batch, whose ratio's base is the current log-probs themselves
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None  # [B, T] under the reference (KL in the loss); None: beta = 0
    returns: Tensor | None = None  # [B, T] GAE's returns, the critic's targets (PPO)
    old_values: Tensor | None = None  # [B, T] the critic's values before the update (PPO)

    @property
    def sampler_logp(self) -> Tensor | None:  # [B, T] the sampler's log-probs, when it has its own
        return self.rollout.sampler_logp
