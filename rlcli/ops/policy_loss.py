"""Pieces of the policy objective (docs/algorithms.md; each function cites its paper).

The loss is assembled from independent choices, each a registry of small functions:
ratio level (``RATIOS``), clip rule (``CLIP_BOUNDS``), KL estimator (``KL_ESTIMATORS``) and
loss aggregation (``AGGREGATIONS``); the per-token losses (``LOSSES``) are in ``ops.losses``.
Shapes: B responses, T tokens; ``mask`` is 1 on tokens that count in the loss.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# --- importance ratios: (logp, old_logp, mask) -> [B, T] -------------------------------


def token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """PPO/GRPO token ratio ``r[i,t] = exp(logp - old_logp)``; mask unused.  # [B, T]"""
    return torch.exp(logp - old_logp.detach())


def _sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(logp.dtype)
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)  # empty row -> log ratio 0
    return ((logp - old_logp.detach()) * mask).sum(-1, keepdim=True) / lengths  # [B, 1]


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence ratio (Zheng et al. 2025, eq. 7), length-normalised.

    ``s_i = exp(sum_t mask*(logp - old_logp) / sum_t mask)``, expanded to ``[B, T]`` so
    every ratio has the token shape; clipping then acts on the response as a whole.
    """
    return torch.exp(_sequence_log_ratio(logp, old_logp, mask)).expand_as(logp)


def sequence_token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token ratio (Zheng et al. 2025, eq. 13): ``sg[s_i] * exp(logp - sg[logp])``.

    Value ``s_i`` on every token, gradient through each token's own logp, so per-token
    advantages are possible.  # [B, T]
    """
    s = torch.exp(_sequence_log_ratio(logp, old_logp, mask)).detach()  # [B, 1]
    return s * torch.exp(logp - logp.detach())


RATIOS = {"token": token_ratio, "sequence": sequence_ratio, "sequence_token": sequence_token_ratio}

# --- clip bounds: (old_logp, eps_low, eps_high) -> (lo, hi), each [B, T] ----------------


def symmetric_bounds(old_logp: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """PPO clip ``[1 - eps, 1 + eps]`` with eps = eps_low; eps_high is ignored."""
    return torch.full_like(old_logp, 1.0 - eps_low), torch.full_like(old_logp, 1.0 + eps_low)


def decoupled_bounds(old_logp: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """DAPO clip-higher (Yu et al. 2025, eq. 10): ``[1 - eps_low, 1 + eps_high]``."""
    return torch.full_like(old_logp, 1.0 - eps_low), torch.full_like(old_logp, 1.0 + eps_high)


def dcpo_bounds(
    old_logp: Tensor, eps_low: float, eps_high: float, *, r_max: float = 10.0
) -> tuple[Tensor, Tensor]:
    """DCPO dynamic-adaptive clipping (Yang et al. 2025, sec. 3.2) on the ratio.

    With the old token probability ``q = exp(old_logp)``:
    ``lo = 0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0))``,
    ``hi = min(0.5 + 0.5 sqrt(1 + 4 eps_high / q), r_max)``: rare tokens get wide
    bounds, likely ones approach PPO's. Computed from old_logp, so no gradient.
    """
    q = torch.exp(old_logp.detach())
    lo = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low / q, min=0.0))
    hi = 0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q)
    return lo, hi.clamp(max=r_max)


CLIP_BOUNDS = {"symmetric": symmetric_bounds, "decoupled": decoupled_bounds, "dcpo": dcpo_bounds}


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, lo: Tensor, hi: Tensor, dual_clip: float | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with optional dual clip.

    ``loss = -min(r A, clip(r, lo, hi) A)``; with dual clip c > 1 (Ye et al. 2020, eq. 5)
    negative advantages are further bounded: ``loss = min(loss, -c A)`` where A < 0.
    ratio, lo, hi: broadcastable to ``[B, T]``; advantages ``[B, 1]`` or ``[B, T]``.
    Returns loss ``[B, T]`` and bool flags ``[B, T]`` saying which bound was the active
    term: clipped low (r < lo, A < 0), clipped high (r > hi, A > 0), dual (r > c, A < 0).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    ratio, advantages, lo, hi = torch.broadcast_tensors(ratio, advantages, lo, hi)
    clipped_ratio = torch.minimum(torch.maximum(ratio, lo), hi)
    loss = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
    # the clipped term wins the min only on the pessimistic side of each bound
    is_low = (ratio < lo) & (advantages < 0)
    is_high = (ratio > hi) & (advantages > 0)
    is_dual = torch.zeros_like(is_low)
    if dual_clip is not None:
        dual_bound = -dual_clip * advantages
        is_dual = (advantages < 0) & (dual_bound < loss)
        loss = torch.where(is_dual, dual_bound, loss)
    return loss, is_low, is_high, is_dual


# The per-token losses built on it (ppo_clip, luspo, clip_cov) and the others (CISPO, SAPO,
# ...) are registered in `ops.losses`, where `algo.loss` picks them.


# --- KL estimators (Schulman 2020, "Approximating KL divergence") -----------------------


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Unbiased, can be negative: ``logp - ref_logp``.  # [B, T]"""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``0.5 (logp - ref_logp)^2``.  # [B, T]"""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Unbiased and >= 0: ``exp(ref - logp) - (ref - logp) - 1`` (GRPO, eq. 4).  # [B, T]"""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}

# Ziegler et al. 2019 clip the controller's proportional error to +-0.2 so one noisy step's KL
# moves beta by at most 20% of n / horizon.
KL_ERROR_CLIP = 0.2


def adaptive_kl_beta(beta: float, kl: float, target: float, n: int, horizon: int) -> float:
    """The adaptive KL controller (Ziegler et al. 2019, sec. 2.2): beta moved towards the
    target KL, ``beta * (1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon)`` for a step of
    ``n`` responses."""
    error = max(-KL_ERROR_CLIP, min(KL_ERROR_CLIP, kl / target - 1))
    return beta * (1 + error * n / horizon)


def kl_reward_penalty(logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float) -> Tensor:
    """InstructGPT's KL in the reward: ``beta * k1`` on each response token, 0 off the mask.
    # [B, T]"""
    return beta * kl_k1(logp, ref_logp) * mask


# --- aggregation: (loss, mask, counts, norm_len) -> scalar ----------------------------------
# All four share one signature (so callers pass every count) and ignore what they don't use.
# The counts are of the WHOLE optimiser step (all micro-batches, all ranks), so the values
# returned for the micro-batches of a step sum to the big-batch formula; dividing by a
# micro-batch's own counts is the classic gradient-accumulation bug. Under DDP, which
# averages gradients over ranks, the caller multiplies by the world size.
# A response with no loss tokens (failed reward, overlong filter) adds 0 to every numerator.


@dataclass(frozen=True)
class StepCounts:
    """What an optimiser step's loss is divided by, counted over the whole step."""

    tokens: float  # loss tokens
    # responses with at least one loss token (GRPO's and DCPO's per-response means are over
    # the responses that train)
    seqs: float
    # every sampled response, masked-out ones included (Dr.GRPO's denominator never changes)
    responses: float


def _at_least_one(count: float | Tensor) -> float | Tensor:
    # an empty step has a zero numerator too: give 0, not NaN
    return count.clamp(min=1) if isinstance(count, Tensor) else max(float(count), 1.0)


def _per_seq_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(loss.dtype)
    return (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B], empty row -> 0


def token_mean(loss: Tensor, mask: Tensor, counts: StepCounts, norm_len: float) -> Tensor:
    """DAPO (eq. 8): ``sum_i sum_t l mask / sum_i sum_t mask``."""
    return (loss * mask.to(loss.dtype)).sum() / _at_least_one(counts.tokens)


def seq_mean_token_mean(loss: Tensor, mask: Tensor, counts: StepCounts, norm_len: float) -> Tensor:
    """GRPO (eq. 3), GSPO: ``mean_i (sum_t l mask / sum_t mask)``."""
    return _per_seq_token_mean(loss, mask).sum() / _at_least_one(counts.seqs)


def seq_mean_token_sum_norm(
    loss: Tensor, mask: Tensor, counts: StepCounts, norm_len: float
) -> Tensor:
    """Dr.GRPO (eq. 3): ``mean_i (sum_t l mask / L)`` with a constant L = norm_len, i over
    every sampled response (``counts.responses``), so no response's length or absence
    changes the others' weight."""
    summed = (loss * mask.to(loss.dtype)).sum()
    return summed / (_at_least_one(counts.responses) * norm_len)


def seq_sum_token_mean(loss: Tensor, mask: Tensor, counts: StepCounts, norm_len: float) -> Tensor:
    """DCPO Only-Token-Mean: ``sum_i (sum_t l mask / sum_t mask)``, no mean over i."""
    return _per_seq_token_mean(loss, mask).sum()


AGGREGATIONS = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
    "seq_sum_token_mean": seq_sum_token_mean,
}

# --- other losses and diagnostics --------------------------------------------------------


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13).  # [B] -> [B] float

    0 up to ``max_len - cache_len`` tokens, then a linear ramp to -1 at ``max_len``,
    -1 beyond: the clamp of ``((max_len - cache_len) - |y|) / cache_len`` to [-1, 0].
    """
    expected = max_len - cache_len
    return ((expected - lengths.float()) / cache_len).clamp(min=-1.0, max=0.0)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: float
) -> tuple[Tensor, Tensor]:
    """Clipped value loss (PPO as in InstructGPT/openai baselines).  # [B, T]

    ``0.5 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``; returns the per-token
    loss and where the clipped term was the larger one.
    """
    old_values, returns = old_values.detach(), returns.detach()
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    unclipped_sq = (values - returns) ** 2
    clipped_sq = (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_sq, clipped_sq), clipped_sq > unclipped_sq


def truncated_is_weights(old_logp_learner: Tensor, logp_sampler: Tensor, cap: float) -> Tensor:
    """Truncated importance weights for sampler/learner mismatch (Yao et al. 2025).

    ``min(exp(old_logp_learner - logp_sampler), cap)``, detached.  # [B, T]
    """
    return torch.exp(old_logp_learner - logp_sampler).clamp(max=cap).detach()


def truncated_is_response_weights(
    old_logp_learner: Tensor, logp_sampler: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """The same for a loss per response (GMPO, LUSPO): ``min(exp(mean_t mask*(old_logp_learner
    - logp_sampler)), cap)``, the geometric mean of the token weights (the length-normalised
    sequence ratio of GSPO's, as those losses' own ratios are), detached.  # [B]"""
    return (
        torch.exp(_sequence_log_ratio(old_logp_learner, logp_sampler, mask)[:, 0])
        .clamp(max=cap)
        .detach()
    )


def masked_is_weights(old_logp_proximal: Tensor, logp_behaviour: Tensor, cap: float) -> Tensor:
    """The behaviour correction of AReaL's decoupled PPO (Fu et al. 2025, eq. 5, with its cap):
    ``w = exp(old_logp_proximal - logp_behaviour)`` where ``w <= cap``, else 0 (the token
    leaves the loss instead of counting at the cap), detached.  # [B, T]"""
    w = torch.exp(old_logp_proximal - logp_behaviour)
    return torch.where(w <= cap, w, torch.zeros_like(w)).detach()


def masked_is_response_weights(
    old_logp_proximal: Tensor, logp_behaviour: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """The same for a loss per response: the geometric mean of its tokens' weights where it is
    at most `cap`, else 0 (the response leaves the loss), detached.  # [B]"""
    w = torch.exp(_sequence_log_ratio(old_logp_proximal, logp_behaviour, mask)[:, 0])
    return torch.where(w <= cap, w, torch.zeros_like(w)).detach()


# sampler.is_correction -> (token weights, response weights): what a weight above the cap does.
IS_CORRECTIONS = {
    "truncate": (truncated_is_weights, truncated_is_response_weights),
    "mask": (masked_is_weights, masked_is_response_weights),
}


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """DPO (Rafailov et al. 2023, eq. 7) on summed sequence log-probs, all ``[B]``.

    Implicit rewards ``beta (logpi - logpi_ref)``; loss ``-log sigmoid(r_w - r_l)``.
    Returns (loss per pair ``[B]``, chosen reward ``[B]``, rejected reward ``[B]``), the
    rewards detached for logging.
    """
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    loss = -F.logsigmoid(chosen_reward - rejected_reward)
    return loss, chosen_reward.detach(), rejected_reward.detach()


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[R - V] / Var[R]`` over masked tokens; NaN when Var[R] is 0 (undefined)."""
    mask = mask.bool()
    v, r = values[mask].double(), returns[mask].double()
    var_r = r.var(correction=0) if r.numel() > 0 else r.new_zeros(())
    if var_r == 0:
        return torch.tensor(float("nan"))
    return (1.0 - (r - v).var(correction=0) / var_r).float()
