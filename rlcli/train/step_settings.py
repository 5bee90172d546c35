"""What an RL run reads of the config after it starts, picked once as it starts: the step's
stages are handed `StepSettings` (`step_settings`), the loop, evaluation and saving
`RunSettings` (`run_settings`), not the whole config."""

from __future__ import annotations

from dataclasses import dataclass

from rlcli.config import AlgoConfig, Config, EvalConfig, SamplerConfig, TrainerConfig, config_dict
from rlcli.train.learner import UpdatePlan


@dataclass(frozen=True)
class StepSettings:
    max_steps: int  # the run's length: rounds sampled ahead stop at it
    group_size: int  # responses per prompt
    epochs: int  # the learner's passes over each batch
    plan: UpdatePlan  # how a pass is cut into optimiser steps and forward passes
    temperature: float  # the sampler's: log-probs are those of the distribution sampled
    overlong_filter: bool  # DAPO's: cut-off responses leave the loss
    kl_in_reward: bool  # algo.kl_in=reward: the KL penalty is part of the reward (PPO)
    ptx_coef: float  # PPO-ptx: the pretraining loss's weight (0 = off)
    value_clip: float  # PPO's critic: its value clipping...
    vf_coef: float  # ...and its loss's weight
    kl_target: float | None  # the adaptive KL controller's target (None = fixed beta)
    kl_horizon: int  # ...and its horizon

    @property
    def logprob_passes(self) -> tuple[int, float, int, bool]:
        """`forward.batch_logprobs`' pass sizes: rows, temperature, tokens, prompts shared."""
        p = self.plan
        return (p.micro_batch_size, self.temperature, p.max_tokens, p.share_prompts)

    @property
    def updates_per_batch(self) -> int:
        return self.plan.mini_batches * self.epochs


def step_settings(t: TrainerConfig, algo: AlgoConfig, sampler: SamplerConfig) -> StepSettings:
    plan = UpdatePlan(t.mini_batches, t.micro_batch_size, t.max_tokens_per_micro_batch,
                      t.max_grad_norm, t.share_prompts)  # fmt: skip
    return StepSettings(
        max_steps=t.max_steps,
        group_size=t.group_size,
        epochs=t.epochs,
        plan=plan,
        temperature=sampler.temperature,
        overlong_filter=algo.overlong_filter,
        kl_in_reward=algo.kl_in == "reward",
        ptx_coef=algo.ptx_coef,
        value_clip=algo.value_clip,
        vf_coef=algo.vf_coef,
        kl_target=algo.kl_target,
        kl_horizon=algo.kl_horizon,
    )


@dataclass(frozen=True)
class RunSettings:
    """What the loop reads of the config between steps, besides the step's own."""

    seed: int  # the run's: evaluations sample from it (`held_out.EVAL_SEED` above it)
    max_steps: int  # the run's length: the last step is evaluated
    eval_every: int  # steps between held-out evaluations (0 = none)
    eval: EvalConfig  # how an evaluation samples and scores
    keep_last: int  # checkpoints kept
    # The config as plain data: every checkpoint records it, and a resume compares its own
    # command with it (`lifecycle.run_dir.check_resume`).
    record: dict


def run_settings(cfg: Config) -> RunSettings:
    t = cfg.trainer
    return RunSettings(t.seed, t.max_steps, t.eval_every, cfg.eval, t.keep_last, config_dict(cfg))
