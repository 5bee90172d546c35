"""Per-token policy losses, `LOSSES`: the surrogate each algorithm minimises (docs/algorithms.md
gives each formula; each docstring names its paper), one function each, registered beside
its definition.

A loss names the inputs it reads as parameters (any of `LOSS_INPUTS`, passed by keyword) and
its settings as keyword-only parameters with defaults (`algo.loss_settings`); it returns
``(loss, metrics)``, as `register_loss` says.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcli.ops.pieces import Piece, registrar
from rlcli.ops.policy_loss import clipped_surrogate

# The inputs a loss may name:
#     logp [B, T]       the policy's log-probs of the sampled tokens (with gradient)
#     old_logp [B, T]   the sampling policy's; ref_logp [B, T] or None, the reference's
#     advantages [B, T] one per token (a response's advantage repeated over its tokens)
#     mask [B, T]       1.0 on tokens that count in the loss, else 0.0
#     entropy [B, T]    the policy's entropy at each token (with gradient)
#     ratio [B, T]      `algo.ratio`'s importance ratio; lo, hi [B, T] `algo.clip`'s bounds
#     eps_low, eps_high, dual_clip   the algorithm's clip widths and dual clip (None: off)
#     selected [B, T]   bool, the tokens `select` chose over the whole mini-batch (else None)
LOSS_INPUTS = (
    "logp", "old_logp", "ref_logp", "advantages", "mask", "entropy", "ratio", "lo", "hi",
    "eps_low", "eps_high", "dual_clip", "selected",
)  # fmt: skip
LOSSES: dict[str, Piece] = {}
# `@register_loss(name, needs=..., check=..., select=...)`. A loss returns ``(loss, metrics)``:
# the loss per token ``[B, T]`` (aggregated by `algo.aggregation`) or, for one registered with
# ``needs=("response_advantage",)`` that returns ``[B]``, per response (averaged over the
# responses that train); metrics are sums over masked tokens, reported per token under the
# piece's name. A loss that chooses tokens over the whole mini-batch (Clip-Cov, KL-Cov) is
# registered with its `select=`, a function
#     (advantages, logp, mask, ratio, lo, hi, **settings) -> bool [n, T]
# computed once per mini-batch from the current policy's detached log-probs (ratio, lo and hi
# from `algo.ratio` and `algo.clip` over them), so the choice does not depend on how the
# mini-batch is split into passes. `check=` checks its settings before anything loads.
register_loss = registrar(LOSSES, LOSS_INPUTS)


def _sum(flags: Tensor, mask: Tensor) -> Tensor:
    return (flags.to(mask.dtype) * mask).sum()


def _clip_metrics(low: Tensor, high: Tensor, dual: Tensor, mask: Tensor) -> dict[str, Tensor]:
    return {"clip/low": _sum(low, mask), "clip/high": _sum(high, mask),
            "clip/dual": _sum(dual, mask)}  # fmt: skip


@register_loss("ppo_clip")
def ppo_clip(*, ratio, advantages, lo, hi, dual_clip, mask):
    """PPO's clipped surrogate, -min(r A, clip(r, lo, hi) A), with the optional dual clip."""
    loss, low, high, dual = clipped_surrogate(ratio, advantages, lo, hi, dual_clip)
    return loss, _clip_metrics(low, high, dual, mask)


@register_loss("cispo")
def cispo(*, logp, ratio, advantages, lo, hi, mask):
    """CISPO (MiniMax-M1): -sg(clip(r, lo, hi)) A logp; every token keeps its gradient."""
    weight = torch.minimum(torch.maximum(ratio, lo), hi).detach()
    capped = (ratio > hi) | (ratio < lo)
    return -weight * advantages * logp, {"cispo/capped": _sum(capped, mask)}


def _positive(*names: str):
    """A settings check: each of `names` must be > 0."""

    def check(settings: dict) -> str | None:
        for name in names:
            if not settings[name] > 0:
                return f"{name}={settings[name]!r} must be > 0."
        return None

    return check


@register_loss("sapo", check=_positive("tau_pos", "tau_neg"))
def sapo(*, ratio, advantages, mask, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO: -(4/tau) sigmoid(tau (r - 1)) A, a soft gate instead of a hard clip."""
    # Built in the loss's dtype: a float32 1.05 would be 1.0499999523 in a float64 loss.
    tau = torch.where(
        advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg)
    )
    gate = 4.0 / tau * torch.sigmoid(tau * (ratio - 1.0))
    # how far the gate's slope has fallen from the plain gradient's 1 (0 at r = 1)
    slope = 4.0 * torch.sigmoid(tau * (ratio - 1.0)) * torch.sigmoid(-tau * (ratio - 1.0))
    return -gate * advantages, {"sapo/damped": _sum(slope.detach() < 0.5, mask)}


@register_loss("gmpo", needs=("response_advantage",))
def gmpo(*, logp, old_logp, advantages, mask, eps_low, eps_high):
    """GMPO: -A rho, rho the geometric mean of the token ratios, each clipped in log space."""
    sign = torch.sign(advantages)
    delta = logp - old_logp.detach()
    clipped = delta.clamp(-eps_low, eps_high)
    pessimistic = sign * torch.minimum(sign * delta, sign * clipped)  # [B, T]
    lengths = mask.sum(-1).clamp(min=1)
    rho = torch.exp((pessimistic * mask).sum(-1) / lengths)  # [B]
    bound = (delta != clipped) & (sign * delta > sign * clipped)
    return -advantages[:, 0] * rho, {"gmpo/clipped": _sum(bound, mask)}


@register_loss("luspo", needs=("response_advantage",))
def luspo(*, ratio, advantages, lo, hi, dual_clip, mask):
    """LUSPO: GSPO's sequence-level clipped loss times the response's length."""
    loss, low, high, dual = clipped_surrogate(ratio, advantages, lo, hi, dual_clip)
    per_response = (loss * mask).sum(-1)  # GSPO's l_i (constant over tokens) x |o_i|
    return per_response, _clip_metrics(low, high, dual, mask)


@register_loss("gpg")
def gpg(*, logp, advantages):
    """GPG: -A logp, the plain policy gradient: no ratio, no clip."""
    return -advantages * logp, {}


def _covariance(advantages: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """(A - mean A)(logp - mean logp), means over the masked tokens; -inf elsewhere. [n, T]"""
    m = mask.bool()
    a, lp = advantages.double(), logp.detach().double()
    centred = (a - a[m].mean()) * (lp - lp[m].mean())
    return torch.where(m, centred, -torch.inf)


def _how_many(ratio: float, mask: Tensor) -> int:
    return max(1, int(ratio * float(mask.sum())))


def _share(settings: dict) -> str | None:
    """A settings check: rho, the share of tokens chosen, lies in (0, 1]."""
    rho = settings["rho"]
    return None if 0 < rho <= 1 else f"rho={rho!r} must lie in (0, 1]: the share of tokens."


def clip_cov_select(advantages, logp, mask, ratio, lo, hi, *, rho, lower, upper):
    """Clip-Cov: n = max(1, floor(rho N)) tokens at random among those whose covariance lies
    strictly in (lower, upper) and whose clip does not already bind (under `algo.clip`'s
    bounds lo, hi and `algo.ratio`'s ratio, the ones the loss clips with)."""
    cov = _covariance(advantages, logp, mask)
    binding = ((advantages > 0) & (ratio > hi)) | ((advantages < 0) & (ratio < lo))
    candidates = ((cov > lower) & (cov < upper) & ~binding & mask.bool()).flatten().nonzero()[:, 0]
    n = min(_how_many(rho, mask), len(candidates))
    chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:n]]
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    selected[chosen] = True
    return selected.view_as(mask)


def _clip_cov_settings(settings: dict) -> str | None:
    if settings["lower"] >= settings["upper"]:
        return (f"lower={settings['lower']!r} must be below upper={settings['upper']!r}: the "
                "candidates' covariance lies strictly between them.")  # fmt: skip
    return _share(settings)


@register_loss(
    "clip_cov", needs=("minibatch_stats",), check=_clip_cov_settings, select=clip_cov_select
)
def clip_cov(
    *, ratio, advantages, lo, hi, dual_clip, mask, selected,
    rho: float = 2e-4, lower: float = 1.0, upper: float = 5.0,
):  # fmt: skip
    """Clip-Cov: PPO's clipped loss; a few high-covariance tokens carry no gradient."""
    loss, low, high, dual = clipped_surrogate(ratio, advantages, lo, hi, dual_clip)
    loss = torch.where(selected, loss.detach(), loss)
    return loss, {**_clip_metrics(low, high, dual, mask), "clip_cov/detached": _sum(selected, mask)}


def kl_cov_select(advantages, logp, mask, ratio, lo, hi, *, rho, coef):
    """KL-Cov: the n = max(1, floor(rho N)) tokens of largest covariance, ties to the
    earlier token (row-major)."""
    cov = _covariance(advantages, logp, mask).flatten()
    order = torch.sort(cov, descending=True, stable=True).indices[: _how_many(rho, mask)]
    selected = torch.zeros_like(cov, dtype=torch.bool)
    selected[order] = True
    return selected.view_as(mask) & mask.bool()


@register_loss("kl_cov", needs=("minibatch_stats",), check=_share, select=kl_cov_select)
def kl_cov(
    *, logp, old_logp, ratio, advantages, mask, selected, rho: float = 2e-3, coef: float = 1.0
):
    """KL-Cov: -r A on every token, plus coef |logp - old_logp| on the high-covariance ones."""
    penalty = coef * (logp - old_logp.detach()).abs() * selected.to(logp.dtype)
    return -ratio * advantages + penalty, {"kl_cov/penalised": _sum(selected, mask)}


def top_entropy_mask(entropy: Tensor, mask: Tensor, ratio: float) -> Tensor:
    """Beyond the 80/20 rule: the k = max(1, floor(ratio N)) masked tokens of highest
    entropy (ties to the earlier token), as a bool ``[n, T]``."""
    scores = torch.where(mask.bool(), entropy.detach().double(), -torch.inf).flatten()
    order = torch.sort(scores, descending=True, stable=True).indices[: _how_many(ratio, mask)]
    keep = torch.zeros_like(scores, dtype=torch.bool)
    keep[order] = True
    return keep.view_as(mask) & mask.bool()
