"""The learner: log-probs of sampled tokens, and the optimiser steps of the clipped objective.

`ops.objective.policy_objective` assembles the loss from the pieces chosen in the config
(`objective_from_config`) and is pure: tensors in, loss and diagnostics out. `learn` is the
orchestration around it: a `TrainBatch` cut into mini-batches and micro-batches as an
`UpdatePlan` says, backward, clipping, optimiser steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from rlcli.config import AlgoConfig, ConfigError, SamplerConfig
from rlcli.ops.logprobs import chunked_logprob_entropy, plain_logprob_entropy
from rlcli.ops.losses import SELECT, top_entropy_mask
from rlcli.ops.objective import Objective, policy_objective
from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS, StepCounts
from rlcli.rollout.batch import Rollout
from rlcli.runtime import distributed
from rlcli.train.batch import TrainBatch
from rlcli.train.pieces import loss_piece


@dataclass(frozen=True)
class UpdatePlan:
    """How `learn` cuts a batch into optimiser steps and forward/backward passes."""

    mini_batches: int  # optimiser steps per pass over the batch
    micro_batch_size: int  # most rows per forward/backward pass
    max_tokens: int = 0  # most padded tokens per pass (0 = only micro_batch_size limits it)
    max_grad_norm: float = 1.0  # clip the global gradient norm (0 = no clipping)


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
        select=SELECT.get(loss.name) if "minibatch_stats" in loss.needs else None,
        top_entropy=algo.top_entropy,
        temperature=sampler.temperature,
        tis_cap=sampler.tis_cap if sampler.old_logp == "sampler" else None,
    )


class TokenLogprobModel(nn.Module):
    """A causal LM whose forward returns the log-probs (and entropies) of given response tokens.

    The learner calls the policy through this module: the chunked head reads the LM head's
    weight outside the Hugging Face forward, and FSDP2 gathers a module's parameters only in
    that module's own forward, so under torchrun this wrapper is the sharded root
    (`distributed.shard`). Its forward is `lm_token_logprobs`.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, prompt_width, with_entropy=False, temperature=1.0):
        logp, entropy = lm_token_logprobs(
            self.lm, input_ids, attention_mask, prompt_width, with_entropy, temperature
        )
        # Fresh tensors, not views: FSDP2 hooks the root's outputs for its backward.
        return logp.clone(), None if entropy is None else entropy.clone()


def token_logprobs(
    model, input_ids, attention_mask, prompt_width, with_entropy=False, temperature=1.0
):
    """`lm_token_logprobs` of a causal LM, or of the LM inside a `TokenLogprobModel`."""
    if isinstance(model, TokenLogprobModel):
        return model(input_ids, attention_mask, prompt_width, with_entropy, temperature)
    return lm_token_logprobs(
        model, input_ids, attention_mask, prompt_width, with_entropy, temperature
    )


# Config fields of heads that are more than `hidden @ weight.T + bias` (Gemma's soft-capping,
# Cohere's and Granite's logit scales): such models take the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def lm_token_logprobs(
    lm, input_ids, attention_mask, prompt_width, with_entropy=False, temperature=1.0
):
    """Log-prob of each response token under `lm`, and the entropy of each prediction.

    Logits are divided by the sampling temperature, so log-probs are those of the
    distribution the sampler drew from. The body runs once; the LM head is applied to the
    response positions only, a chunk of tokens at a time (`ops.logprobs`), so the
    [tokens, vocabulary] logits of the whole micro-batch never exist at once. Position ids
    follow the attention mask so left padding does not shift positions (as in generate()).
    Returns ([B, T], [B, T] or None).
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tokens = input_ids[:, prompt_width:]  # [B, T]
    head = lm.get_output_embeddings()
    if not isinstance(head, nn.Linear) or any(
        getattr(lm.config, name, None) for name in _LOGIT_TRANSFORMS
    ):
        logits = lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=tokens.shape[1] + 1,
            use_cache=False,
        ).logits[:, :-1]  # [B, T, V]: position t predicts response token t
        logp, entropy = plain_logprob_entropy(logits, tokens, temperature)
        return logp, entropy if with_entropy else None
    hidden = lm.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state[:, prompt_width - 1 : -1]  # [B, T, H]
    logp, entropy = chunked_logprob_entropy(
        hidden.reshape(-1, hidden.shape[-1]),
        head.weight,
        tokens.reshape(-1),
        head.bias,
        temperature,
        with_entropy=with_entropy,
    )
    return logp.view_as(tokens), entropy.view_as(tokens) if with_entropy else None


def plan_micro_batches(
    prompt_lengths: list[int], response_lengths: list[int], max_rows: int, max_tokens: int
) -> list[list[int]]:
    """Positions into the length lists, grouped into micro-batches.

    Rows are sorted by (response, prompt) length, so each micro-batch holds rows of similar
    length; a micro-batch takes at most `max_rows` rows and, padded to its longest prompt and
    response, at most `max_tokens` tokens (0 = no token limit; a single longer row goes alone).
    """
    order = sorted(
        range(len(prompt_lengths)), key=lambda i: (response_lengths[i], prompt_lengths[i])
    )
    plan: list[list[int]] = []
    current: list[int] = []
    widest_prompt = widest_response = 0
    for i in order:
        prompt = max(widest_prompt, prompt_lengths[i])
        response = max(widest_response, response_lengths[i], 1)
        too_many = len(current) == max_rows
        too_long = max_tokens > 0 and (len(current) + 1) * (prompt + response) > max_tokens
        if current and (too_many or too_long):
            plan.append(current)
            current, prompt, response = [], prompt_lengths[i], max(response_lengths[i], 1)
        current.append(i)
        widest_prompt, widest_response = prompt, response
    if current:
        plan.append(current)
    return plan


def response_spans(response_mask: Tensor) -> Tensor:
    """Columns up to each row's last trained token: its length, and with tools the tool turns
    inside it too (context the learner must read, though it does not train on them).  # [B]"""
    positions = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    return (response_mask.long() * positions).amax(-1)


def micro_batches(batch: Rollout, rows: Tensor, size: int, max_tokens: int = 0):
    """Yield (rows, input_ids, attention_mask, prompt_width, response_mask) trimmed of padding,
    `rows` split by `plan_micro_batches`.

    Under torchrun every rank must run as many forward passes as the others (each one gathers
    the sharded weights): a rank with fewer micro-batches adds passes over one of its rows with
    an all-zero response mask, which add nothing to the loss or the diagnostics.
    """
    prompt_lengths = batch.attention_mask[rows, : batch.prompt_width].sum(-1).tolist()
    response_lengths = response_spans(batch.response_mask[rows]).tolist()
    plan = plan_micro_batches(prompt_lengths, response_lengths, size, max_tokens)
    parts = [(rows[positions], True) for positions in plan]
    spare = rows[:1] if len(rows) else torch.zeros(1, dtype=torch.long, device=rows.device)
    parts += [(spare, False)] * (distributed.all_max(len(plan)) - len(plan))
    for idx, counts in parts:
        att = batch.attention_mask[idx]
        mask = batch.response_mask[idx] if counts else torch.zeros_like(batch.response_mask[idx])
        # Drop columns that are padding in every row of this micro-batch.
        left = int((att[:, : batch.prompt_width].sum(0) == 0).long().cumprod(0).sum())
        width = max(int(response_spans(batch.response_mask[idx]).max()), 1)
        end = batch.prompt_width + width
        yield (
            idx,
            batch.input_ids[idx, left:end],
            att[:, left:end],
            batch.prompt_width - left,
            mask[:, :width],
        )


@torch.no_grad()
def per_token_over_batch(fn, batch: Rollout, size: int, max_tokens: int = 0) -> Tensor:
    """`fn(input_ids, attention_mask, prompt_width) -> [b, t]` over the batch in micro-batches."""
    out = torch.zeros(batch.response_mask.shape, device=batch.input_ids.device)
    rows = torch.arange(len(batch.texts), device=batch.input_ids.device)
    for idx, ids, att, width, mask in micro_batches(batch, rows, size, max_tokens):
        out[idx, : mask.shape[1]] = fn(ids, att, width)[:, : mask.shape[1]]
    return out


def batch_logprobs(
    model, batch: Rollout, size: int, temperature: float = 1.0, max_tokens: int = 0
) -> Tensor:
    """Log-probs of every response token under `model` (reference or old policy). [B, T]"""
    return per_token_over_batch(
        lambda ids, att, width: token_logprobs(model, ids, att, width, False, temperature)[0],
        batch,
        size,
        max_tokens,
    )


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
    rollout, advantages = batch.rollout, batch.advantages
    n = len(rollout.texts)
    device = rollout.input_ids.device
    totals: dict[str, float] = {}
    losses, grad_norms, skipped = [], [], 0
    padded = real = 0  # tokens the passes ran over, and those of them that are not padding
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
        step_loss = 0.0
        chosen = (
            minibatch_choices(model, obj, batch, mini, plan) if obj.needs_minibatch_stats else {}
        )
        parts = micro_batches(rollout, mini, plan.micro_batch_size, plan.max_tokens)
        for idx, ids, att, width, mask in parts:
            t = mask.shape[1]
            padded, real = padded + ids.numel(), real + int(att.sum())
            logp, entropy = token_logprobs(model, ids, att, width, True, obj.temperature)
            old = logp.detach() if batch.old_logp is None else batch.old_logp[idx, :t]
            ref = None if batch.ref_logp is None else batch.ref_logp[idx, :t]
            sampler_logp = rollout.sampler_logp
            sampled = None if sampler_logp is None else sampler_logp[idx, :t]
            # Per-token advantages (GAE, process rewards) are cut to the micro-batch's width.
            adv = advantages[idx] if advantages.dim() == 1 else advantages[idx, :t]
            loss, sums = policy_objective(
                obj,
                logp,
                old,
                ref,
                adv,
                mask,
                entropy,
                counts,
                sampled,
                **{key: rows[idx, :t] for key, rows in chosen.items()},
            )
            loss.backward()
            loss = loss.detach()
            step_loss += loss.item()
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        if aux_loss is not None:
            extra = aux_loss()
            extra.backward()
            totals["aux_loss_sum"] = totals.get("aux_loss_sum", 0.0) + extra.item()
        step_loss = distributed.all_sum(step_loss)  # each rank's is its share of the loss
        limit = plan.max_grad_norm if plan.max_grad_norm > 0 else float("inf")
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
    tokens = float(rollout.response_mask.sum())
    aux = totals.pop("aux_loss_sum", None)
    metrics = {key: value / max(tokens, 1.0) for key, value in totals.items()}
    if aux is not None:
        metrics["ptx/loss"] = aux / plan.mini_batches
    if "clip/low" in metrics:  # losses that clip (PPO's and its kin)
        metrics["clip/frac"] = metrics["clip/low"] + metrics["clip/high"] + metrics["clip/dual"]
    metrics["loss/policy"] = sum(losses) / len(losses)
    metrics["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
    metrics["nonfinite/skipped_updates"] = float(skipped)
    metrics["batch/padding_frac"] = 1 - real / max(padded, 1)
    return metrics


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
    for idx, ids, att, width, mask in micro_batches(
        rollout, mini, plan.micro_batch_size, plan.max_tokens
    ):
        t = mask.shape[1]
        lp, ent = token_logprobs(model, ids, att, width, True, obj.temperature)
        logp[idx, :t], entropy[idx, :t] = lp.float(), ent.float()
    mask = rollout.response_mask[mini].to(logp.dtype)
    adv = batch.advantages[mini]
    adv = (adv[:, None] if adv.dim() == 1 else adv).expand_as(mask)
    old = logp[mini] if batch.old_logp is None else batch.old_logp[mini]
    chosen = {}
    if obj.select is not None:
        settings = {**obj.loss.settings, **obj.loss_settings}
        picked = obj.select(adv, logp[mini], old, mask, obj.eps_low, obj.eps_high, **settings)
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
