"""Advantage estimators (docs/algorithms.md; each cites its paper).

Outcome estimators take the rewards of P groups of G samples, ``[P, G]``, and return one
advantage per response, ``[P, G]``; the caller broadcasts it over the response's tokens. A
group whose rewards are all equal gets exactly 0 from every one (`_zero_constant_groups`).
``ADVANTAGES`` is the registry `algo.advantage` picks from, each entry registered by
`@register_advantage` above its definition with its settings (`algo.advantage_settings`);
`ops.estimate.estimate` calls it, and handles failed rewards.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlcli.ops.pieces import Piece, registrar
from rlcli.ops.sas import SasState, SasTracker, sas_advantages  # noqa: F401 - DCPO's, re-exported

GRPO_EPS = 1e-6


def _zero_constant_groups(adv: Tensor, rewards: Tensor) -> Tensor:
    """Force exact zeros on groups whose rewards are all equal (``[P, G]``): such a group
    carries no learning signal, and float rounding in ``R - mean`` must not invent one."""
    constant = rewards.amax(dim=-1, keepdim=True) == rewards.amin(dim=-1, keepdim=True)
    return torch.where(constant, torch.zeros_like(adv), adv)


def grpo_advantages(rewards: Tensor) -> Tensor:
    """GRPO outcome advantage (DeepSeekMath, Shao et al. 2024, sec. 4.1.2).

    ``A_i = (R_i - mean(R)) / (std(R) + 1e-6)`` within each group, std Bessel-corrected.
    rewards: ``[P, G]`` -> ``[P, G]``.
    """
    mean = rewards.mean(dim=-1, keepdim=True)
    std = rewards.std(dim=-1, keepdim=True)
    return _zero_constant_groups((rewards - mean) / (std + GRPO_EPS), rewards)


def dr_grpo_advantages(rewards: Tensor) -> Tensor:
    """Dr.GRPO advantage (Liu et al. 2025, eq. 3): ``A_i = R_i - mean(R)``, no std.

    rewards: ``[P, G]`` -> ``[P, G]``.
    """
    return _zero_constant_groups(rewards - rewards.mean(dim=-1, keepdim=True), rewards)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): ``A_i = R_i - mean_{j != i} R_j``.

    rewards: ``[P, G]`` with G >= 2 -> ``[P, G]``.
    """
    group = rewards.shape[-1]
    if group < 2:
        raise ValueError(f"rloo needs at least 2 samples per prompt, got G={group}")
    others_mean = (rewards.sum(dim=-1, keepdim=True) - rewards) / (group - 1)
    return _zero_constant_groups(rewards - others_mean, rewards)


def ppo_token_rewards(kl_k1: Tensor, mask: Tensor, scores: Tensor, beta: float) -> Tensor:
    """InstructGPT per-token reward (Ouyang et al. 2022, eq. 2 spread over tokens).

    ``r_t = -beta * k1_t`` on every response token, plus the reward-model score at the
    last response token of each row. A row without response tokens gets no score.
    kl_k1, mask: ``[B, T]``; scores: ``[B]`` -> ``[B, T]``.
    """
    mask = mask.to(kl_k1.dtype)
    rewards = -beta * kl_k1 * mask  # [B, T]
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device, dtype=mask.dtype)
    last = (mask * positions).amax(dim=-1).long() - 1  # [B], -1 for an empty row
    has_tokens = last >= 0
    bonus = (scores.to(rewards.dtype) * has_tokens).unsqueeze(-1)  # [B, 1]
    return rewards.scatter_add(-1, last.clamp(min=0).unsqueeze(-1), bonus)


@torch.no_grad()
def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16).

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``,
    returns ``= A + V``. Rows are right-padded (mask ones then zeros); the value after
    the last response token is 0 (the episode ends there). Zeros inside a row (tool turns of
    a multi-turn episode) are skipped: the model's tokens on either side are consecutive
    steps, since a tool turn is the environment's move, not the policy's. Computed without
    gradient. token_rewards, values, mask: ``[B, T]`` -> (advantages ``[B, T]``, returns
    ``[B, T]``), both 0 where mask is 0.
    """
    # The model's tokens moved to the front of each row, in order (identity for right-padded
    # rows), and the results put back where they came from.
    order = torch.argsort((mask == 0).to(torch.int8), dim=-1, stable=True)
    advantages, returns = _gae_packed(
        token_rewards.gather(-1, order),
        values.gather(-1, order),
        mask.gather(-1, order),
        gamma,
        lam,
    )
    unpack = torch.zeros_like(advantages)
    return unpack.scatter(-1, order, advantages), unpack.scatter(-1, order, returns)


def _gae_packed(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    mask = mask.to(values.dtype)
    rewards = token_rewards * mask
    values = values * mask  # zero past the end, so V_{T+1} = 0 needs no special case
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=-1)
    deltas = rewards + gamma * next_values - values  # [B, T]
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])  # [B]
    for t in reversed(range(values.shape[-1])):
        running = deltas[:, t] + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def grpo_process_advantages(step_rewards: Tensor, step_end_mask: Tensor) -> Tensor:
    """GRPO with process supervision (DeepSeekMath, sec. 4.1.3).

    For ONE group (B = G responses of one prompt): every step-end reward is normalised by
    the mean and Bessel-corrected std (+1e-6) of all step-end rewards in the group, then
    each token's advantage is the sum of the normalised rewards of the step ends at or
    after it: ``A[i, t] = sum_{j >= t, step_end[i, j]} r~[i, j]``. Tokens after a
    response's last step end get 0; a group whose step rewards are all equal (or that
    has fewer than 2 of them) gets 0 everywhere.
    step_rewards: ``[B, T]`` float, read only where step_end_mask ``[B, T]`` (bool) is
    True -> ``[B, T]``.
    """
    step_end_mask = step_end_mask.bool()
    scores = step_rewards[step_end_mask]  # [N] all step ends of the group
    if scores.numel() < 2 or scores.amax() == scores.amin():
        return torch.zeros_like(step_rewards)
    normed = (step_rewards - scores.mean()) / (scores.std() + GRPO_EPS)
    normed = torch.where(step_end_mask, normed, torch.zeros_like(normed))  # [B, T]
    # reverse cumulative sum along time: flip, cumsum, flip back
    return normed.flip(-1).cumsum(-1).flip(-1)


# --- the registry: one function of `AdvantageInputs` per estimator ----------------------------


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read about one step's batch.

    B responses in consecutive groups of ``group_size`` (one prompt each), T response tokens.
    The KL-in-reward penalty (PPO, ``algo.kl_in=reward``) arrives as ``kl_penalty``, computed
    once by the caller; ``sequence_rewards`` and ``token_rewards`` apply it for outcome and
    token-level estimators alike.
    """

    scores: Tensor  # [B] the reward of each response; NaN where it failed
    kl_penalty: Tensor  # [B, T] beta * k1 on response tokens (zeros when the KL is not a reward)
    mask: Tensor  # [B, T] 1 on response tokens that count
    group_size: int
    prompt_ids: list[str]  # [B] the prompt each response answers
    # The estimator's own state across steps (what its `Piece.state` made; DCPO's per-prompt
    # statistics), or None.
    state: object | None = None
    values: Tensor | None = None  # [B, T] the critic's values (gae)
    step_rewards: Tensor | None = None  # [B, T] a step's reward where it ends, else NaN
    lengths: Tensor | None = None  # [B] tokens each response holds, before any filter (opo)
    greedy_scores: Tensor | None = None  # [B] the greedy response's reward, same prompt (remax)

    @property
    def sequence_rewards(self) -> Tensor:
        """``R_i - sum_t kl_penalty[i, t]``.  # [B]"""
        return self.scores.to(self.kl_penalty.device) - self.kl_penalty.sum(-1)

    @property
    def token_rewards(self) -> Tensor:
        """InstructGPT's per-token reward: ``-kl_penalty`` on every token, the score at the
        last (`ppo_token_rewards` with the penalty already scaled).  # [B, T]"""
        scores = self.scores.nan_to_num(0.0).to(self.kl_penalty.device)
        return ppo_token_rewards(self.kl_penalty, self.mask, scores, 1.0)


def per_group(x: AdvantageInputs, estimator: Callable[[Tensor], Tensor]) -> tuple[Tensor, None]:
    """An outcome estimator over ``[P, G]`` groups of `sequence_rewards`, as a registry entry
    returns it: one advantage per response, ``[B]``."""
    return estimator(x.sequence_rewards.view(-1, x.group_size)).flatten(), None


ADVANTAGES: dict[str, Piece] = {}
# `@register_advantage(name, needs=...)`: a function of one `AdvantageInputs` (named `x`) and
# its settings (keyword-only, with defaults) returning (advantages [B] or [B, T], returns or
# None); `needs` as in `ops.pieces`.
register_advantage = registrar(ADVANTAGES, ("x",))


@register_advantage("grpo", needs=("groups", "response_advantage"))
def grpo(x: AdvantageInputs):
    """GRPO: (R - mean) / (std + 1e-6)."""
    return per_group(x, grpo_advantages)


@register_advantage("dr_grpo", needs=("groups", "response_advantage"))
def dr_grpo(x: AdvantageInputs):
    """Dr.GRPO: R - mean, no std."""
    return per_group(x, dr_grpo_advantages)


@register_advantage("rloo", needs=("groups", "response_advantage"))
def rloo(x: AdvantageInputs):
    """RLOO: R - the others' mean."""
    return per_group(x, rloo_advantages)


@register_advantage("dcpo_sas", needs=("groups", "response_advantage"), state=SasTracker)
def dcpo_sas(x: AdvantageInputs):
    """DCPO's SAS: standardised rewards smoothed over each prompt's visits (state in x.state)."""
    return per_group(x, lambda rewards: x.state(x.prompt_ids[:: x.group_size], rewards))


@register_advantage("gae", needs=("critic",))
def gae_advantages(
    x: AdvantageInputs, *, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True
) -> tuple[Tensor, Tensor]:
    """PPO: GAE over the token rewards and the critic's values (returns too).

    gamma, lam: GAE's discount and lambda (InstructGPT: 1 and 0.95). whiten: mean 0, std 1
    over the batch's response tokens, as the common PPO implementations do (OpenAI baselines,
    verl); the spec leaves it open.
    """
    advantages, returns = gae(x.token_rewards, x.values, x.mask, gamma, lam)
    if whiten:
        m = x.mask.bool()
        mean, std = advantages[m].mean(), advantages[m].std()
        advantages = torch.where(m, (advantages - mean) / (std + 1e-8), 0.0)
    return advantages, returns


@register_advantage("grpo_process", needs=("groups", "step_rewards"))
def process_advantages(x: AdvantageInputs) -> tuple[Tensor, None]:
    """GRPO with process supervision: normalised step rewards summed after each token.

    Group by group, from ``step_rewards``.  # [B, T]"""
    ends = ~x.step_rewards.isnan()
    rewards = x.step_rewards.nan_to_num(0.0)
    size = x.group_size
    per_group = zip(rewards.split(size), ends.split(size), strict=True)
    return torch.cat([grpo_process_advantages(r, e) for r, e in per_group]), None


# --- the peers' estimators (docs/algorithms.md, "Advantage estimators") -------------------------


def whiten_tokens(values: Tensor, mask: Tensor) -> Tensor:
    """(v - mean) / sqrt(var + 1e-8) over every masked token of the batch, each weighing one,
    var Bessel-corrected, computed in float64; 0 off the mask, and everywhere when fewer than 2
    tokens count or all of them hold the same value."""
    m = mask.bool()
    dtype = torch.promote_types(values.dtype, torch.float32)
    picked = values[m]
    if picked.numel() < 2 or picked.amax() == picked.amin():  # no spread: exactly no signal
        return torch.zeros_like(values, dtype=dtype)
    # In float64: in float32 the mean's rounding, divided by a tiny std, invents advantages.
    wide = values.double()
    whitened = (wide - picked.double().mean()) / torch.sqrt(picked.double().var() + 1e-8)
    return torch.where(m, whitened, 0.0).to(dtype)


@register_advantage("reinforce_pp", needs=("whole_batch",))
def reinforce_pp(x: AdvantageInputs, *, gamma: float = 1.0):
    """REINFORCE++ (arXiv 2501.03262): PPO's token-reward returns, whitened over the batch.

    G_t = sum_{s >= t} gamma^(s - t) r_s (the paper's gamma is 1); no critic, no groups."""
    # GAE with no values and lambda 1 is exactly the discounted return, tool turns skipped.
    returns, _ = gae(x.token_rewards, torch.zeros_like(x.token_rewards), x.mask, gamma, 1.0)
    return whiten_tokens(returns, x.mask), None


@register_advantage("reinforce_pp_baseline", needs=("whole_batch",))
def reinforce_pp_baseline(x: AdvantageInputs):
    """REINFORCE++-baseline: R minus its group's mean, whitened over the batch's tokens.

    A group of one subtracts 0; the value is the same on each of a response's tokens."""
    groups = x.sequence_rewards.view(-1, x.group_size)
    baseline = groups.nanmean(-1, keepdim=True) if x.group_size > 1 else torch.zeros_like(groups)
    centred = (groups - baseline).flatten().nan_to_num(0.0)  # failed rewards: masked anyway
    return whiten_tokens(centred[:, None].expand(x.mask.shape), x.mask), None


@register_advantage("opo", needs=("groups", "response_advantage", "on_policy"))
def opo(x: AdvantageInputs):
    """OPO (arXiv 2505.23585): R minus the group's length-weighted mean reward.

    The lengths are those before any filter masks a response."""
    rewards = x.sequence_rewards.view(-1, x.group_size)
    lengths = x.lengths.to(rewards.dtype).view(-1, x.group_size)
    scored = ~rewards.isnan()
    weights = lengths * scored
    total = (weights * rewards.nan_to_num(0.0)).sum(-1, keepdim=True)
    baseline = total / weights.sum(-1, keepdim=True).clamp(min=1)
    low = torch.where(scored, rewards, torch.inf).amin(-1, keepdim=True)
    high = torch.where(scored, rewards, -torch.inf).amax(-1, keepdim=True)
    signal = scored & (low < high)  # equal rewards: exactly 0, whatever the weighted rounding
    return torch.where(signal, rewards - baseline, 0.0).flatten(), None


@register_advantage("remax", needs=("greedy", "response_advantage"))
def remax(x: AdvantageInputs):
    """ReMax (arXiv 2310.10505): R minus the reward of the policy's greedy response.

    The greedy response to the same prompt is sampled and scored in the same step and not
    trained on; no groups needed. When the greedy reward failed there is no baseline: the
    prompt's response gets 0, as an unscored one does."""
    greedy = x.greedy_scores.to(x.scores.device)
    return (x.sequence_rewards - greedy).nan_to_num(0.0), None


@register_advantage("gpg", needs=("groups", "response_advantage", "whole_batch"))
def gpg(x: AdvantageInputs):
    """GPG (arXiv 2504.02546): alpha (R - group mean), alpha = B / max(1, B - M).

    M counts the responses in groups whose rewards are all equal (the paper's count, not
    verl's R != 0)."""
    groups = x.sequence_rewards.view(-1, x.group_size)
    scored = ~groups.isnan()
    low = torch.where(scored, groups, torch.inf).amin(-1)
    high = torch.where(scored, groups, -torch.inf).amax(-1)
    flat = (low == high) | (scored.sum(-1) < 2)  # no gradient from these groups
    # R minus its group's mean over the scored responses (Dr.GRPO's), exactly 0 in flat groups
    mean = groups.nan_to_num(0.0).sum(-1, keepdim=True) / scored.sum(-1, keepdim=True).clamp(min=1)
    centred = torch.where(scored & ~flat[:, None], groups - mean, 0.0).flatten()
    total = float(groups.numel())
    alpha = total / max(1.0, total - float(flat.sum()) * x.group_size)
    return alpha * centred, None
