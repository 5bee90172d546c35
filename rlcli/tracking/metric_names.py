"""Every metric a run writes to metrics.jsonl (and to W&B, TensorBoard, MLflow), by prefix.

One row per name, with what it means and which runs write it. A name may be a pattern whose
`<part>` stands for any name without a slash (`reward/<component>`). docs/reference/metrics.md
is generated from this table (`scripts/make_docs.py`); tests/docs/test_docs_generated.py runs short
trainings of each kind and checks that every name they write is here, and every name here is
written by one of them or named there as written only by runs it does not make.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `when` of a metric every RL step writes (every algo but dpo).
RL = "RL"


@dataclass(frozen=True)
class Metric:
    name: str  # the key in metrics.jsonl, or a pattern with <part>s
    meaning: str  # one line: what it measures, its unit
    when: str = RL  # the runs that write it: RL, "every run", or the settings that add it


@dataclass(frozen=True)
class MetricGroup:
    prefix: str  # the names' first part, with its slash ("step" alone has none)
    about: str  # one line on the group
    metrics: tuple[Metric, ...]


DPO = "algo=dpo"
EVERY = "every run"

# fmt: off
METRIC_GROUPS: tuple[MetricGroup, ...] = (
    MetricGroup("step", "The row's step.", (
        Metric("step", "The optimiser step the row belongs to, from 1; 0 for the evaluation "
               "before training (trainer.val_before_train).", EVERY),
    )),
    MetricGroup("reward/", "Rewards of the step's sampled responses (DPO: implicit rewards).", (
        Metric("reward/mean", "Mean total reward of every response sampled this step: under "
               "dynamic sampling every round's, the dropped groups too (failed rewards left "
               "out)."),
        Metric("reward/std", "Standard deviation of those totals."),
        Metric("reward/<component>", "Each reward component's own unweighted mean over every "
               "response sampled this step (`reward/math`, `reward/format`, `reward/overlong`, "
               "...)."),
        Metric("reward/errors", "Responses whose reward failed (raised, timed out, None, not "
               "a number in float32's range); they carry no loss."),
        Metric("reward/log_only_errors", "Scores that log-only components failed to give "
               "(raised, timed out, None, not a number), summed over them; training is "
               "unaffected.", "a reward.weights entry of 0"),
        Metric("reward/accuracy", "Share of pairs whose chosen reply has the larger implicit "
               "reward.", DPO),
        Metric("reward/margin", "Mean implicit reward of chosen minus rejected replies.", DPO),
        Metric("reward/chosen", "Mean implicit reward beta (logp - ref_logp) of the chosen "
               "replies.", DPO),
        Metric("reward/rejected", "Mean implicit reward of the rejected replies.", DPO),
    )),
    MetricGroup("loss/", "The objective.", (
        Metric("loss/policy", "The policy loss minimised this step (mean over its optimiser "
               "steps; DPO: the DPO loss).", EVERY),
        Metric("loss/kl", "Mean per-token KL to the reference (algo.kl's estimator in the "
               "loss; k1 with algo.kl_in=reward).", "algo.beta > 0"),
    )),
    MetricGroup("actor/", "The policy's optimiser.", (
        Metric("actor/grad_norm", "Global gradient norm before clipping (mean over the "
               "step's optimiser steps).", EVERY),
        Metric("actor/lr", "Learning rate after the step (warm-up moves it)."),
        Metric("actor/entropy", "Mean entropy of the policy's next-token distribution over "
               "the trained tokens."),
    )),
    MetricGroup("policy/", "How far the updates moved the policy.", (
        Metric("policy/approx_kl", "KL(old || new) by k3 on the trained tokens: 0 in a "
               "step's first update, larger with mini-batches and epochs."),
    )),
    MetricGroup("clip/", "Share of trained tokens where a clip bound was the active term.", (
        Metric("clip/frac", "clip/low + clip/high + clip/dual.", "algo.loss clips (ppo_clip, "
               "clip_cov, luspo)"),
        Metric("clip/low", "Ratio below the lower bound, negative advantage.", "as clip/frac"),
        Metric("clip/high", "Ratio above the upper bound, positive advantage.", "as clip/frac"),
        Metric("clip/dual", "Negative advantage bounded by algo.dual_clip.", "as clip/frac"),
    )),
    MetricGroup("<loss>/", "What a loss of its own counts, as a share of trained tokens (a "
                "loss from your file logs the names it returns).", (
        Metric("cispo/capped", "Tokens whose importance weight was capped.", "algo.loss=cispo"),
        Metric("sapo/damped", "Tokens whose soft gate's slope fell below half.",
               "algo.loss=sapo"),
        Metric("gmpo/clipped", "Tokens whose log-ratio was clipped.", "algo.loss=gmpo"),
        Metric("clip_cov/detached", "High-covariance tokens whose gradient was cut.",
               "algo.loss=clip_cov"),
        Metric("kl_cov/penalised", "High-covariance tokens given the KL penalty.",
               "algo.loss=kl_cov"),
    )),
    MetricGroup("kl/", "The KL coefficient.", (
        Metric("kl/beta", "beta in force (moves with the adaptive controller, "
               "algo.kl_target)."),
    )),
    MetricGroup("value/", "PPO's critic.", (
        Metric("value/loss", "Clipped value loss, times algo.vf_coef.", "algo=ppo"),
        Metric("value/clip_frac", "Share of tokens whose value was clipped (algo.value_clip).",
               "algo=ppo"),
        Metric("value/explained_variance", "1 - Var(returns - values) / Var(returns): 1 is a "
               "perfect critic.", "algo=ppo"),
    )),
    MetricGroup("ptx/", "PPO-ptx.", (
        Metric("ptx/loss", "algo.ptx_coef times the LM loss on pretraining text.",
               "algo.ptx_coef > 0"),
    )),
    MetricGroup("logp/", "DPO's sequence log-probabilities.", (
        Metric("logp/chosen", "Mean log-probability of the chosen replies under the policy.",
               DPO),
        Metric("logp/rejected", "Mean log-probability of the rejected replies.", DPO),
    )),
    MetricGroup("batch/", "What the learner trained on.", (
        Metric("batch/tokens", "Prompt and response tokens of the batch, each response with "
               "its own prompt."),
        Metric("batch/learner_tokens", "Tokens a pass of the learner over the batch read, "
               "padding not counted: a group's prompt once (trainer.share_prompts)."),
        Metric("batch/padding_frac", "Share of the learner's token slots that were padding."),
        Metric("batch/trained_token_share", "Share of the sampled response tokens that enter "
               "the loss (0: the step trained on nothing; a warning says why)."),
        Metric("batch/response_utilisation", "Share of responses with a non-zero advantage "
               "and tokens in the loss (the rest carry no policy gradient; 0: the step had no "
               "learning signal, and a warning says why)."),
        Metric("batch/groups_all_equal", "Share of sampled groups whose algo.filter_metric "
               "was the same for every response."),
        Metric("batch/gen_batches", "Generation rounds sampled this step (more than 1 with "
               "dynamic sampling)."),
        Metric("batch/groups_short", "Groups the batch lacked after algo.max_gen_batches "
               "rounds.", "algo.dynamic_sampling"),
        Metric("batch/duplicated_groups", "Groups replaced by copies of informative ones "
               "(DUPO).", "algo.dupo_fill"),
    )),
    MetricGroup("response/", "Sampled responses, in tokens.", (
        Metric("response/length_mean", "Mean response length."),
        Metric("response/length_max", "Longest response."),
        Metric("response/truncated_frac", "Share of responses cut at sampler.max_new_tokens "
               "(or env.max_tokens)."),
    )),
    MetricGroup("rollout/", "The sampler against the learner.", (
        Metric("rollout/logp_abs_diff", "Mean |learner logp - sampler logp| on the sampled "
               "tokens.", "sampler=vllm"),
        Metric("rollout/kl", "KL(sampler || learner) by k3 on the sampled tokens.",
               "sampler=vllm"),
        Metric("rollout/is_capped", "Share of tokens whose behaviour weight exceeded "
               "sampler.tis_cap (truncated or masked, sampler.is_correction).",
               "sampler.old_logp=sampler"),
        Metric("rollout/staleness_mean", "Weight updates between the weights that sampled each "
               "trained token and the learner's, the mean over tokens.",
               "sampler.workers or sampler.urls"),
        Metric("rollout/staleness_max", "The same, the oldest token's (at most "
               "sampler.max_staleness).", "sampler.workers or sampler.urls"),
        Metric("rollout/staleness_<k>", "Share of trained tokens k updates old, k = 0 .. "
               "sampler.max_staleness (the histogram curves.png draws).",
               "sampler.workers or sampler.urls"),
        Metric("rollout/versions_per_response", "Weight versions a response spans, the mean "
               "(above 1: new weights arrived mid-response).", "sampler.workers or sampler.urls"),
        Metric("rollout/generating_share", "Share of the time since the last step's row during "
               "which the workers had requests (a push's pause not counted), the mean over "
               "workers.", "sampler.workers or sampler.urls"),
        Metric("rollout/paused_s", "Seconds since the last step's row during which the workers "
               "were paused for a weight push (streamed only; with gloo, on CPU, just the load, "
               "as they receive the weights generating).", "sampler.workers or sampler.urls"),
    )),
    MetricGroup("env/", "Multi-turn episodes with tools.", (
        Metric("env/turns_mean", "Model turns per episode.", "env=..."),
        Metric("env/tool_calls", "Tool calls in the step's episodes.", "env=..."),
        Metric("env/tool_errors", "Calls that failed (unknown tool, bad input, an error).",
               "env=..."),
        Metric("env/timeouts", "Calls stopped at their time limit.", "env=..."),
        Metric("env/tool_call_rate", "Share of episodes that called a tool.", "env=..."),
        Metric("env/tool_tokens_mean", "Tool-output tokens per episode (in the context, out "
               "of the loss).", "env=..."),
    )),
    MetricGroup("eval/", "Held-out evaluation, on the steps it runs (and at step 0 with "
                "trainer.val_before_train).", (
        Metric("eval/accuracy", "Share of held-out problems whose greedy reply is correct "
               "(reward above eval.correct_above).", "trainer.eval_every > 0"),
        Metric("eval/pass@<k>", "pass@k from eval.k samples per problem, k = 1, 2, 4, ..., "
               "eval.k (in MLflow eval/pass_at_<k>: it refuses '@').", "trainer.eval_every > 0"),
        Metric("eval/tool_call_rate", "Share of greedy held-out episodes that called a tool.",
               "trainer.eval_every > 0, env=..."),
        Metric("eval/loss", "DPO loss on the held-out pairs, after the last step.", DPO),
        Metric("eval/reward/accuracy", "reward/accuracy on the held-out pairs.", DPO),
        Metric("eval/reward/margin", "reward/margin on the held-out pairs.", DPO),
    )),
    MetricGroup("nonfinite/", "The NaN guard.", (
        Metric("nonfinite/skipped_updates", "Updates skipped because the loss or gradient "
               "was NaN or inf (trainer.max_bad_steps in a row stop the run).", EVERY),
    )),
    MetricGroup("time/", "Seconds (the slowest rank's under torchrun).", (
        Metric("time/step", "The whole step.", EVERY),
        Metric("time/sample", "Sampling, without scoring."),
        Metric("time/reward", "Scoring."),
        Metric("time/logprobs", "Reference and old-policy log-probs, the KL-in-reward."),
        Metric("time/advantages", "Advantages (and the critic's values)."),
        Metric("time/learn", "The policy's (and critic's) updates."),
        Metric("time/sync", "Pushing the new weights to the sampler."),
        Metric("time/rollout_wait", "How long the step waited for a batch the workers were "
               "sampling ahead (part of time/sample; 0 unless sampler.max_staleness >= 1)."),
    )),
    MetricGroup("throughput/", "Speed (summed over ranks).", (
        Metric("throughput/tokens_per_s", "Response tokens sampled per second of step time."),
    )),
)
# fmt: on


def all_metrics() -> list[Metric]:
    return [metric for group in METRIC_GROUPS for metric in group.metrics]


def _regex(name: str) -> re.Pattern:
    """A name's pattern: each `<part>` matches one slash-free name."""
    parts = re.split(r"<[^>]+>", name)
    return re.compile("[^/]+".join(re.escape(p) for p in parts) + r"\Z")


def documented(key: str) -> Metric | None:
    """The table's row for a metric key: its own name first, else a pattern it matches."""
    rows = all_metrics()
    exact = [m for m in rows if m.name == key]
    if exact:
        return exact[0]
    return next((m for m in rows if "<" in m.name and _regex(m.name).match(key)), None)
