"""One RL step, top to bottom: sample and score -> shape the batch -> reference and old
log-probs -> advantages -> learn -> push the new weights to the sampler.

`collect_batch` samples and shapes (DAPO's dynamic sampling, DUPO's duplicates);
`train_step` builds the `TrainBatch` and hands it to the learner. The math lives in
`rlcli.ops` (advantages, the objective's pieces), picked through their registries.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import torch

from rlcli.config import Config, ConfigError
from rlcli.data.problems import render_prompt
from rlcli.env import system_prompt
from rlcli.ops.advantages import AdvantageInputs
from rlcli.ops.estimate import estimate
from rlcli.ops.policy_loss import adaptive_kl_beta, kl_reward_penalty
from rlcli.rewards.components import component_names
from rlcli.rewards.sampling import sample_and_score
from rlcli.rewards.scorer import Scores
from rlcli.rollout.batch import Rollout, concat_rollouts, select_rows
from rlcli.rollout.servers import WorkerLost
from rlcli.runtime import distributed
from rlcli.runtime.lora import adapters_off, dropout_on
from rlcli.runtime.models import autocast
from rlcli.train.batch import TrainBatch
from rlcli.train.critic import batch_values, learn_critic
from rlcli.train.forward import batch_logprobs
from rlcli.train.learner import UpdatePlan, learn, lm_loss
from rlcli.train.run import Run
from rlcli.train.shaping import dupo_fill, group_rows, informative_groups


def reward_metrics(rounds: list[Scores]) -> dict[str, float]:
    """reward/mean, reward/std, each component's mean and the failures, over every response
    sampled this step."""
    # One set of responses for all of them: under DAPO's dynamic sampling every round's, the
    # groups dropped too (what the policy produced this step, not the kept groups' mean, which
    # the filter pulls towards the middle); under DUPO the groups as sampled, before duplicates.
    joined = Scores(
        total=torch.cat([r.total for r in rounds]),
        components={k: torch.cat([r.components[k] for r in rounds]) for k in rounds[0].components},
        errors=[e for r in rounds for e in r.errors],
        log_only=rounds[0].log_only,
    )
    return joined.metrics()


def filter_values(scores: Scores, metric: str, components: list[str]) -> torch.Tensor:
    """What dynamic sampling and DUPO compare within a group (`algo.filter_metric`): the total
    reward, or one component's unweighted score (correctness: the first component).  # [B]"""
    name = components[0] if metric == "correctness" else metric
    return scores.total if name == "total" else scores.components[name]


def collect_batch(run: Run) -> tuple[Rollout, torch.Tensor, dict[str, float]]:
    """The step's batch of prompts_per_step groups, shaped as the algorithm asks.

    DAPO dynamic sampling keeps only groups whose `algo.filter_metric` differs (by default
    correctness: accuracy strictly between 0 and 1, DAPO eq. 11) and samples more prompts
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
        # The first round's problems were drawn a step early when the workers sample ahead.
        problems = run.next_problems or run.prompts.take(P * world)[distributed.rank() :: world]
        run.next_problems = None
        batch, round_scores = sample_and_score(
            run.sampler, timed_scorer, run.tokenizer, problems, G, system_prompt(run.cfg)
        )
        if "greedy" in run.estimator.needs:  # ReMax's baseline
            _, greedy = sample_and_score(run.sampler, timed_scorer, run.tokenizer, problems, 1,
                                         system_prompt(run.cfg), temperature=0.0)  # fmt: skip
            baseline = greedy.total.repeat_interleave(G)
            batch = dataclasses.replace(batch, baseline_scores=baseline)
        rounds.append(round_scores)
        scores = round_scores.total
        judged = filter_values(round_scores, algo.filter_metric, component_names(run.cfg.reward))
        informative = informative_groups(judged.view(P, G))
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
                f"DAPO dynamic sampling found only {found} of {P} groups whose "
                f"{algo.filter_metric} (algo.filter_metric) differs after "
                f"algo.max_gen_batches={algo.max_gen_batches} generation rounds: every group is "
                "all right or all wrong. Raise algo.max_gen_batches, use an "
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
        slots = dupo_fill(informative.tolist(), run.rng)  # one round: its groups as sampled
        metrics["batch/duplicated_groups"] = float(sum(g != i for i, g in enumerate(slots)))
        rows = group_rows(slots, G)
        batch, scores = select_rows(batch, rows), scores[rows]
    return batch, scores, metrics


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


def response_advantages(rollout: Rollout, advantages: torch.Tensor) -> dict:
    """{(problem id, response text): advantage} of a batch; [B, T] advantages are averaged over
    each response's tokens."""
    if advantages.dim() == 2:
        mask = rollout.response_mask.to(advantages.device).float()
        advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keys = zip(rollout.prompt_ids, rollout.texts, strict=True)
    return dict(zip(keys, advantages.tolist(), strict=True))


def prefetch_next(run: Run) -> None:
    """Have the rollout workers start on the next step's batch (sampler.async_rollout): they
    generate it with the weights they hold while the learner trains on this one."""
    t, world = run.cfg.trainer, distributed.world_size()
    problems = run.prompts.take(t.prompts_per_step)[distributed.rank() :: world]
    run.next_problems = problems
    prompts = [render_prompt(run.tokenizer, p.question, system_prompt(run.cfg)) for p in problems]
    ids, answers = [p.id for p in problems], [p.answer for p in problems]
    run.sampler.prefetch(prompts, t.group_size, ids, answers)


def train_step(run: Run) -> dict[str, float]:
    """One step: sample, score, update. Returns the step's metrics (times in seconds)."""
    return step(run)[0]


def step(run: Run) -> tuple[dict[str, float], dict]:
    """One step: sample, score, update. Returns the step's metrics (times in seconds) and each
    trained response's advantage, {(problem id, response text): advantage} (token-level ones:
    their mean over the response), for samples.jsonl."""
    t, algo = run.cfg.trainer, run.cfg.algo
    start = time.perf_counter()
    rollout, scores, metrics = collect_batch(run)
    if run.cfg.sampler.async_rollout and run.step + 1 < t.max_steps:
        prefetch_next(run)
    sampled = time.perf_counter()

    lengths = rollout.lengths.float()  # response tokens, tool turns left out
    missing = scores.isnan()
    if rollout.baseline_scores is not None:  # ReMax: no greedy reward, no baseline to learn from
        missing = missing | rollout.baseline_scores.to(missing.device).isnan()
    if missing.any():
        # A response whose reward failed teaches nothing: it stays out of the loss.
        keep = (~missing).to(rollout.response_mask)[:, None]
        rollout = dataclasses.replace(rollout, response_mask=rollout.response_mask * keep)
    if algo.overlong_filter:
        # DAPO overlong filtering: truncated responses stay in the batch but out of the loss.
        keep = (~rollout.truncated).to(rollout.response_mask)[:, None]
        rollout = dataclasses.replace(rollout, response_mask=rollout.response_mask * keep)

    mbs, tokens, share = t.micro_batch_size, t.max_tokens_per_micro_batch, t.share_prompts
    temp = run.cfg.sampler.temperature
    # bfloat16 autocast where the learner computes in bfloat16 over float32 weights (LoRA, or
    # trainer.bf16_weights=false); weights already in bfloat16 (the learner's working copy, a
    # separate reference) need none. A fresh context for each use.
    autocast_dtype = run.compute_dtype if run.learner_autocast else "float32"
    precision = functools.partial(autocast, run.device, autocast_dtype)
    ref_logp = None
    if run.reference is not None:
        # A LoRA run's reference is the policy itself, its adapters off for this pass.
        with precision(), adapters_off(run.reference):
            ref_logp = batch_logprobs(run.reference, rollout, mbs, temp, tokens, share)
    # With one update per batch the sampling policy is the current one, so its log-probs
    # equal the learner's own (detached); they are stored up front only when several updates
    # follow or the KL goes into the reward.
    kl_in_reward = algo.kl_in == "reward" and ref_logp is not None
    need_old = t.mini_batches * t.epochs > 1 or kl_in_reward or run.critic is not None
    with precision():
        old_logp = (
            batch_logprobs(run.learner, rollout, mbs, temp, tokens, share) if need_old else None
        )
    # The KL-in-reward penalty (PPO), beta * k1 per response token, made here for every
    # estimator; the estimators read it as a sequence or a per-token reward.
    kl_penalty = torch.zeros(rollout.response_mask.shape, device=run.device)
    if kl_in_reward:
        per_token = kl_reward_penalty(old_logp, ref_logp, rollout.response_mask, 1.0)
        metrics["loss/kl"] = (per_token.sum() / rollout.response_mask.sum().clamp(min=1)).item()
        kl_penalty = run.beta * per_token
    logprobs_done = time.perf_counter()

    old_values = batch_values(run.critic, rollout, mbs) if run.critic is not None else None
    advantages, returns = estimate(
        run.estimator,
        run.advantage_settings,
        x=AdvantageInputs(
            scores=scores,
            kl_penalty=kl_penalty,
            mask=rollout.response_mask,
            group_size=t.group_size,
            prompt_ids=rollout.prompt_ids,
            sas=run.sas,
            values=old_values,
            step_rewards=rollout.step_rewards,
            lengths=lengths,
            greedy_scores=rollout.baseline_scores,
        ),
    )
    advantages = advantages.to(run.device)
    batch = TrainBatch(rollout, scores, advantages, old_logp, ref_logp, returns, old_values)
    # A response teaches something when it has a non-zero advantage and tokens in the loss.
    in_loss = (rollout.response_mask.sum(-1) > 0).to(advantages.device)
    signal = advantages.abs().reshape(len(rollout.texts), -1).amax(-1) > 0
    responses_with_signal = (signal & in_loss).float()
    scored = time.perf_counter()

    objective = dataclasses.replace(run.objective, beta=run.beta)
    plan = UpdatePlan(t.mini_batches, mbs, tokens, t.max_grad_norm, share)
    ptx = None
    if algo.ptx_coef > 0:

        def ptx():  # noqa: E306 - PPO-ptx: gamma_ptx * LM loss on a batch of pretraining text
            texts = run.rng.sample(run.ptx_texts, min(mbs, len(run.ptx_texts)))
            return algo.ptx_coef * lm_loss(run.learner.lm, run.tokenizer, texts)

    lr = run.optimizer.param_groups[0]["lr"]  # this step's first update's (the schedule's)
    with precision(), dropout_on(run.learner):
        epochs = [
            learn(run.learner, run.optimizer, objective, batch, plan, run.scheduler, ptx)
            for _ in range(t.epochs)
        ]
    if run.critic is not None:
        with dropout_on(run.critic):
            for _ in range(t.epochs):
                metrics.update(
                    learn_critic(
                        run.critic, run.critic_optimizer, batch, algo.value_clip, algo.vf_coef, plan
                    )
                )
    learned = time.perf_counter()
    lost = None
    try:
        run.sampler.sync(run.policy)  # the next batch is sampled with the updated weights
    except WorkerLost as err:
        lost = err  # raised below, once the step's metrics are made
    synced = time.perf_counter()
    metrics.update(run.sampler.metrics())

    kl_now = epochs[-1].get("loss/kl", metrics.get("loss/kl"))
    if algo.kl_target and kl_now is not None and math.isfinite(kl_now):
        n = len(rollout.texts)
        run.beta = adaptive_kl_beta(run.beta, kl_now, algo.kl_target, n, algo.kl_horizon)
    step_metrics = {
        **metrics,  # reward/mean, reward/std and reward/<component>: `reward_metrics`
        "batch/response_utilisation": responses_with_signal.mean().item(),
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
        "time/sample": sampled - start - metrics["time/reward"],
        "time/logprobs": logprobs_done - sampled,
        "time/advantages": scored - logprobs_done,
        "time/learn": learned - scored,
        "time/sync": synced - learned,
        "time/step": synced - start,
        "throughput/tokens_per_s": lengths.sum().item() / (synced - start),
    }
    # Identical responses to one problem get identical advantages.
    per_response = response_advantages(rollout, advantages)
    if lost is not None:
        # This step's update is in the learner: the loop writes its metrics and saves it as
        # done, so the resumed run neither loses nor repeats it.
        lost.step_metrics, lost.step_advantages = step_metrics, per_response
        raise lost
    return step_metrics, per_response
