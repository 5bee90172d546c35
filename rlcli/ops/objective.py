"""The policy loss assembled from its pieces: one function over tensors, no config and no model.

`Objective` holds the piece chosen on each axis (ratio level, clip bounds, KL estimator and
aggregation from the registries of `ops.policy_loss`, the per-token loss from `ops.losses`)
with its settings and the coefficients; `policy_objective` applies them to one micro-batch.
`train.objective_config.objective_from_config` builds an `Objective` from `algo.*` and
`sampler.*`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from rlcli.ops.pieces import Piece, PieceError, call_piece, loss_output_problem
from rlcli.ops.policy_loss import (
    IS_CORRECTIONS,
    StepCounts,
    kl_k3,
)


@dataclass(frozen=True)
class Objective:
    """The chosen pieces of the policy loss and their coefficients."""

    ratio: Callable  # RATIOS: (logp, old_logp, mask) -> [B, T]
    bounds: Callable  # CLIP_BOUNDS with its widths bound: old_logp -> (lo, hi)
    loss: Piece  # LOSSES (or the user's): keyword inputs -> (loss [B, T] or [B], metrics)
    kl: Callable | None  # None: no KL term (beta = 0)
    aggregate: Callable
    beta: float
    dual_clip: float | None
    entropy_coef: float
    eps_low: float = 0.2
    eps_high: float = 0.2
    loss_settings: dict = field(default_factory=dict)  # over the loss's own defaults
    select: Callable | None = None  # the loss's mini-batch token selection (Clip-Cov, KL-Cov)
    top_entropy: float = 0.0  # only this share of tokens, highest entropy first, trains (0: off)
    temperature: float = 1.0  # the policy is softmax(logits / temperature), as sampled
    tis_cap: float | None = None  # weight tokens by min(exp(old - sampler), cap); None: off
    is_correction: str = "truncate"  # IS_CORRECTIONS: a weight above tis_cap truncated or masked

    @property
    def needs_minibatch_stats(self) -> bool:
        """Whether the learner computes the mini-batch's log-probs and entropies first."""
        return self.select is not None or self.top_entropy > 0


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
    selected: Tensor | None = None,  # [B, T] bool, obj.select's tokens of the mini-batch
    trained: Tensor | None = None,  # [B, T] bool, the top-entropy tokens (obj.top_entropy > 0)
) -> tuple[Tensor, dict[str, Tensor]]:
    """This micro-batch's share of the step's loss, and token sums of its diagnostics.

    loss = aggregate(w * l + beta*KL - entropy_coef*H), l the chosen loss piece (PPO's
    -min(r*A, clip(r)*A) by default), counted only on `trained` tokens when top-entropy
    training is on; the aggregation divides by the whole step's counts so summing over
    micro-batches gives the big-batch loss. A loss per response (GMPO, LUSPO) is averaged
    over the step's responses that train, and the KL and entropy terms are then added with
    the chosen aggregation. w = min(exp(old_logp - sampler_logp), tis_cap) when obj.tis_cap
    is set (truncated importance sampling: the sampler, not the learner's old policy, drew
    the tokens), or that weight where it is at most tis_cap and else 0 with
    obj.is_correction="mask" (AReaL's decoupled PPO); else 1. For a loss per response w is
    the geometric mean of its tokens' ratios, truncated or masked the same way.
    """
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    ratio = obj.ratio(logp, old_logp, mask)
    lo, hi = obj.bounds(old_logp)
    m = mask.to(logp.dtype)
    per_token, own = loss_of(
        obj,
        logp=logp,
        old_logp=old_logp,
        ref_logp=ref_logp,
        advantages=adv.expand_as(logp),
        mask=m,
        entropy=entropy,
        ratio=ratio,
        lo=lo,
        hi=hi,
        selected=selected,
    )
    if sampler_logp is not None and obj.tis_cap is not None:
        per_token_weights, per_response_weights = IS_CORRECTIONS[obj.is_correction]
        if per_token.dim() == 2:
            weights = per_token_weights(old_logp, sampler_logp, obj.tis_cap)
        else:
            weights = per_response_weights(old_logp, sampler_logp, m, obj.tis_cap)
        per_token = per_token * weights
    if trained is not None:
        if per_token.dim() == 1:  # validation refuses the pair before anything loads
            raise ValueError("top-entropy tokens choose among per-token losses, not per-response")
        per_token = per_token * trained.to(per_token.dtype)
    log_ratio = (logp - old_logp).detach()
    sums = {
        **{key: value.detach() for key, value in own.items()},
        "actor/entropy": (entropy.detach() * m).sum(),
        # KL(old || new) by the k3 estimator on tokens sampled from old: how far updates moved.
        "policy/approx_kl": ((log_ratio.exp() - 1 - log_ratio) * m).sum(),
    }
    if sampler_logp is not None:
        # Sampler/learner mismatch on the sampled tokens; KL(sampler || learner) by k3.
        sums["rollout/logp_abs_diff"] = ((old_logp - sampler_logp).abs() * m).sum()
        sums["rollout/kl"] = (kl_k3(sampler_logp, old_logp) * m).sum()
        if obj.tis_cap is not None:  # tokens whose weight the cap truncated or masked
            above = (old_logp - sampler_logp).detach() > math.log(obj.tis_cap)
            sums["rollout/is_capped"] = (above * m).sum()
    if per_token.dim() == 1:  # one loss per response: their mean over the responses that train
        trains = (m.sum(-1) > 0).to(per_token.dtype)
        response_loss = (per_token * trains).sum() / max(float(counts.seqs), 1.0)
        per_token = 0.0 * logp  # the KL and entropy terms below, aggregated as chosen
    else:
        response_loss = None
    if obj.kl is not None:
        kl = obj.kl(logp, ref_logp)
        per_token = per_token + obj.beta * kl
        sums["loss/kl"] = (kl.detach() * m).sum()
    if obj.entropy_coef:
        per_token = per_token - obj.entropy_coef * entropy
    loss = obj.aggregate(per_token, mask, counts)
    return (loss if response_loss is None else response_loss + loss), sums


def loss_of(obj: Objective, **tensors: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss piece on copies of the micro-batch's tensors (a piece that writes into its
    inputs cannot change what the objective and its metrics read after it), its output
    checked: a `PieceError` names the piece when it raises or returns something else than
    (loss [B, T], or [B] for a loss per response, with a gradient; {name: 0-dim tensor})."""
    copies = {k: None if v is None else v.clone() for k, v in tensors.items()}
    scalars = dict(eps_low=obj.eps_low, eps_high=obj.eps_high, dual_clip=obj.dual_clip)
    out = call_piece(obj.loss, "algo.loss", obj.loss_settings, **copies, **scalars)
    logp = tensors["logp"]
    per_response = "response_advantage" in obj.loss.needs
    shape = tuple(logp.shape[:1]) if per_response else tuple(logp.shape)
    problem = loss_output_problem(out, shape, logp.requires_grad)
    if problem is not None:
        what = "[B] (one loss per response)" if per_response else "[B, T] (one per token)"
        raise PieceError(
            f"algo.loss={obj.loss.name} returned {problem}. A loss returns (loss, metrics): the "
            f"loss as a tensor of shape {what}, computed from logp so it has a gradient, and "
            "metrics as a dict of name -> one-number tensor (sums over masked tokens; {} for "
            "none)."
        )
    return out
