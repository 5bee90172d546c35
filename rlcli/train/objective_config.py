"""The `Objective` a config makes (`objective_from_config`): the loss `algo.loss` names
(`pieces_chosen`), with the ratio, clip, KL and aggregation `algo.*` picks from the registries
of `ops.policy_loss`, over the distribution `sampler.*` samples from.
"""

from __future__ import annotations

from functools import partial

from rlcli.config import AlgoConfig, SamplerConfig
from rlcli.ops.objective import Objective
from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS
from rlcli.train.pieces_chosen import loss_piece


def objective_from_config(algo: AlgoConfig, sampler: SamplerConfig, norm_len: int) -> Objective:
    """The policy loss `algo.*` chooses, over the distribution `sampler.*` samples from."""
    loss = loss_piece(algo.loss)
    return Objective(
        ratio=RATIOS[algo.ratio],
        bounds=partial(CLIP_BOUNDS[algo.clip], eps_low=algo.eps_low, eps_high=algo.eps_high),
        loss=loss,
        # KL in the reward (PPO) is applied to the rewards, not here.
        kl=KL_ESTIMATORS[algo.kl] if algo.beta > 0 and algo.kl_in == "loss" else None,
        aggregate=partial(AGGREGATIONS[algo.aggregation], norm_len=norm_len),
        beta=algo.beta,
        dual_clip=algo.dual_clip,
        entropy_coef=algo.entropy_coef,
        eps_low=algo.eps_low,
        eps_high=algo.eps_high,
        loss_settings=dict(algo.loss_settings),
        select=loss.select if "minibatch_stats" in loss.needs else None,
        top_entropy=algo.top_entropy,
        temperature=sampler.temperature,
        tis_cap=sampler.tis_cap if sampler.old_logp == "sampler" else None,
        is_correction=sampler.is_correction,
    )
