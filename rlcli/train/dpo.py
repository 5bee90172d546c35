"""DPO training (Rafailov et al. 2023): `rlcli train algo=dpo data=pairs data.path=...`.

The loop is `train.loop`'s, as for RL; this module is what it drives. `setup` loads the
pairs and the policy, computes every pair's reference log-probs once with the frozen
reference model and then frees it (so the reference never sits in memory during training);
each `train_step` takes `trainer.prompts_per_step` pairs, sums the policy's log-probs of the
chosen and the rejected reply, and minimises the DPO loss of `rlcli.ops.policy_loss.dpo_loss`.
The learner divides no logits by a temperature here: the pairs were not sampled by this
policy.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rlcli.config import Config, config_dict
from rlcli.data import load_splits
from rlcli.data.pairs import Pair
from rlcli.data.problems import PromptStream, content_text, render_messages
from rlcli.lifecycle.checkpoint import (
    apply_optimizer_settings,
    load_checkpoint,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from rlcli.ops.policy_loss import dpo_loss
from rlcli.rollout.batch import Rollout, rollout_from_tokens
from rlcli.runtime.lora import adapters_off, dropout_on
from rlcli.runtime.models import (
    adamw,
    load_causal_lm,
    load_tokenizer,
    pick_device,
    resolve_model_path,
)
from rlcli.runtime.seed import seed_everything
from rlcli.train.forward import token_logprobs
from rlcli.train.passes import micro_batches
from rlcli.train.run import load_policy, trainable


def encode_pairs(tokenizer, pairs: list[Pair], max_length: int, device) -> Rollout:
    """2n rows: the n chosen replies, then the n rejected ones, each after its prompt.

    The prompt is rendered with the chat template (generation prompt added) and cut from the
    left to half of `max_length` at most; the reply, ended by EOS, fills the rest.
    """
    prompts, replies = [], []
    for reply_of in ("chosen", "rejected"):
        for pair in pairs:
            if tokenizer.chat_template:  # the messages whole: tool calls, content parts
                text = render_messages(tokenizer, list(pair.prompt))
            else:
                text = "\n".join(content_text(m.get("content")) for m in pair.prompt) + "\n"
            prompt = tokenizer(text, add_special_tokens=False).input_ids[-(max_length // 2) :]
            reply = tokenizer(getattr(pair, reply_of), add_special_tokens=False).input_ids
            reply = [*reply, tokenizer.eos_token_id][: max_length - len(prompt)]
            prompts.append(prompt)
            replies.append(reply)
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    ids = [p.id for p in pairs] * 2
    return rollout_from_tokens(prompts, replies, texts, ids, tokenizer.pad_token_id, device)


def sequence_logprobs(model, batch: Rollout, rows: Tensor, micro_pairs: int) -> Tensor:
    """Summed log-prob of each reply at `rows` under `model` (no grad). [len(rows)]"""
    out = torch.zeros(len(batch.texts), device=batch.input_ids.device)
    with torch.no_grad():
        # Micro-batches group rows by length, so results go back to their rows by index.
        for idx, ids, att, width, mask in micro_batches(batch, rows, 2 * micro_pairs):
            logp = token_logprobs(model, ids, att, width)[0][:, : mask.shape[1]]
            out[idx] = (logp * mask).sum(-1)
    return out[rows]


@dataclass(frozen=True)
class DpoSettings:
    """What a DPO run reads of the config once it starts."""

    pairs_per_step: int  # trainer.prompts_per_step: pairs per optimiser step
    micro_pairs: int  # trainer.micro_batch_size: pairs per forward pass
    beta: float  # algo.beta, DPO's temperature
    max_length: int  # algo.max_length: prompt and reply tokens kept
    max_grad_norm: float  # gradient clipping (0 = off)
    max_steps: int  # the run's length: the held-out pairs are measured after the last step
    keep_last: int  # checkpoints kept
    record: dict  # the config as plain data, which every checkpoint records


def dpo_settings(cfg: Config) -> DpoSettings:
    t = cfg.trainer
    return DpoSettings(t.prompts_per_step, t.micro_batch_size, cfg.algo.beta,
                       cfg.algo.max_length, t.max_grad_norm, t.max_steps, t.keep_last,
                       config_dict(cfg))  # fmt: skip


@dataclass
class DpoRun:
    """Everything a DPO run holds between steps."""

    settings: DpoSettings
    model_path: str
    device: torch.device
    tokenizer: object
    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    pairs: PromptStream  # over the training pairs
    reference: dict[str, tuple[float, float]]  # pair id -> reference (chosen, rejected) log-prob
    test_pairs: list[Pair]
    step: int = 0  # optimiser steps done (more than 0 when resumed from a checkpoint)


def reference_logprobs(model, tokenizer, pairs: list[Pair], s: DpoSettings, device) -> dict:
    """Every pair's summed (chosen, rejected) log-probs under the reference, in batches."""
    cache, n = {}, s.micro_pairs
    for start in range(0, len(pairs), n):
        chunk = pairs[start : start + n]
        batch = encode_pairs(tokenizer, chunk, s.max_length, device)
        rows = torch.arange(2 * len(chunk), device=device)
        logp = sequence_logprobs(model, batch, rows, n).tolist()
        for i, pair in enumerate(chunk):
            cache[pair.id] = (logp[i], logp[len(chunk) + i])
    return cache


def setup(cfg: Config, checkpoint: Path | None = None) -> DpoRun:
    """The pairs, the policy (from `checkpoint` when resuming) and the cached reference."""
    t, settings = cfg.trainer, dpo_settings(cfg)
    seed_everything(t.seed)
    device = pick_device(t.device)
    train_pairs, test_pairs = load_splits(cfg.data)  # data=pairs: lists of Pair
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path, init_kwargs=cfg.model.init_kwargs)
    # The reference is the initial policy: its log-probs are computed once and cached, and
    # the model is dropped before training starts. With LoRA it is the policy's base model
    # (its adapters off), so no second model is loaded at all.
    pairs = train_pairs + test_pairs
    if cfg.model.lora.rank:
        policy = load_policy(cfg, model_path, device, checkpoint)
        with adapters_off(policy):
            cache = reference_logprobs(policy, tokenizer, pairs, settings, device)
    else:
        reference = load_causal_lm(
            model_path, t.dtype, device, trainable=False, init_kwargs=cfg.model.init_kwargs
        )
        cache = reference_logprobs(reference, tokenizer, pairs, settings, device)
        del reference
        gc.collect()
        policy = load_policy(cfg, model_path, device, checkpoint)
    optimizer = adamw(trainable(policy), t.lr, t.weight_decay)
    run = DpoRun(
        settings,
        model_path,
        device,
        tokenizer,
        policy,
        optimizer,
        PromptStream(train_pairs, t.seed),
        cache,
        test_pairs,
    )
    if checkpoint is not None:
        state, tensors = load_checkpoint(checkpoint)
        run.optimizer.load_state_dict(tensors["optimizer"])
        apply_optimizer_settings(run.optimizer, t)
        run.step, run.pairs.position = state["step"], state["data_position"]
        restore_rng(state["rng"])
    return run


def pair_metrics(run: DpoRun, pairs: list[Pair]) -> dict[str, float]:
    """DPO's diagnostics of the current policy on `pairs` (no update): reward accuracy (share
    of pairs whose chosen reply has the higher implicit reward), margin, loss."""
    s = run.settings
    n, beta = s.micro_pairs, s.beta
    losses, chosen_r, rejected_r = [], [], []
    for start in range(0, len(pairs), n):
        chunk = pairs[start : start + n]
        batch = encode_pairs(run.tokenizer, chunk, s.max_length, run.device)
        logp = sequence_logprobs(run.policy, batch, torch.arange(2 * len(chunk)), n)
        ref = torch.tensor([run.reference[p.id] for p in chunk], device=run.device)
        loss, r_w, r_l = dpo_loss(
            logp[: len(chunk)], logp[len(chunk) :], ref[:, 0], ref[:, 1], beta
        )
        losses.append(loss)
        chosen_r.append(r_w)
        rejected_r.append(r_l)
    loss, r_w, r_l = torch.cat(losses), torch.cat(chosen_r), torch.cat(rejected_r)
    return {
        "loss": loss.mean().item(),
        "reward/accuracy": (r_w > r_l).float().mean().item(),
        "reward/margin": (r_w - r_l).mean().item(),
    }


def train_step(run: DpoRun) -> dict[str, float]:
    """One optimiser step on `prompts_per_step` pairs, in micro-batches of pairs."""
    s = run.settings
    start = time.perf_counter()
    pairs = run.pairs.take(s.pairs_per_step)
    run.optimizer.zero_grad(set_to_none=True)
    sums = dict.fromkeys(
        [
            "loss/policy",
            "reward/accuracy",
            "reward/margin",
            "reward/chosen",
            "reward/rejected",
            "logp/chosen",
            "logp/rejected",
        ],
        0.0,
    )
    for first in range(0, len(pairs), s.micro_pairs):
        chunk = pairs[first : first + s.micro_pairs]
        batch = encode_pairs(run.tokenizer, chunk, s.max_length, run.device)
        with dropout_on(run.policy):
            logp, _ = token_logprobs(
                run.policy, batch.input_ids, batch.attention_mask, batch.prompt_width
            )
        seq = (logp * batch.response_mask).sum(-1)  # [2b]: chosen, then rejected
        ref = torch.tensor([run.reference[p.id] for p in chunk], device=run.device)
        n = len(chunk)
        loss, r_w, r_l = dpo_loss(seq[:n], seq[n:], ref[:, 0], ref[:, 1], s.beta)
        (loss.sum() / len(pairs)).backward()  # the mean over the step's pairs
        values = {
            "loss/policy": loss.detach(),
            "reward/accuracy": (r_w > r_l).float(),
            "reward/margin": r_w - r_l,
            "reward/chosen": r_w,
            "reward/rejected": r_l,
            "logp/chosen": seq[:n].detach(),
            "logp/rejected": seq[n:].detach(),
        }
        for key, value in values.items():
            sums[key] += value.sum().item()
    limit = s.max_grad_norm if s.max_grad_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.policy.parameters(), limit))
    finite = math.isfinite(sums["loss/policy"]) and math.isfinite(grad_norm)
    if finite:  # a NaN update would poison every weight; the loop counts the skipped ones
        run.optimizer.step()
    return {
        **{key: value / len(pairs) for key, value in sums.items()},
        "actor/grad_norm": grad_norm,
        "nonfinite/skipped_updates": float(not finite),
        "time/step": time.perf_counter() - start,
    }


def before_training(run: DpoRun) -> str | None:
    """The held-out pairs' metrics of the initial policy, printed before the first step."""
    if not run.test_pairs:
        return None
    return f"rlcli: held-out pairs before training: {pair_metrics(run, run.test_pairs)}"


def held_out(run: DpoRun) -> dict[str, float]:
    """The held-out pairs' metrics after the last step."""
    if run.step != run.settings.max_steps or not run.test_pairs:
        return {}
    return pair_metrics(run, run.test_pairs)


def save(run: DpoRun, run_dir: Path) -> Path:
    """Write a checkpoint: the policy, the optimiser, the data position and the RNG states."""
    state = {
        "data_position": run.pairs.position,
        "rng": rng_state(),
        "config": run.settings.record,
    }
    return save_checkpoint(
        run_dir,
        run.step,
        run.policy,
        run.tokenizer,
        {"optimizer": run.optimizer.state_dict()},
        state,
        run.settings.keep_last,
    )
