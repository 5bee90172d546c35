"""The training loop: sample a group per prompt, score, compute advantages, update, log.

Reads top to bottom: `setup` builds everything a run needs (data, models, sampler,
objective, optimiser); `train_step` does one step, sample -> reward -> advantages ->
reference/old log-probs -> learn; `train` loops, logs and checkpoints. The math lives in
`rlcli.ops` and `rlcli.learner.policy_objective`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlcli.checkpoint import save_checkpoint
from rlcli.config import Config
from rlcli.data import PromptStream, load_splits, render_prompt
from rlcli.learner import Objective, batch_logprobs, learn
from rlcli.metrics import MetricsLog
from rlcli.models import load_causal_lm, load_tokenizer, pick_device, resolve_model_path
from rlcli.ops.advantages import OUTCOME_ADVANTAGES
from rlcli.rewards import REWARDS
from rlcli.rollout import HFSampler


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
    tokenizer: object
    policy: torch.nn.Module
    reference: torch.nn.Module | None  # None when beta = 0
    sampler: HFSampler
    objective: Objective
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    prompts: PromptStream


def setup(cfg: Config) -> Run:
    t, algo = cfg.trainer, cfg.algo
    seed_everything(t.seed)
    device = pick_device(t.device)
    # Data first: a bad data file should fail before minutes of model loading.
    train_set, _test_set = load_splits(cfg.data)
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path)
    policy = load_causal_lm(model_path, t.dtype, device)
    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        policy.train()  # transformers only checkpoints in training mode; Llama has no dropout
    # beta = 0 means no KL term, so no reference model is loaded at all.
    reference = load_causal_lm(model_path, t.dtype, device, trainable=False) if algo.beta else None
    s = cfg.sampler
    sampler = HFSampler(policy, tokenizer, s.temperature, s.top_p, s.max_new_tokens)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    warmup_updates = t.warmup_steps * t.mini_batches * t.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / (warmup_updates + 1))
    )
    return Run(
        cfg=cfg,
        model_path=model_path,
        device=device,
        tokenizer=tokenizer,
        policy=policy,
        reference=reference,
        sampler=sampler,
        objective=Objective.from_config(algo, norm_len=algo.norm_len or s.max_new_tokens),
        optimizer=optimizer,
        scheduler=scheduler,
        prompts=PromptStream(train_set, t.seed),
    )


def train_step(run: Run) -> dict[str, float]:
    """One step: sample, score, update. Returns the step's metrics (times in seconds)."""
    cfg, t = run.cfg, run.cfg.trainer
    start = time.perf_counter()
    problems = run.prompts.take(t.prompts_per_step)
    prompts = [render_prompt(run.tokenizer, p.question, cfg.data.system_prompt) for p in problems]
    batch = run.sampler.sample(
        prompts, t.group_size, [p.id for p in problems], [p.answer for p in problems]
    )
    sampled = time.perf_counter()

    rewards = torch.tensor(REWARDS[cfg.reward.name](batch.texts, batch.answers))
    groups = rewards.float().view(t.prompts_per_step, t.group_size)
    advantages = OUTCOME_ADVANTAGES[cfg.algo.advantage](groups).view(-1).to(run.device)
    scored = time.perf_counter()

    mbs = t.micro_batch_size
    ref_logp = batch_logprobs(run.reference, batch, mbs) if run.reference else None
    # With one update per batch the sampling policy is the current one, so its log-probs
    # equal the learner's own (detached); only several updates need them stored up front.
    several_updates = t.mini_batches * t.epochs > 1
    old_logp = batch_logprobs(run.policy, batch, mbs) if several_updates else None
    logprobs_done = time.perf_counter()

    epochs = [
        learn(
            run.policy,
            run.optimizer,
            run.objective,
            batch,
            advantages,
            ref_logp,
            old_logp,
            t.mini_batches,
            mbs,
            t.max_grad_norm,
            run.scheduler,
        )
        for _ in range(t.epochs)
    ]
    learned = time.perf_counter()

    lengths = batch.lengths.float()
    return {
        "reward/mean": groups.mean().item(),
        "reward/std": groups.std().item(),
        "reward/groups_all_equal": (groups.std(-1) == 0).float().mean().item(),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/truncated_frac": batch.truncated.float().mean().item(),
        **{key: sum(m[key] for m in epochs) / len(epochs) for key in epochs[0]},
        "lr": run.scheduler.get_last_lr()[0],
        "time/sample": sampled - start,
        "time/reward": scored - sampled,
        "time/logprobs": logprobs_done - scored,
        "time/learn": learned - logprobs_done,
        "time/step": learned - start,
        "throughput/tokens_per_s": lengths.sum().item() / (learned - start),
        "_sample": batch.texts[0],
    }


def train(cfg: Config, run_dir: Path) -> Path:
    """Run `cfg.trainer.max_steps` steps, writing metrics and checkpoints under `run_dir`."""
    t = cfg.trainer
    run_dir.mkdir(parents=True, exist_ok=True)
    run = setup(cfg)
    print(f"rlcli: training {run.model_path} on {run.device}; writing to {run_dir}")
    log = MetricsLog(run_dir, t.max_steps, cfg.logger.progress)
    for step in range(1, t.max_steps + 1):
        metrics = {"step": step, **train_step(run)}
        sample = metrics.pop("_sample")
        log.log(metrics)
        if cfg.logger.sample_every and step % cfg.logger.sample_every == 0:
            log.bar.write(f"[step {step}] {sample!r}")
        if step == t.max_steps or (t.save_every and step % t.save_every == 0):
            state = {"data_position": run.prompts.position}
            save_checkpoint(run_dir, step, run.policy, run.tokenizer, run.optimizer, state)
    log.close()
    print(f"rlcli: metrics in {log.path}")
    print(f"rlcli: checkpoints in {run_dir / 'checkpoints'}")
    return log.path
