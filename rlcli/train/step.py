"""One RL step, top to bottom: the collected batch (`collect.collector.Collector`: sampled,
scored and shaped) -> reference and old log-probs -> advantages -> learn -> push the new
weights to the sampler.

`train_step` builds the `TrainBatch` and hands it to the learner. The math lives in
`rlcli.ops` (advantages, the objective's pieces), picked through their registries.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from rlcli.config import Config
from rlcli.ops.advantages import AdvantageInputs
from rlcli.ops.estimate import estimate
from rlcli.ops.policy_loss import adaptive_kl_beta, kl_reward_penalty
from rlcli.rollout.batch import Rollout
from rlcli.rollout.workers.client import WorkerLost
from rlcli.runtime.lora import adapters_off, dropout_on
from rlcli.runtime.models import autocast
from rlcli.train.critic import batch_values, learn_critic
from rlcli.train.forward import batch_logprobs
from rlcli.train.learner import learn, lm_loss
from rlcli.train.run import Run
from rlcli.train.train_batch import TrainBatch


def trained_share(in_loss: torch.Tensor, sampled: torch.Tensor) -> float:
    """The share of sampled response tokens that enter the loss (1.0 for an empty batch)."""
    return float(in_loss) / float(sampled) if float(sampled) else 1.0


def untrained_reason(cfg: Config, metrics: dict[str, float]) -> str | None:
    """Why a step with `metrics` trained on no tokens, in a line naming the setting to change;
    None when it trained on some."""
    if metrics.get("batch/trained_token_share", 1.0) > 0:
        return None
    if cfg.algo.overlong_filter and metrics.get("response/truncated_frac") == 1.0:
        budget = (
            f"sampler.max_new_tokens={cfg.sampler.max_new_tokens}"
            if cfg.env.name == "none"
            else f"env.max_tokens={cfg.env.max_tokens}"
        )
        return (
            f"every response was cut off at {budget} and algo.overlong_filter=true leaves "
            f"cut-off responses out of the loss: raise {budget.split('=')[0]} or set "
            "algo.overlong_filter=false"
        )
    if errors := int(metrics.get("reward/errors", 0.0)):
        cut = ", the others were cut off (algo.overlong_filter)" if cfg.algo.overlong_filter else ""
        return f"{errors} response(s) had no reward{cut}; the reward's error lines say why"
    return "no response token was left in the loss"


@dataclass(frozen=True)
class NoSignal:
    """Why a step learned nothing from its batch, as its warning says it: `what` it lacked,
    the `metric` that shows it (the two name the cause, counted at the run's end), the
    `effect` on the update, and `why`, with the setting to change."""

    what: str
    metric: str
    effect: str
    why: str


def no_signal(cfg: Config, metrics: dict[str, float], group_relative: bool) -> NoSignal | None:
    """Why a step with `metrics` learned nothing, or None when it had a signal: no token in
    the loss first (`untrained_reason`), else no trained response with a non-zero advantage
    (`zero_advantage_reason`). Read from what the step trained on, not from the algorithm's
    name, so every estimator is covered: GAE's critic rarely gives exact zeros, the group
    estimators do on every group of equal rewards. `group_relative`: the estimator compares a
    response with its group's."""
    if (why := untrained_reason(cfg, metrics)) is not None:
        return NoSignal(
            "trained on no tokens", "batch/trained_token_share=0", "loss and gradient 0", why
        )
    if (why := zero_advantage_reason(cfg, metrics, group_relative)) is not None:
        zero = "every trained response's advantage 0"
        return NoSignal("had no learning signal", "batch/response_utilisation=0", zero, why)
    return None


def zero_advantage_reason(
    cfg: Config, metrics: dict[str, float], group_relative: bool
) -> str | None:
    """Why every trained response of a step with `metrics` had advantage 0, what gradient is
    left and the settings to change, in a line; None when one had a non-zero advantage."""
    if metrics.get("batch/response_utilisation", 1.0) > 0:
        return None
    algo = cfg.algo
    estimator = f"algo.advantage={algo.advantage}"
    same = (
        f"every response got the same reward ({metrics['reward/mean']:g}, reward/std=0)"
        if metrics.get("reward/std") == 0
        else "the responses of each group got the same reward"
    )
    if group_relative:
        cause = f"{same}, so the group-relative advantages of {estimator} are all 0"
    else:
        zero = f"{estimator} gave every trained response an advantage of 0"
        cause = f"{same}, so {zero}" if metrics.get("reward/std") == 0 else zero
    left = []  # the gradient the step still has: the objective's terms that need no advantage
    if algo.beta > 0 and algo.kl_in == "loss":
        left.append(f"the KL penalty's (algo.beta={algo.beta}), which only pulls to the reference")
    if algo.entropy_coef:
        left.append(f"the entropy bonus's (algo.entropy_coef={algo.entropy_coef})")
    if algo.ptx_coef > 0:
        left.append(f"the pretraining loss's (algo.ptx_coef={algo.ptx_coef})")
    gradient = f" but {' and '.join(left)}" if left else ""
    raise_ = f"trainer.group_size={cfg.trainer.group_size} or " if group_relative else ""
    fixes = [
        "make the reward tell responses apart (partial credit, another component)",
        "use prompts the model solves some of the time",
        f"raise {raise_}sampler.temperature={cfg.sampler.temperature}",
    ]
    if not algo.dynamic_sampling:  # it drops the groups of equal values and samples more
        fixes.append(
            "turn on dynamic sampling (algo.dynamic_sampling=true, as algo=dapo does), which "
            "trains only on groups whose responses differ"
        )
    elif algo.filter_metric != "total":  # it kept groups whose filter values, not rewards, differ
        fixes.append(
            f"set algo.filter_metric=total (now {algo.filter_metric}), so that dynamic sampling "
            "keeps the groups whose rewards differ"
        )
    fix = f"{', '.join(fixes[:-1])}, or {fixes[-1]}"
    return f"{cause} and the policy loss has no gradient{gradient}: {fix}"


def response_advantages(rollout: Rollout, advantages: torch.Tensor) -> dict:
    """{(problem id, response text): advantage} of a batch; [B, T] advantages are averaged over
    each response's tokens."""
    if advantages.dim() == 2:
        mask = rollout.response_mask.to(advantages.device).float()
        advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keys = zip(rollout.prompt_ids, rollout.texts, strict=True)
    return dict(zip(keys, advantages.tolist(), strict=True))


@dataclass(frozen=True)
class StepResult:
    """What a step hands the loop, its one way out: the step's metrics (times in seconds),
    every response scored for it (the table of samples), each trained response's advantage,
    {(problem id, response text): advantage} (token-level ones: their mean over the
    response), and, when pushing the new weights to a rollout worker failed after the update,
    that failure: the step happened, so the loop writes it and saves it before stopping."""

    metrics: dict[str, float]
    samples: list = dataclasses.field(default_factory=list)
    advantages: dict = dataclasses.field(default_factory=dict)
    lost: WorkerLost | None = None


def train_step(run: Run) -> dict[str, float]:
    """One step: sample, score, update. Returns the step's metrics (times in seconds)."""
    return step(run).metrics


def step(run: Run) -> StepResult:
    """One step: collect (sample, score, shape) -> reference and old log-probs -> advantages
    -> learn -> push the new weights to the sampler."""
    s = run.settings
    start = time.perf_counter()
    # With sampler.max_staleness the workers sample the next steps' batches while this one trains.
    run.scorer.at_step(run.step, s.max_steps)  # TRL's trainer_state, for reward functions
    collected = run.collector.next_batch(steps_after=s.max_steps - run.step - 1)
    rollout, scores, metrics = collected.rollout, collected.scores, collected.metrics
    sampled = time.perf_counter()
    lengths = rollout.lengths.float()  # response tokens, tool turns left out
    rollout = left_out_of_the_loss(rollout, scores, s.overlong_filter)
    ref_logp, old_logp, kl_penalty = reference_and_old_logprobs(run, rollout, metrics)
    logprobs_done = time.perf_counter()
    batch = with_advantages(run, rollout, scores, lengths=lengths, old_logp=old_logp,
                            ref_logp=ref_logp, kl_penalty=kl_penalty)  # fmt: skip
    scored = time.perf_counter()
    lr = run.optimizer.param_groups[0]["lr"]  # this step's first update's (the schedule's)
    epochs = update(run, batch, metrics)
    learned = time.perf_counter()
    lost = None
    try:
        run.sampler.sync(run.policy)  # the next batch is sampled with the updated weights
    except WorkerLost as err:
        lost = err  # handed on with the step's results: its update is in the learner
    synced = time.perf_counter()
    metrics.update(run.sampler.metrics())
    adapt_kl_beta(run, epochs[-1].get("loss/kl", metrics.get("loss/kl")), len(rollout.texts))

    # A response teaches something when it has a non-zero advantage and tokens in the loss
    # (none does: `no_signal` says why).
    in_loss = (rollout.response_mask.sum(-1) > 0).to(batch.advantages.device)
    signal = batch.advantages.abs().reshape(len(rollout.texts), -1).amax(-1) > 0
    step_metrics = {
        **metrics,  # reward/mean, reward/std and reward/<component>: `collect.collector`
        "batch/response_utilisation": (signal & in_loss).float().mean().item(),
        # Response tokens left in the loss after failed rewards and the overlong filter; 0
        # means the step trained on nothing (`untrained_reason` says why).
        "batch/trained_token_share": trained_share(rollout.response_mask.sum(), lengths.sum()),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/truncated_frac": rollout.truncated.float().mean().item(),
        # Prompt and response tokens the learner reads (its FLOPs scale with these).
        "batch/tokens": float(rollout.attention_mask.sum()),
        **{key: sum(m[key] for m in epochs) / len(epochs) for key in epochs[0]},
        "nonfinite/skipped_updates": sum(m["nonfinite/skipped_updates"] for m in epochs),
        "kl/beta": run.beta,
        "actor/lr": lr,
        # Sampling now, or waiting for a batch sampled ahead (time/rollout_wait, within it).
        "time/sample": sampled - start - metrics["time/reward"],
        "time/logprobs": logprobs_done - sampled,
        "time/advantages": scored - logprobs_done,
        "time/learn": learned - scored,
        "time/sync": synced - learned,
        "time/step": synced - start,
        "throughput/tokens_per_s": lengths.sum().item() / (synced - start),
    }
    # Identical responses to one problem get identical advantages.
    per_response = response_advantages(rollout, batch.advantages)
    return StepResult(step_metrics, collected.samples, per_response, lost)


def left_out_of_the_loss(rollout: Rollout, scores: torch.Tensor, overlong_filter: bool) -> Rollout:
    """The rollout with the responses that teach nothing kept in the batch but out of the loss:
    those whose reward failed (or, for ReMax, whose greedy baseline's did), and the truncated
    ones under DAPO's overlong filter."""
    missing = scores.isnan()
    for value in rollout.estimator_inputs.values():
        if value.dim() == 1:  # one per response that failed (ReMax's greedy reward): no baseline
            missing = missing | value.to(missing.device).isnan()
    if missing.any():
        keep = (~missing).to(rollout.response_mask)[:, None]
        rollout = dataclasses.replace(rollout, response_mask=rollout.response_mask * keep)
    if overlong_filter:
        keep = (~rollout.truncated).to(rollout.response_mask)[:, None]
        rollout = dataclasses.replace(rollout, response_mask=rollout.response_mask * keep)
    return rollout


def learner_precision(run: Run):
    """A fresh context for each use of the learner's models: bfloat16 autocast where the
    learner computes in bfloat16 over float32 weights (LoRA, or trainer.bf16_weights=false);
    weights already in bfloat16 (the learner's working copy, a separate reference) need none."""
    return autocast(run.device, run.compute_dtype if run.learner_autocast else "float32")


def reference_and_old_logprobs(run: Run, rollout: Rollout, metrics: dict[str, float]):
    """(reference log-probs or None, old log-probs or None, the KL-in-reward penalty [B, T]);
    the penalty's mean KL goes into `metrics` as loss/kl."""
    s = run.settings
    sizes = s.logprob_passes
    ref_logp = None
    if run.reference is not None:
        # A LoRA run's reference is the policy itself, its adapters off for this pass.
        with learner_precision(run), adapters_off(run.reference):
            ref_logp = batch_logprobs(run.reference, rollout, *sizes)
    # With one update per batch the sampling policy is the current one, so its log-probs
    # equal the learner's own (detached); they are stored up front only when several updates
    # follow or the KL goes into the reward.
    kl_in_reward = s.kl_in_reward and ref_logp is not None
    need_old = s.updates_per_batch > 1 or kl_in_reward or run.critic is not None
    with learner_precision(run):
        old_logp = batch_logprobs(run.learner, rollout, *sizes) if need_old else None
    # The KL-in-reward penalty (PPO), beta * k1 per response token, made here for every
    # estimator; the estimators read it as a sequence or a per-token reward.
    kl_penalty = torch.zeros(rollout.response_mask.shape, device=run.device)
    if kl_in_reward:
        per_token = kl_reward_penalty(old_logp, ref_logp, rollout.response_mask, 1.0)
        metrics["loss/kl"] = (per_token.sum() / rollout.response_mask.sum().clamp(min=1)).item()
        kl_penalty = run.beta * per_token
    return ref_logp, old_logp, kl_penalty


def with_advantages(run: Run, rollout, scores, *, lengths, old_logp, ref_logp, kl_penalty):
    """The `TrainBatch`: the rollout with its advantages from the run's estimator (the
    critic's values first, for gae) and the log-probs the objective reads."""
    mbs = run.settings.plan.micro_batch_size
    old_values = batch_values(run.critic, rollout, mbs) if run.critic is not None else None
    advantages, returns = estimate(
        run.estimator,
        run.advantage_settings,
        x=AdvantageInputs(
            scores=scores,
            kl_penalty=kl_penalty,
            mask=rollout.response_mask,
            group_size=run.settings.group_size,
            prompt_ids=rollout.prompt_ids,
            state=run.estimator_state,
            values=old_values,
            lengths=lengths,
            **rollout.estimator_inputs,  # what scoring added for it (`Rollout.estimator_inputs`)
        ),
    )
    advantages = advantages.to(run.device)
    return TrainBatch(rollout, scores, advantages, old_logp, ref_logp, returns, old_values)


def update(run: Run, batch: TrainBatch, metrics: dict[str, float]) -> list[dict[str, float]]:
    """`trainer.epochs` passes of the learner over the batch (PPO-ptx's LM loss beside the
    objective), then the critic's; returns each epoch's metrics, the critic's go in `metrics`."""
    s = run.settings
    plan, mbs = s.plan, s.plan.micro_batch_size
    objective = dataclasses.replace(run.objective, beta=run.beta)
    ptx = None
    if s.ptx_coef > 0:

        def ptx():  # noqa: E306 - PPO-ptx: gamma_ptx * LM loss on a batch of pretraining text
            texts = run.rng.sample(run.ptx_texts, min(mbs, len(run.ptx_texts)))
            return s.ptx_coef * lm_loss(run.learner.lm, run.tokenizer, texts)

    with learner_precision(run), dropout_on(run.learner):
        epochs = [
            learn(run.learner, run.optimizer, objective, batch, plan, run.scheduler, ptx)
            for _ in range(s.epochs)
        ]
    if run.critic is not None:
        with dropout_on(run.critic):
            for _ in range(s.epochs):
                critic = learn_critic(
                    run.critic, run.critic_optimizer, batch, s.value_clip, s.vf_coef, plan
                )
                metrics.update(critic)
    return epochs


def adapt_kl_beta(run: Run, kl_now: float | None, responses: int) -> None:
    """`algo.kl_target`: the adaptive controller moves the KL coefficient towards the target."""
    s = run.settings
    if s.kl_target and kl_now is not None and math.isfinite(kl_now):
        run.beta = adaptive_kl_beta(run.beta, kl_now, s.kl_target, responses, s.kl_horizon)
