"""The learner: the optimiser steps of the clipped objective.

`ops.objective.policy_objective` assembles the loss from the pieces chosen in the config
(`objective_config.objective_from_config`) and is pure: tensors in, loss and diagnostics out.
`learn` is the orchestration around it: a `TrainBatch` cut into mini-batches and
micro-batches as an `UpdatePlan` says, backward, clipping, optimiser steps. The passes'
log-probs come from `forward.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlcli.config import ConfigError
from rlcli.ops.losses import top_entropy_mask
from rlcli.ops.objective import Objective, policy_objective
from rlcli.ops.pieces import PieceError
from rlcli.ops.policy_loss import StepCounts
from rlcli.runtime import distributed
from rlcli.train.forward import attention_of, pass_logprobs
from rlcli.train.passes import passes
from rlcli.train.train_batch import TrainBatch


@dataclass(frozen=True)
class UpdatePlan:
    """How `learn` cuts a batch into optimiser steps and forward/backward passes."""

    mini_batches: int  # optimiser steps per pass over the batch
    micro_batch_size: int  # most rows per forward/backward pass
    max_tokens: int = 0  # most padded tokens per pass (0 = only micro_batch_size limits it)
    max_grad_norm: float = 1.0  # clip the global gradient norm (0 = no clipping)
    share_prompts: bool = True  # a group's prompt read once per pass (`passes`)


def _passes_of(model, obj: Objective, batch: TrainBatch, mini: Tensor, plan: UpdatePlan,
               counts: StepCounts, attention, totals: dict, updated: bool):  # fmt: skip
    """Forward and backward of the objective over mini-batch `mini`, pass by pass, its sums
    added into `totals`; returns (its loss summed on the device, the tokens the passes ran
    over, those that are not padding). `updated`: whether an optimiser step of this batch ran
    already (a piece that fails then says so)."""
    rollout, advantages = batch.rollout, batch.advantages
    # Summed on the device and read once per optimiser step, not once per pass: each read
    # waits for the GPU to finish the pass, and then the GPU waits for the next one's launch.
    step_loss = torch.zeros((), device=rollout.input_ids.device)
    padded = real = 0
    chosen = minibatch_choices(model, obj, batch, mini, plan) if obj.needs_minibatch_stats else {}
    for idx, inputs, mask in passes(
        rollout, mini, plan.micro_batch_size, plan.max_tokens, attention
    ):
        t = mask.shape[1]
        padded, real = padded + inputs.input_ids.numel(), real + inputs.real_tokens
        logp, entropy = pass_logprobs(model, inputs, True, obj.temperature)
        old = logp.detach() if batch.old_logp is None else batch.old_logp[idx, :t]
        ref = None if batch.ref_logp is None else batch.ref_logp[idx, :t]
        sampler_logp = rollout.sampler_logp
        sampled = None if sampler_logp is None else sampler_logp[idx, :t]
        # Per-token advantages (GAE, process rewards) are cut to the micro-batch's width.
        adv = advantages[idx] if advantages.dim() == 1 else advantages[idx, :t]
        try:
            loss, sums = policy_objective(
                obj, logp, old, ref, adv, mask, entropy, counts, sampled,
                **{key: rows[idx, :t] for key, rows in chosen.items()},
            )  # fmt: skip
        except PieceError as err:
            err.updated = updated
            raise
        loss.backward()
        step_loss += loss.detach()
        for key, value in sums.items():
            value = value.detach() if torch.is_tensor(value) else value
            totals[key] = totals.get(key, 0.0) + value
    return step_loss, padded, real


def _step_optimizer(optimizer, plan: UpdatePlan, scheduler, step_loss: float) -> tuple[float, bool]:
    """(the gradient norm, whether the update was applied): clipped to plan.max_grad_norm, and
    skipped when the loss or the norm is not finite (one NaN update would poison every
    weight; the loop counts it)."""
    limit = plan.max_grad_norm if plan.max_grad_norm > 0 else float("inf")
    # The optimiser's parameters: with bfloat16 working weights, the float32 masters hold the
    # gradients (`runtime.precision`).
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
    if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, False
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return grad_norm, True


def learn(
    model,
    optimizer,
    obj: Objective,
    batch: TrainBatch,
    plan: UpdatePlan,
    scheduler=None,
    aux_loss: Callable[[], Tensor] | None = None,
) -> dict[str, float]:
    """Optimiser steps over `batch` (one per mini-batch); diagnostics averaged over tokens.

    `batch.old_logp` None means a single update: the ratio's base is the log-probs themselves.
    `aux_loss`, when given, is added once per optimiser step (PPO-ptx's language-model loss).
    Micro-batches hold at most `plan.micro_batch_size` rows and `plan.max_tokens` padded
    tokens. Under torchrun `batch` is this rank's share: the loss is divided by the token and
    response counts of all ranks, so the gradients summed over ranks are those of the whole
    batch.
    """
    rollout = batch.rollout
    n = len(rollout.texts)
    device = rollout.input_ids.device
    totals: dict[str, float] = {}
    losses, grad_norms, skipped = [], [], 0
    padded = real = 0  # tokens the passes ran over, and those of them that are not padding
    attention = attention_of(model) if plan.share_prompts else None
    for mini in torch.arange(n, device=device).tensor_split(plan.mini_batches):
        if len(mini) == 0 and distributed.world_size() == 1:
            continue  # fewer responses than mini-batches; other ranks may still have some
        mask_all = rollout.response_mask[mini]
        counts = StepCounts(
            tokens=distributed.all_sum(float(mask_all.sum())),
            seqs=distributed.all_sum(float((mask_all.sum(-1) > 0).sum())),
            responses=distributed.all_sum(float(len(mini))),
        )
        optimizer.zero_grad(set_to_none=True)
        updated = len(grad_norms) > skipped
        step_loss, pass_tokens, real_tokens = _passes_of(
            model, obj, batch, mini, plan, counts, attention, totals, updated
        )
        padded, real = padded + pass_tokens, real + real_tokens
        if aux_loss is not None:
            extra = aux_loss()
            extra.backward()
            totals["aux_loss_sum"] = totals.get("aux_loss_sum", 0.0) + extra.item()
        step_loss = distributed.all_sum(float(step_loss))  # each rank's is its share
        grad_norm, applied = _step_optimizer(optimizer, plan, scheduler, step_loss)
        grad_norms.append(grad_norm)
        losses.append(step_loss)
        skipped += not applied
    metrics = per_token(read_once(totals), float(rollout.response_mask.sum()), plan)
    metrics["loss/policy"] = sum(losses) / len(losses)
    metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
    metrics["nonfinite/skipped_updates"] = float(skipped)
    metrics["batch/padding_frac"] = 1 - real / max(padded, 1)
    metrics["batch/learner_tokens"] = float(real)
    return metrics


def per_token(totals: dict[str, float], tokens: float, plan: UpdatePlan) -> dict[str, float]:
    """The objective's sums as means over the batch's response tokens; PPO-ptx's loss as its
    mean over the optimiser steps; clip/frac from its three parts."""
    aux = totals.pop("aux_loss_sum", None)
    metrics = {key: value / max(tokens, 1.0) for key, value in totals.items()}
    if aux is not None:
        metrics["ptx/loss"] = aux / plan.mini_batches
    if "clip/low" in metrics:  # losses that clip (PPO's and its kin)
        metrics["clip/frac"] = metrics["clip/low"] + metrics["clip/high"] + metrics["clip/dual"]
    return metrics


def read_once(values: dict) -> dict[str, float]:
    """`values` (numbers, or scalar tensors on one device) as floats, with one read from the
    device for all the tensors."""
    out = {key: float(value) for key, value in values.items() if not torch.is_tensor(value)}
    keys = [key for key in values if key not in out]
    if keys:
        device = values[keys[0]].device
        read = torch.stack([values[key].to(device).float().reshape(()) for key in keys])
        out.update(zip(keys, read.tolist(), strict=True))
    return {key: out[key] for key in values}


@torch.no_grad()
def minibatch_choices(model, obj: Objective, batch: TrainBatch, mini: Tensor, plan: UpdatePlan):
    """The tokens chosen over the whole mini-batch `mini` before its passes, so the choice does
    not depend on how it is split: the loss's `select` (Clip-Cov, KL-Cov) and the top-entropy
    tokens, from the current policy's log-probs and entropies (one extra pass without
    gradient). Returns {"selected" / "trained": bool [B, T]} over the batch's rows."""
    if distributed.world_size() > 1:
        raise ConfigError(
            f"algo.loss={obj.loss.name} and algo.top_entropy choose tokens over the whole "
            "mini-batch, which is not gathered across torchrun ranks yet: run on one process."
        )
    rollout = batch.rollout
    logp = torch.zeros(rollout.response_mask.shape, device=rollout.input_ids.device)
    entropy = torch.zeros_like(logp)
    attention = attention_of(model) if plan.share_prompts else None
    for idx, inputs, mask in passes(
        rollout, mini, plan.micro_batch_size, plan.max_tokens, attention
    ):
        t = mask.shape[1]
        lp, ent = pass_logprobs(model, inputs, True, obj.temperature)
        logp[idx, :t], entropy[idx, :t] = lp.float(), ent.float()
    mask = rollout.response_mask[mini].to(logp.dtype)
    adv = batch.advantages[mini]
    adv = (adv[:, None] if adv.dim() == 1 else adv).expand_as(mask)
    old = logp[mini] if batch.old_logp is None else batch.old_logp[mini]
    chosen = {}
    if obj.select is not None:
        settings = {**obj.loss.settings, **obj.loss_settings}
        lo, hi = obj.bounds(old)  # the clip the loss applies, so "already clipped" is its own
        ratio = obj.ratio(logp[mini], old, mask)
        picked = obj.select(adv, logp[mini], mask, ratio, lo, hi, **settings)
        chosen["selected"] = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
        chosen["selected"][mini] = picked
    if obj.top_entropy > 0:
        chosen["trained"] = torch.zeros_like(rollout.response_mask, dtype=torch.bool)
        chosen["trained"][mini] = top_entropy_mask(entropy[mini], mask, obj.top_entropy)
    return chosen


def lm_loss(model, tokenizer, texts: list[str], max_length: int = 256) -> Tensor:
    """Mean next-token cross-entropy on plain text (PPO-ptx's pretraining term)."""
    enc = tokenizer(
        texts,
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=max_length,
        padding_side="right",
    )
    enc = enc.to(model.device)
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
    return model(**enc, labels=labels, use_cache=False).loss
