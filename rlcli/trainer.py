"""The training loop: sample a group per prompt, score, shape the batch, compute advantages,
update, log.

Reads top to bottom: `setup` builds everything a run needs (data, models, sampler,
objective, optimisers); `train_step` does one step, sample and score -> shape ->
reference/old log-probs -> advantages -> learn; `train` loops, logs and checkpoints. The
math lives in `rlcli.ops`, `rlcli.learner.policy_objective` and `rlcli.critic`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlcli import distributed
from rlcli.advantage import OUTCOME, outcome_advantages, process_advantages
from rlcli.checkpoint import (
    load_checkpoint,
    python_rng_state,
    remove_incomplete,
    restore_rng,
    resume_point,
    rng_state,
    save_checkpoint,
    set_python_rng_state,
)
from rlcli.config import Config, ConfigError, TrainerConfig
from rlcli.critic import batch_values, gae_advantages, learn_critic, load_critic
from rlcli.data import Problem, PromptStream, load_splits, render_prompt
from rlcli.evaluate import EVAL_SEED, evaluate
from rlcli.guard import LoopGuard
from rlcli.learner import Objective, TokenLogprobModel, batch_logprobs, learn, lm_loss
from rlcli.models import (
    has_fast_bf16,
    load_causal_lm,
    load_tokenizer,
    pick_device,
    resolve_model_path,
)
from rlcli.ops.advantages import SasTracker
from rlcli.reward_models import step_reward_tensors
from rlcli.rollout import HFSampler, Rollout, concat_rollouts, eos_token_ids, select_rows
from rlcli.scoring import Sample, Scorer, Scores, nanmean
from rlcli.shaping import dupo_fill, group_rows, informative_groups
from rlcli.tracking import NoTracker, RecordingScorer, Tracker
from rlcli.vllm_sampler import VLLMSampler


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Run:
    """Everything a training run holds between steps."""

    cfg: Config
    model_path: str
    device: torch.device
    compute_dtype: str  # what the learner multiplies in (`compute_dtype`)
    tokenizer: object
    policy: torch.nn.Module  # the causal LM (sharded in place under torchrun)
    learner: torch.nn.Module  # TokenLogprobModel over the policy: what the learner calls
    reference: torch.nn.Module | None  # None when beta = 0
    critic: torch.nn.Module | None  # PPO only (algo.advantage=gae)
    critic_optimizer: torch.optim.Optimizer | None
    sampler: HFSampler | VLLMSampler
    scorer: Scorer
    objective: Objective
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    prompts: PromptStream
    test_problems: list[Problem]  # held out: trainer.eval_every evaluates on them
    sas: SasTracker  # DCPO's per-prompt state (empty for other estimators)
    beta: float  # KL coefficient; moves when algo.kl_target is set (adaptive controller)
    ptx_texts: list[str]
    rng: random.Random  # DUPO's choice of groups to duplicate, ptx batches
    step: int = 0  # optimiser steps done (more than 0 when resumed from a checkpoint)


def read_texts(path: str) -> list[str]:
    """Pretraining text for PPO-ptx: a .jsonl file's `text` fields, or one text per line."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"algo.ptx_path={path}: no such file.")
    lines = [line for line in file.read_text().splitlines() if line.strip()]
    texts = [json.loads(line)["text"] for line in lines] if file.suffix == ".jsonl" else lines
    if not texts:
        raise ConfigError(f"algo.ptx_path={path} holds no text.")
    return texts


def check_reward_fields(cfg: Config, problems: list[Problem]) -> None:
    """The countdown reward reads `numbers` and `target` from each record: check they exist."""
    if "countdown" in cfg.reward.components:
        missing = [k for k in ("numbers", "target") if k not in problems[0].record]
        if missing:
            raise ConfigError(
                f"reward component 'countdown' needs records with fields numbers and target; "
                f"data={cfg.data.name} has no {missing[0]!r}. Use data=countdown."
            )


def fit_prompts(
    cfg: Config, tokenizer, problems: list[Problem], split: str
) -> list[Problem]:  # fmt: skip
    """`problems` whose rendered prompt fits sampler.max_prompt_tokens; a longer one is an
    error unless sampler.long_prompts=drop, which drops it with a count."""
    s = cfg.sampler
    rendered = [render_prompt(tokenizer, p.question, cfg.data.system_prompt) for p in problems]
    lengths = [len(ids) for ids in tokenizer(rendered, add_special_tokens=False).input_ids]
    too_long = [i for i, n in enumerate(lengths) if n > s.max_prompt_tokens]
    if not too_long:
        return problems
    longest = max(too_long, key=lengths.__getitem__)
    if s.long_prompts == "error":
        raise ConfigError(
            f"{len(too_long)} of {len(problems)} {split} prompts of data={cfg.data.name} are "
            f"longer than sampler.max_prompt_tokens={s.max_prompt_tokens} (the longest, "
            f"{problems[longest].id!r}, has {lengths[longest]} tokens with the chat template). "
            "Raise sampler.max_prompt_tokens (with sampler.max_model_len on vLLM), or drop "
            "them with sampler.long_prompts=drop."
        )
    print(
        f"rlcli: dropped {len(too_long)} of {len(problems)} {split} prompts longer than "
        f"sampler.max_prompt_tokens={s.max_prompt_tokens}."
    )
    drop = set(too_long)
    kept = [p for i, p in enumerate(problems) if i not in drop]
    if not kept:
        limit = s.max_prompt_tokens
        raise ConfigError(f"No {split} prompt fits in sampler.max_prompt_tokens={limit}.")
    return kept


def make_sampler(
    cfg: Config, model_path: str, tokenizer, policy, device, dtype: str, learner=None
) -> HFSampler | VLLMSampler:
    """The configured sampler, holding the policy's current weights; a vLLM engine runs in
    `dtype` (`learner`: the policy's sharded root under torchrun, which transformers'
    sampling must gather first)."""
    s, t = cfg.sampler, cfg.trainer
    if s.name == "vllm":
        eos_ids = eos_token_ids(tokenizer, policy)
        sampler = VLLMSampler(model_path, tokenizer, eos_ids, s, dtype, device, t.seed)
        sampler.sync(policy)  # a reused engine may hold another run's weights
        return sampler
    gather = (lambda: distributed.gathered(learner)) if learner is not None else None
    return HFSampler(policy, tokenizer, s.temperature, s.top_p, s.max_new_tokens, gather)


def frozen_sampling(cfg: Config, problems: list[Problem]):
    """(scorer, model path, tokenizer, sampler) for commands that sample and score a model
    without training it (`rlcli filter`, `pairs`, `eval`); the reward is checked first."""
    t = cfg.trainer
    device = pick_device(t.device)
    check_reward_fields(cfg, problems)
    scorer = Scorer(cfg.reward, cfg.sampler.max_new_tokens, device, t.dtype)
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path)
    fit_prompts(cfg, tokenizer, problems, "")  # an error if any is too long
    policy = load_causal_lm(model_path, t.dtype, device, trainable=False)
    # In trainer.dtype: what is measured (eval) or kept (filter, pairs) should not depend on
    # whether the machine has fast bfloat16.
    sampler = make_sampler(cfg, model_path, tokenizer, policy, device, t.dtype)
    return scorer, model_path, tokenizer, sampler


def setup(cfg: Config, checkpoint: Path | None = None) -> Run:
    """Everything a run needs; from `checkpoint`, the state of the run that saved it."""
    t, algo = cfg.trainer, cfg.algo
    # Under torchrun each rank samples its own responses, so each draws its own numbers.
    seed_everything(t.seed + distributed.rank())
    device = distributed.init(pick_device(t.device))
    # Data and reward first: a bad data file or reward function should fail before minutes
    # of model loading.
    train_set, test_set = load_splits(cfg.data)
    check_reward_fields(cfg, train_set)
    if t.eval_every and not test_set:
        raise ConfigError(
            f"trainer.eval_every={t.eval_every} needs held-out problems, but data="
            f"{cfg.data.name} has none: set data.num_test (or data.test_path)."
        )
    ptx_texts = read_texts(algo.ptx_path) if algo.ptx_coef > 0 else []
    scorer = Scorer(cfg.reward, cfg.sampler.max_new_tokens, device, t.dtype)
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path)
    train_set = fit_prompts(cfg, tokenizer, train_set, "training")
    test_set = fit_prompts(cfg, tokenizer, test_set, "held-out")
    # A resumed policy starts from the checkpoint; the reference stays the original model.
    policy = load_causal_lm(str(checkpoint or model_path), t.dtype, device)
    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        policy.train()  # transformers only checkpoints in training mode; Llama has no dropout
    sharded = distributed.world_size() > 1
    learner = distributed.shard(policy) if sharded else TokenLogprobModel(policy)
    # beta = 0 means no KL term, so no reference model is loaded at all.
    # Frozen and used under autocast only, it is held in the compute dtype (half the memory).
    compute = compute_dtype(t, device)
    reference = load_causal_lm(model_path, compute, device, trainable=False) if algo.beta else None
    critic = critic_optimizer = None
    if algo.advantage == "gae":
        path = algo.critic_path or model_path
        if checkpoint is not None:
            critic = load_critic(str(checkpoint / "critic"), t.dtype, device, new_head=False)
        else:
            critic = load_critic(path, t.dtype, device, new_head=algo.critic_path is None)
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=algo.critic_lr or t.lr)
    sampler = make_sampler(
        cfg, model_path, tokenizer, policy, device, compute, learner if sharded else None
    )
    optimizer = torch.optim.AdamW(learner.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    warmup_updates = t.warmup_steps * t.mini_batches * t.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / (warmup_updates + 1))
    )
    run = Run(
        cfg=cfg,
        model_path=model_path,
        device=device,
        compute_dtype=compute,
        tokenizer=tokenizer,
        policy=policy,
        learner=learner,
        reference=reference,
        critic=critic,
        critic_optimizer=critic_optimizer,
        sampler=sampler,
        scorer=scorer,
        objective=Objective.from_config(
            algo, cfg.sampler, norm_len=algo.norm_len or cfg.sampler.max_new_tokens
        ),
        optimizer=optimizer,
        scheduler=scheduler,
        prompts=PromptStream(train_set, t.seed),
        test_problems=test_set,
        sas=SasTracker(),
        beta=algo.beta,
        ptx_texts=ptx_texts,
        rng=random.Random(t.seed),
    )
    if checkpoint is not None:
        restore(run, checkpoint)
    return run


def run_state(run: Run) -> tuple[dict, dict]:
    """(JSON state, tensor state dicts) that `restore` needs to continue the run exactly."""
    state = {
        "data_position": run.prompts.position,
        "beta": run.beta,
        "sas": run.sas.state_dict(),
        "rng": rng_state(),
        "run_rng": python_rng_state(run.rng),
        "sampler_calls": getattr(run.sampler, "calls", 0),
        "world_size": distributed.world_size(),
    }
    tensors = {"optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict()}
    if run.critic_optimizer is not None:
        tensors["critic_optimizer"] = run.critic_optimizer.state_dict()
    return state, tensors


def restore(run: Run, checkpoint: Path) -> None:
    """Put the saved optimiser, scheduler, counters and RNG states back into a fresh `run`."""
    state, tensors = load_checkpoint(checkpoint)
    if state.get("world_size", 1) != distributed.world_size():
        raise ConfigError(
            f"{checkpoint} was written by {state.get('world_size', 1)} process(es) and this run "
            f"has {distributed.world_size()}: its optimiser state is laid out for that number. "
            "Resume with as many processes, or start afresh from its weights (model.path=...)."
        )
    if distributed.world_size() > 1:
        distributed.load_full_optimizer_state(run.learner, run.optimizer, tensors["optimizer"])
    else:
        run.optimizer.load_state_dict(tensors["optimizer"])
    run.scheduler.load_state_dict(tensors["scheduler"])
    if run.critic_optimizer is not None:
        run.critic_optimizer.load_state_dict(tensors["critic_optimizer"])
    run.step, run.beta = state["step"], state["beta"]
    run.prompts.position = state["data_position"]
    run.sas.load_state_dict(state["sas"])
    set_python_rng_state(run.rng, state["run_rng"])
    if hasattr(run.sampler, "calls"):
        run.sampler.calls = state["sampler_calls"]
    restore_rng(state["rng"])  # last: loading models above may have drawn numbers


def sample_and_score(
    sampler, scorer: Scorer, tokenizer, problems: list[Problem], group: int, system_prompt,
    temperature: float | None = None, seed: int | None = None,
) -> tuple[Rollout, Scores]:  # fmt: skip
    """Sample a group per problem and score every response (NaN where a reward failed).

    `temperature` and `seed` replace the training stream's for this call (evaluation)."""
    prompts = [render_prompt(tokenizer, p.question, system_prompt) for p in problems]
    ids, answers = [p.id for p in problems], [p.answer for p in problems]
    batch = sampler.sample(prompts, group, ids, answers, temperature=temperature, seed=seed)
    rows = [p for p in problems for _ in range(group)]
    samples = [
        Sample(p.question, text, p.answer, p.record, int(n))
        for p, text, n in zip(rows, batch.texts, batch.lengths.tolist(), strict=True)
    ]
    scores = scorer(samples)
    if scores.steps is not None:  # process reward: each step's score at its last token
        step_rewards, step_ends = step_reward_tensors(
            tokenizer, batch.response_ids.cpu(), batch.response_mask.cpu(), scores.steps
        )
        marked = step_rewards.masked_fill(~step_ends, math.nan)
        batch = dataclasses.replace(batch, step_rewards=marked)
    return batch, scores


def reward_metrics(rounds: list[Scores]) -> dict[str, float]:
    """Each component's mean over every response sampled this step, and the failures."""
    joined = Scores(
        total=torch.cat([r.total for r in rounds]),
        components={k: torch.cat([r.components[k] for r in rounds]) for k in rounds[0].components},
        errors=[e for r in rounds for e in r.errors],
    )
    return joined.metrics()


def collect_batch(run: Run) -> tuple[Rollout, torch.Tensor, dict[str, float]]:
    """The step's batch of prompts_per_step groups, shaped as the algorithm asks.

    DAPO dynamic sampling keeps only groups whose rewards differ and samples more prompts
    until the batch is full (at most `max_gen_batches` generation rounds; then the step
    trains on the groups found, and stops the run only if there are none); DUPO replaces
    zero-signal groups by duplicates of informative ones; otherwise the batch is as sampled.
    """
    t, algo = run.cfg.trainer, run.cfg.algo
    world = distributed.world_size()
    P, G = t.prompts_per_step // world, t.group_size  # under torchrun, this rank's share
    parts, kept_scores, sampled_groups, equal_groups, rounds = [], [], 0, 0, []
    reward_seconds = 0.0

    def timed_scorer(samples):  # reward time is reported apart from sampling time
        nonlocal reward_seconds
        begin = time.perf_counter()
        scores = run.scorer(samples)
        reward_seconds += time.perf_counter() - begin
        return scores

    for _ in range(algo.max_gen_batches if algo.dynamic_sampling else 1):
        batch, round_scores = sample_and_score(
            run.sampler, timed_scorer, run.tokenizer,
            run.prompts.take(P * world)[distributed.rank() :: world], G,
            run.cfg.data.system_prompt,
        )  # fmt: skip
        rounds.append(round_scores)
        scores = round_scores.total
        informative = informative_groups(scores.view(P, G))
        sampled_groups += P
        equal_groups += int((~informative).sum())
        if not algo.dynamic_sampling:
            break
        keep = informative.nonzero().flatten().tolist()
        parts.append(select_rows(batch, group_rows(keep, G)))
        kept_scores.append(scores.view(P, G)[keep].flatten())
        if sum(len(p.texts) for p in parts) >= P * G:
            batch = concat_rollouts(parts, run.tokenizer.pad_token_id)
            batch = select_rows(batch, list(range(P * G)))
            scores = torch.cat(kept_scores)[: P * G]
            break
    else:
        found = sum(len(p.texts) for p in parts) // G
        if found:
            # A short batch beats stopping a run whose policy has nearly mastered its prompts.
            batch = concat_rollouts(parts, run.tokenizer.pad_token_id)
            scores = torch.cat(kept_scores)
        else:
            raise ConfigError(
                f"DAPO dynamic sampling found only {found} of {P} groups with differing "
                f"rewards after algo.max_gen_batches={algo.max_gen_batches} generation rounds: "
                "every group is all right or all wrong. Raise algo.max_gen_batches, use an "
                "easier or harder dataset, or turn it off with algo.dynamic_sampling=false."
            )
    metrics = {
        **reward_metrics(rounds),
        "batch/groups_all_equal": equal_groups / sampled_groups,
        "batch/gen_batches": float(sampled_groups // P),
        "time/reward": reward_seconds,
    }
    if algo.dynamic_sampling:
        metrics["batch/groups_short"] = float(P - len(batch.texts) // G)
    if algo.dupo_fill:
        slots = dupo_fill(informative_groups(scores.view(P, G)).tolist(), run.rng)
        metrics["batch/duplicated_groups"] = float(sum(g != i for i, g in enumerate(slots)))
        rows = group_rows(slots, G)
        batch, scores = select_rows(batch, rows), scores[rows]
    return batch, scores, metrics


def compute_dtype(t: TrainerConfig, device: torch.device) -> str:
    """The dtype the learner multiplies in, the reference model is held in and the vLLM engine
    runs in: bfloat16 when trainer.bf16_autocast and the device has fast bfloat16, else
    trainer.dtype (the learner's weights and optimiser state are always in trainer.dtype)."""
    return "bfloat16" if t.bf16_autocast and has_fast_bf16(device) else t.dtype


def autocast(device: torch.device, dtype: str):
    """bfloat16 autocast for the learner when it computes in bfloat16; else a no-op."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def train_step(run: Run) -> dict[str, float]:
    """One step: sample, score, update. Returns the step's metrics (times in seconds)."""
    t, algo = run.cfg.trainer, run.cfg.algo
    start = time.perf_counter()
    batch, scores, metrics = collect_batch(run)
    sampled = time.perf_counter()

    lengths = batch.lengths.float()
    missing = scores.isnan()
    if missing.any():
        # A response whose reward failed teaches nothing: it stays out of the loss.
        keep = (~missing).to(batch.response_mask)[:, None]
        batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)
    if algo.overlong_filter:
        # DAPO overlong filtering: truncated responses stay in the batch but out of the loss.
        keep = (~batch.truncated).to(batch.response_mask)[:, None]
        batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)

    mbs, tokens = t.micro_batch_size, t.max_tokens_per_micro_batch
    temp = run.cfg.sampler.temperature
    # bfloat16 autocast where the learner computes in it (a fresh context for each use).
    precision = functools.partial(autocast, run.device, run.compute_dtype)
    ref_logp = None
    if run.reference is not None:
        with precision():
            ref_logp = batch_logprobs(run.reference, batch, mbs, temp, tokens)
    # With one update per batch the sampling policy is the current one, so its log-probs
    # equal the learner's own (detached); they are stored up front only when several updates
    # follow or the KL goes into the reward.
    kl_in_reward = algo.kl_in == "reward" and ref_logp is not None
    need_old = t.mini_batches * t.epochs > 1 or kl_in_reward or run.critic is not None
    with precision():
        old_logp = batch_logprobs(run.learner, batch, mbs, temp, tokens) if need_old else None
    kl_k1 = None
    if kl_in_reward:
        kl_k1 = (old_logp - ref_logp) * batch.response_mask
        metrics["kl"] = (kl_k1.sum() / batch.response_mask.sum().clamp(min=1)).item()
    logprobs_done = time.perf_counter()

    if run.critic is not None:
        old_values = batch_values(run.critic, batch, mbs)
        advantages, returns = gae_advantages(
            scores.nan_to_num(0.0).to(run.device), old_logp, ref_logp if kl_in_reward else None,
            old_values, batch.response_mask, run.beta, algo.gamma, algo.lam,
            algo.whiten_advantages,
        )  # fmt: skip
    elif algo.advantage == "grpo_process":
        advantages = process_advantages(batch.step_rewards, t.group_size).to(run.device)
    else:
        rewards = scores.clone()
        if kl_k1 is not None:
            rewards -= run.beta * kl_k1.sum(-1).cpu()  # KL as a sequence-level reward penalty
        groups = rewards.view(-1, t.group_size)  # DAPO may train on fewer groups
        ids = batch.prompt_ids[:: t.group_size]
        estimator = OUTCOME[algo.advantage]
        advantages = outcome_advantages(estimator, groups, ids, run.sas).flatten()
        advantages = advantages.to(run.device)
    responses_with_signal = (advantages.abs().reshape(len(batch.texts), -1).amax(-1) > 0).float()
    scored = time.perf_counter()

    objective = dataclasses.replace(run.objective, beta=run.beta)
    ptx = None
    if algo.ptx_coef > 0:

        def ptx():  # noqa: E306 - PPO-ptx: gamma_ptx * LM loss on a batch of pretraining text
            texts = run.rng.sample(run.ptx_texts, min(mbs, len(run.ptx_texts)))
            return algo.ptx_coef * lm_loss(run.policy, run.tokenizer, texts)

    with precision():
        epochs = [
            learn(
                run.learner, run.optimizer, objective, batch, advantages, ref_logp, old_logp,
                t.mini_batches, mbs, t.max_grad_norm, run.scheduler, aux_loss=ptx,
                max_tokens=tokens,
            )
            for _ in range(t.epochs)
        ]  # fmt: skip
    if run.critic is not None:
        for _ in range(t.epochs):
            metrics.update(
                learn_critic(
                    run.critic, run.critic_optimizer, batch, old_values, returns,
                    algo.value_clip, algo.vf_coef, mbs, t.max_grad_norm,
                )
            )  # fmt: skip
    learned = time.perf_counter()
    run.sampler.sync(run.policy)  # the next batch is sampled with the updated weights
    synced = time.perf_counter()

    kl_now = epochs[-1].get("kl", metrics.get("kl"))
    if algo.kl_target and kl_now is not None and math.isfinite(kl_now):
        # Adaptive KL controller (Ziegler et al. 2019): move beta towards the target KL.
        error = max(-0.2, min(0.2, kl_now / algo.kl_target - 1))
        run.beta *= 1 + error * len(batch.texts) / algo.kl_horizon
    return {
        "reward/mean": nanmean(scores),
        "reward/std": scores[~missing].std().item() if (~missing).sum() > 1 else 0.0,
        **metrics,
        "batch/response_utilisation": responses_with_signal.mean().item(),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/truncated_frac": batch.truncated.float().mean().item(),
        # Prompt and response tokens the learner reads (its FLOPs scale with these).
        "batch/tokens": float(batch.attention_mask.sum()),
        **{key: sum(m[key] for m in epochs) / len(epochs) for key in epochs[0]},
        "nonfinite/skipped_updates": sum(m["nonfinite/skipped_updates"] for m in epochs),
        "kl/beta": run.beta,
        "lr": run.scheduler.get_last_lr()[0],
        "time/sample": sampled - start - metrics["time/reward"],
        "time/logprobs": logprobs_done - sampled,
        "time/advantages": scored - logprobs_done,
        "time/learn": learned - scored,
        "time/sync": synced - learned,
        "time/step": synced - start,
        "throughput/tokens_per_s": lengths.sum().item() / (synced - start),
        "_sample": batch.texts[0],
    }


def save(run: Run, run_dir: Path) -> Path:
    """Write a checkpoint of the run; under torchrun every rank gathers, rank 0 writes."""
    state, tensors = run_state(run)
    extra = {"critic": run.critic} if run.critic is not None else None
    weights, target = None, run_dir / "checkpoints" / f"step_{run.step}"
    if distributed.world_size() > 1:
        weights, tensors["optimizer"] = distributed.full_state(run.learner, run.optimizer)
    if distributed.is_main():
        target = save_checkpoint(
            run_dir, run.step, run.policy, run.tokenizer, tensors, state,
            run.cfg.trainer.keep_last, extra, weights,
        )  # fmt: skip
    distributed.barrier()
    return target


def train(cfg: Config, run_dir: Path) -> Path:
    """Run steps up to `cfg.trainer.max_steps`, writing metrics and checkpoints under `run_dir`;
    continue a run from its checkpoint as `trainer.resume` says. Under torchrun every rank
    runs this; rank 0 alone prints, logs and writes."""
    t = cfg.trainer
    say = print if distributed.is_main() else lambda *_: None
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = resume_point(t.resume, run_dir)
    if distributed.is_main():
        for name in remove_incomplete(run_dir):
            say(f"rlcli: removed {name}, a checkpoint whose writing was interrupted")
    run = setup(cfg, checkpoint)
    if checkpoint is not None:
        say(f"rlcli: resuming from {checkpoint} (step {run.step})")
        if run.step >= t.max_steps:
            say(f"rlcli: step {run.step} reached trainer.max_steps; raise it to train further")
    world = distributed.world_size()
    processes = f" in {world} processes" if world > 1 else ""
    say(f"rlcli: training {run.model_path} on {run.device}{processes}; writing to {run_dir}")
    # The tracker's table of samples shows what the step scored, prompts and rewards included.
    run.scorer = scored = RecordingScorer(run.scorer)
    tracker = Tracker(cfg, run_dir, first_step=run.step + 1) if say is print else NoTracker()
    with LoopGuard(t.max_bad_steps, tracker.write) as guard:
        while run.step < t.max_steps:
            with scored.recording() as samples:
                metrics = train_step(run)
            run.step += 1
            # Under torchrun: averaged over the ranks (times: the slowest rank's).
            metrics = distributed.mean_metrics({"step": run.step, **metrics})
            sample = metrics.pop("_sample")
            if t.eval_every and (run.step % t.eval_every == 0 or run.step == t.max_steps):
                held_out = evaluate(
                    run.sampler, run.scorer, run.tokenizer, run.test_problems, cfg.eval,
                    cfg.data.system_prompt, t.seed + EVAL_SEED,
                )  # fmt: skip
                metrics.update({f"eval/{key}": value for key, value in held_out.items()})
            tracker.log(metrics, samples)
            guard.observe(run.step, metrics)
            if cfg.logger.sample_every and run.step % cfg.logger.sample_every == 0:
                tracker.write(f"[step {run.step}] {sample!r}")
            # Every rank stops at the same step, whichever of them was signalled.
            stopping = bool(distributed.all_max(int(guard.stopping)))
            due = t.save_every and run.step % t.save_every == 0
            if due or run.step == t.max_steps or stopping:
                saved = save(run, run_dir)
            if stopping:
                tracker.finish()
                raise guard.stop(run.step, saved, run_dir)
    curves = tracker.finish()
    say(f"rlcli: metrics in {tracker.path}")
    say(f"rlcli: curves in {curves}")
    say(f"rlcli: checkpoints in {run_dir / 'checkpoints'}")
    distributed.shutdown()
    return tracker.path
