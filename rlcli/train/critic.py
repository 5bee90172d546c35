"""PPO's critic: a value model, its values, and its update (GAE itself is `ops.advantages`).

The critic is the policy's architecture with a one-output token-classification head
(`AutoModelForTokenClassification`, num_labels=1), initialised from the policy's weights or
from `algo.critic_path`; the head starts random. V(s_t) is read at the position that
predicts response token t, the same positions as the policy's log-probs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcli.config import LoraConfig
from rlcli.ops.policy_loss import explained_variance, value_loss
from rlcli.rollout.batch import Rollout
from rlcli.runtime.lora import add_adapters, load_adapters
from rlcli.train.forward import per_token_over_batch
from rlcli.train.learner import UpdatePlan
from rlcli.train.passes import micro_batches
from rlcli.train.train_batch import TrainBatch


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


def make_critic(path: str, dtype: str, device, new_head: bool, lora: LoraConfig, checkpoint):
    """The critic of a run: `load_critic(path)`, or the one saved in `checkpoint/critic` when
    resuming. With LoRA it gets adapters of its own (fresh, or the checkpoint's) and its value
    head is trained whole beside them (saved with the adapters)."""
    if checkpoint is not None and not lora.rank:
        return load_critic(str(checkpoint / "critic"), dtype, device, new_head=False)
    critic = load_critic(path, dtype, device, new_head)
    if lora.rank:
        head = "score" if hasattr(critic, "score") else "classifier"
        if checkpoint is None:
            add_adapters(critic, lora, keep=(head,))
        else:
            load_adapters(critic, checkpoint / "critic")
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


def learn_critic(
    critic, optimizer, batch: TrainBatch, value_clip: float, vf_coef: float, plan: UpdatePlan
) -> dict[str, float]:
    """One optimiser step of the clipped value loss (token mean over the batch) towards
    `batch.returns`, clipped around `batch.old_values`."""
    rollout, old_values, returns = batch.rollout, batch.old_values, batch.returns
    optimizer.zero_grad(set_to_none=True)
    total = float(rollout.response_mask.sum())
    rows = torch.arange(len(rollout.texts), device=rollout.input_ids.device)
    loss_sum, clipped = 0.0, 0.0
    for idx, ids, att, width, mask in micro_batches(rollout, rows, plan.micro_batch_size):
        t = mask.shape[1]
        values = token_values(critic, ids, att, width)
        per_token, is_clipped = value_loss(
            values, old_values[idx, :t], returns[idx, :t], value_clip
        )
        loss = vf_coef * (per_token * mask).sum() / max(total, 1.0)
        loss.backward()
        loss_sum += loss.item()
        clipped += float((is_clipped * mask).sum())
    limit = plan.max_grad_norm if plan.max_grad_norm > 0 else float("inf")
    torch.nn.utils.clip_grad_norm_(critic.parameters(), limit)
    optimizer.step()
    ev = explained_variance(old_values, returns, rollout.response_mask)
    return {
        "value/loss": loss_sum,
        "value/clip_frac": clipped / max(total, 1.0),
        "value/explained_variance": float(ev),
    }
