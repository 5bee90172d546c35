"""The learner: log-probs of sampled tokens, and one optimiser step of the clipped objective.

`policy_objective` assembles the loss from the pieces chosen in the config (ratio level,
clip rule, KL estimator, aggregation) and is pure: tensors in, loss and diagnostics out.
`learn` is the orchestration around it: mini-batches, micro-batches, backward, clipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from rlcli.config import AlgoConfig, SamplerConfig
from rlcli.ops.policy_loss import (
    AGGREGATIONS,
    CLIP_BOUNDS,
    KL_ESTIMATORS,
    RATIOS,
    clipped_surrogate,
    kl_k3,
    truncated_is_weights,
)
from rlcli.rollout import Rollout


@dataclass(frozen=True)
class Objective:
    """The chosen pieces of the policy loss and their coefficients."""

    ratio: Callable
    bounds: Callable
    kl: Callable | None  # None: no KL term (beta = 0)
    aggregate: Callable
    beta: float
    dual_clip: float | None
    entropy_coef: float
    temperature: float = 1.0  # the policy is softmax(logits / temperature), as sampled
    tis_cap: float | None = None  # weight tokens by min(exp(old - sampler), cap); None: off

    @classmethod
    def from_config(cls, algo: AlgoConfig, sampler: SamplerConfig, norm_len: int) -> Objective:
        return cls(
            ratio=RATIOS[algo.ratio],
            bounds=partial(CLIP_BOUNDS[algo.clip], eps_low=algo.eps_low, eps_high=algo.eps_high),
            # KL in the reward (PPO) is applied to the rewards, not here.
            kl=KL_ESTIMATORS[algo.kl] if algo.beta > 0 and algo.kl_in == "loss" else None,
            aggregate=partial(AGGREGATIONS[algo.aggregation], norm_len=norm_len),
            beta=algo.beta,
            dual_clip=algo.dual_clip,
            entropy_coef=algo.entropy_coef,
            temperature=sampler.temperature,
            tis_cap=sampler.tis_cap if sampler.old_logp == "sampler" else None,
        )


def policy_objective(
    obj: Objective,
    logp: Tensor,  # [B, T] under the policy being optimised (has grad)
    old_logp: Tensor,  # [B, T] under the sampling policy
    ref_logp: Tensor | None,  # [B, T] under the reference, when obj.kl is set
    advantages: Tensor,  # [B] or [B, T]
    mask: Tensor,  # [B, T] 1 on tokens that count
    entropy: Tensor,  # [B, T]
    total_tokens: float,  # tokens of the whole optimiser step (all micro-batches)
    total_seqs: float,  # responses of the whole optimiser step
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
    per_token, low, high, dual = clipped_surrogate(ratio, adv, lo, hi, obj.dual_clip)
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
    loss = obj.aggregate(per_token, mask, total_tokens=total_tokens, total_seqs=total_seqs)
    return loss, sums


def token_logprobs(
    model, input_ids, attention_mask, prompt_width, with_entropy=False, temperature=1.0
):
    """Log-prob of each response token under `model`, and the entropy of each prediction.

    Logits are divided by the sampling temperature, so log-probs are those of the
    distribution the sampler drew from.

    Only the response positions go through the LM head (`logits_to_keep`), which skips most
    of its cost on long prompts. Position ids follow the attention mask so left padding does
    not shift positions (as in generate()).  Returns ([B, T], [B, T] or None).
    """
    width = input_ids.shape[1] - prompt_width
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = (
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=width + 1,
            use_cache=False,
        )
        .logits[:, :-1]
        .float()
    )  # [B, T, V]: position t predicts response token t
    log_probs = torch.log_softmax(logits / temperature if temperature != 1 else logits, -1)
    tokens = input_ids[:, prompt_width:]
    logp = log_probs.gather(-1, tokens[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def micro_batches(batch: Rollout, rows: Tensor, size: int):
    """Yield (rows, input_ids, attention_mask, prompt_width, response_mask) trimmed of padding."""
    for start in range(0, len(rows), size):
        idx = rows[start : start + size]
        att = batch.attention_mask[idx]
        mask = batch.response_mask[idx]
        # Drop columns that are padding in every row of this micro-batch.
        left = int((att[:, : batch.prompt_width].sum(0) == 0).long().cumprod(0).sum())
        width = max(int(mask.sum(-1).max()), 1)
        end = batch.prompt_width + width
        yield (
            idx,
            batch.input_ids[idx, left:end],
            att[:, left:end],
            batch.prompt_width - left,
            mask[:, :width],
        )


@torch.no_grad()
def per_token_over_batch(fn, batch: Rollout, size: int) -> Tensor:
    """`fn(input_ids, attention_mask, prompt_width) -> [b, t]` over the batch in micro-batches."""
    out = torch.zeros(batch.response_mask.shape, device=batch.input_ids.device)
    rows = torch.arange(len(batch.texts), device=batch.input_ids.device)
    for idx, ids, att, width, mask in micro_batches(batch, rows, size):
        out[idx, : mask.shape[1]] = fn(ids, att, width)[:, : mask.shape[1]]
    return out


def batch_logprobs(model, batch: Rollout, size: int, temperature: float = 1.0) -> Tensor:
    """Log-probs of every response token under `model` (reference or old policy). [B, T]"""
    return per_token_over_batch(
        lambda ids, att, width: token_logprobs(model, ids, att, width, False, temperature)[0],
        batch,
        size,
    )


def learn(
    model,
    optimizer,
    obj: Objective,
    batch: Rollout,
    advantages: Tensor,  # [B]
    ref_logp: Tensor | None,  # [B, T]
    old_logp: Tensor | None,  # [B, T]; None: a single update, the ratio's base is logp itself
    mini_batches: int,
    micro_batch_size: int,
    max_grad_norm: float,
    scheduler=None,
    aux_loss: Callable[[], Tensor] | None = None,
) -> dict[str, float]:
    """Optimiser steps over `batch` (one per mini-batch); diagnostics averaged over tokens.

    `aux_loss`, when given, is added once per optimiser step (PPO-ptx's language-model loss).
    """
    n = len(batch.texts)
    device = batch.input_ids.device
    totals: dict[str, float] = {}
    losses, grad_norms, skipped = [], [], 0
    for mini in torch.arange(n, device=device).chunk(mini_batches):
        mask_all = batch.response_mask[mini]
        total_tokens = float(mask_all.sum())
        total_seqs = float((mask_all.sum(-1) > 0).sum())
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for idx, ids, att, width, mask in micro_batches(batch, mini, micro_batch_size):
            t = mask.shape[1]
            logp, entropy = token_logprobs(model, ids, att, width, True, obj.temperature)
            old = logp.detach() if old_logp is None else old_logp[idx, :t]
            ref = None if ref_logp is None else ref_logp[idx, :t]
            sampled = None if batch.sampler_logp is None else batch.sampler_logp[idx, :t]
            loss, sums = policy_objective(
                obj, logp, old, ref, advantages[idx], mask, entropy, total_tokens, total_seqs,
                sampled,
            )  # fmt: skip
            loss.backward()
            loss = loss.detach()
            step_loss += loss.item()
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        if aux_loss is not None:
            extra = aux_loss()
            extra.backward()
            totals["aux_loss_sum"] = totals.get("aux_loss_sum", 0.0) + extra.item()
        limit = max_grad_norm if max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit))
        grad_norms.append(grad_norm)
        losses.append(step_loss)
        if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
            # One NaN update would poison every weight; skip it and let the loop count it.
            optimizer.zero_grad(set_to_none=True)
            skipped += 1
            continue
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    tokens = float(batch.response_mask.sum())
    aux = totals.pop("aux_loss_sum", None)
    metrics = {key: value / max(tokens, 1.0) for key, value in totals.items()}
    if aux is not None:
        metrics["ptx/loss"] = aux / mini_batches
    metrics["clip/frac"] = metrics["clip/low"] + metrics["clip/high"] + metrics["clip/dual"]
    metrics["loss"] = sum(losses) / len(losses)
    metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
    metrics["nonfinite/skipped_updates"] = float(skipped)
    return metrics


def lm_loss(model, tokenizer, texts: list[str], max_length: int = 256) -> Tensor:
    """Mean next-token cross-entropy on plain text (PPO-ptx's pretraining term)."""
    tokenizer.padding_side = "right"
    enc = tokenizer(
        texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length
    )
    enc = enc.to(model.device)
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
    return model(**enc, labels=labels, use_cache=False).loss
