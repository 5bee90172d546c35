"""The policy loss assembled from its pieces: one function over tensors, no config and no model.

`Objective` holds the piece chosen on each axis (ratio level, clip bounds, surrogate, KL
estimator, aggregation: the registries of `ops.policy_loss`) and the coefficients;
`policy_objective` applies them to one micro-batch. `train.learner.objective_from_config`
builds an `Objective` from `algo.*` and `sampler.*`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from rlcli.ops.policy_loss import StepCounts, kl_k3, truncated_is_weights


@dataclass(frozen=True)
class Objective:
    """The chosen pieces of the policy loss and their coefficients."""

    ratio: Callable  # RATIOS: (logp, old_logp, mask) -> [B, T]
    bounds: Callable  # CLIP_BOUNDS with its widths bound: old_logp -> (lo, hi)
    surrogate: Callable  # SURROGATES: (ratio, adv, lo, hi, dual_clip) -> (loss, low, high, dual)
    kl: Callable | None  # None: no KL term (beta = 0)
    aggregate: Callable
    beta: float
    dual_clip: float | None
    entropy_coef: float
    temperature: float = 1.0  # the policy is softmax(logits / temperature), as sampled
    tis_cap: float | None = None  # weight tokens by min(exp(old - sampler), cap); None: off


def policy_objective(
    obj: Objective,
    logp: Tensor,  # [B, T] under the policy being optimised (has grad)
    old_logp: Tensor,  # [B, T] under the sampling policy
    ref_logp: Tensor | None,  # [B, T] under the reference, when obj.kl is set
    advantages: Tensor,  # [B] or [B, T]
    mask: Tensor,  # [B, T] 1 on tokens that count
    entropy: Tensor,  # [B, T]
    counts: StepCounts,  # of the whole optimiser step (all micro-batches)
    sampler_logp: Tensor | None = None,  # [B, T] from the sampler, when it is not the learner
) -> tuple[Tensor, dict[str, Tensor]]:
    """This micro-batch's share of the step's loss, and token sums of its diagnostics.

    loss = aggregate(-w*min(r*A, clip(r)*A) + beta*KL - entropy_coef*H); the aggregation
    divides by the whole step's counts so summing over micro-batches gives the big-batch loss.
    w = min(exp(old_logp - sampler_logp), tis_cap) when obj.tis_cap is set (truncated
    importance sampling: the sampler, not the learner's old policy, drew the tokens), else 1.
    """
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    ratio = obj.ratio(logp, old_logp, mask)
    lo, hi = obj.bounds(old_logp)
    per_token, low, high, dual = obj.surrogate(ratio, adv, lo, hi, obj.dual_clip)
    m = mask.to(logp.dtype)
    if sampler_logp is not None and obj.tis_cap is not None:
        per_token = per_token * truncated_is_weights(old_logp, sampler_logp, obj.tis_cap)
    log_ratio = (logp - old_logp).detach()
    sums = {
        "clip/low": (low * m).sum(),
        "clip/high": (high * m).sum(),
        "clip/dual": (dual * m).sum(),
        "entropy": (entropy.detach() * m).sum(),
        # KL(old || new) by the k3 estimator on tokens sampled from old: how far updates moved.
        "policy/approx_kl": ((log_ratio.exp() - 1 - log_ratio) * m).sum(),
    }
    if sampler_logp is not None:
        # Sampler/learner mismatch on the sampled tokens; KL(sampler || learner) by k3.
        sums["rollout/logp_abs_diff"] = ((old_logp - sampler_logp).abs() * m).sum()
        sums["rollout/kl"] = (kl_k3(sampler_logp, old_logp) * m).sum()
    if obj.kl is not None:
        kl = obj.kl(logp, ref_logp)
        per_token = per_token + obj.beta * kl
        sums["kl"] = (kl.detach() * m).sum()
    if obj.entropy_coef:
        per_token = per_token - obj.entropy_coef * entropy
    loss = obj.aggregate(per_token, mask, counts)
    return loss, sums
