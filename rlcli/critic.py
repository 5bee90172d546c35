"""PPO's critic: a value model, GAE advantages with KL in the reward, and its update.

The critic is the policy's architecture with a one-output token-classification head
(`AutoModelForTokenClassification`, num_labels=1), initialised from the policy's weights or
from `algo.critic_path`; the head starts random. V(s_t) is read at the position that
predicts response token t, the same positions as the policy's log-probs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcli.learner import micro_batches, per_token_over_batch
from rlcli.ops.advantages import gae, ppo_token_rewards
from rlcli.ops.policy_loss import explained_variance, value_loss
from rlcli.rollout import Rollout


def load_critic(path: str, dtype: str, device: torch.device, new_head: bool):
    """The value model; `new_head`: zero the value head so that V = 0 at first.

    A randomly initialised head gives each token a random value, and GAE turns the
    differences between neighbouring values into advantage noise far larger than the
    reward's own spread; starting from V = 0 the first advantages are plain returns.
    """
    from transformers import AutoModelForTokenClassification, logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the missing value head is expected, not worth a report
    critic = AutoModelForTokenClassification.from_pretrained(
        path, num_labels=1, dtype=getattr(torch, dtype)
    ).to(device)
    logging.set_verbosity(verbosity)
    if new_head:
        head = getattr(critic, "score", None) or critic.classifier
        torch.nn.init.zeros_(head.weight)
        if head.bias is not None:
            torch.nn.init.zeros_(head.bias)
    critic.eval()  # no dropout, as for the policy
    if critic.config.pad_token_id is None:
        critic.config.pad_token_id = critic.config.eos_token_id
    return critic


def token_values(critic, input_ids, attention_mask, prompt_width) -> Tensor:
    """V at the positions predicting each response token. [B, T]"""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = critic(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits  # [B, L, 1]
    return logits[:, prompt_width - 1 : -1, 0].float()


def batch_values(critic, batch: Rollout, size: int) -> Tensor:
    """V at every response position, without gradient. [B, T]"""
    return per_token_over_batch(
        lambda ids, att, width: token_values(critic, ids, att, width), batch, size
    )


def gae_advantages(
    scores: Tensor,  # [B] sequence rewards
    old_logp: Tensor,  # [B, T]
    ref_logp: Tensor | None,  # [B, T]; None: no KL penalty
    values: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    beta: float,
    gamma: float,
    lam: float,
    whiten: bool,
) -> tuple[Tensor, Tensor]:
    """InstructGPT token rewards (-beta*k1, score at the end), then GAE -> (advantages, returns).

    Whitening (mean 0, std 1 over the batch's response tokens) follows the common PPO
    implementations (OpenAI baselines, verl); the spec leaves it open.
    """
    k1 = old_logp - ref_logp if ref_logp is not None else torch.zeros_like(old_logp)
    rewards = ppo_token_rewards(k1, mask, scores, beta if ref_logp is not None else 0.0)
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    if whiten:
        m = mask.bool()
        mean, std = advantages[m].mean(), advantages[m].std()
        advantages = torch.where(m, (advantages - mean) / (std + 1e-8), 0.0)
    return advantages, returns


def learn_critic(
    critic, optimizer, batch: Rollout, old_values, returns, value_clip, vf_coef, size, max_norm
) -> dict[str, float]:
    """One optimiser step of the clipped value loss (token mean over the batch)."""
    optimizer.zero_grad(set_to_none=True)
    total = float(batch.response_mask.sum())
    rows = torch.arange(len(batch.texts), device=batch.input_ids.device)
    loss_sum, clipped = 0.0, 0.0
    for idx, ids, att, width, mask in micro_batches(batch, rows, size):
        t = mask.shape[1]
        values = token_values(critic, ids, att, width)
        per_token, is_clipped = value_loss(
            values, old_values[idx, :t], returns[idx, :t], value_clip
        )
        loss = vf_coef * (per_token * mask).sum() / max(total, 1.0)
        loss.backward()
        loss_sum += loss.item()
        clipped += float((is_clipped * mask).sum())
    torch.nn.utils.clip_grad_norm_(critic.parameters(), max_norm if max_norm > 0 else float("inf"))
    optimizer.step()
    ev = explained_variance(old_values, returns, batch.response_mask)
    return {
        "value/loss": loss_sum,
        "value/clip_frac": clipped / max(total, 1.0),
        "value/explained_variance": float(ev),
    }
