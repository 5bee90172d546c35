"""The training loop's collecting stage: each step's batch of groups, sampled, scored and
shaped as the algorithm asks, with the reward's metrics.

`Collector.next_batch()` draws the step's problems (this rank's share under torchrun), samples
a group for each through the run's sampler (or takes the round the workers sampled ahead,
`collect.stream.RoundsAhead`), scores every response and shapes the batch (DAPO's dynamic
sampling, DUPO's duplicates, ReMax's greedy baselines). It hands on one `Collected`, and is
handed the pieces it uses, not the whole config.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlcli.collect.sampling import sample_problems, score_rollout
from rlcli.collect.shaping import dupo_fill, filter_values, group_rows, informative_groups
from rlcli.collect.stream import RoundsAhead
from rlcli.config import ConfigError
from rlcli.data.problems import Problem, PromptRenderer, PromptStream
from rlcli.env.episode import episode_metrics
from rlcli.rewards.scored import ScoredSample, scored_samples
from rlcli.rewards.scorer import Sample, Scores
from rlcli.rollout.batch import Rollout, concat_rollouts, select_rows
from rlcli.rollout.contract import Sampler


@dataclass(frozen=True)
class Shaping:
    """Which groups a step keeps: `algo`'s dynamic_sampling, max_gen_batches, filter_metric
    and dupo_fill, and the reward's component names that filter_metric may name."""

    dynamic_sampling: bool = False
    max_gen_batches: int = 1
    filter_metric: str = "correctness"
    dupo_fill: bool = False
    components: tuple[str, ...] = ()


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


def staleness_metrics(batch: Rollout, version: int, max_staleness: int) -> dict[str, float]:
    """How old the batch's trained tokens are, in weight updates: the learner holds `version`
    and each token was sampled by `batch.token_versions`' version. Their mean, maximum, the
    share at each staleness 0..max_staleness (the histogram curves.png draws), and how many
    versions a response spans on average (more than one: new weights arrived mid-response)."""
    tokens = (batch.response_mask > 0) & (batch.token_versions >= 0)
    staleness = (version - batch.token_versions)[tokens].float()
    n = max(staleness.numel(), 1)
    spans = [len(versions) for versions in batch.spanned_versions]
    metrics = {
        "rollout/staleness_mean": float(staleness.sum()) / n,
        "rollout/staleness_max": float(staleness.max()) if staleness.numel() else 0.0,
        "rollout/versions_per_response": sum(spans) / max(len(spans), 1),
    }
    for k in range(max_staleness + 1):
        metrics[f"rollout/staleness_{k}"] = float((staleness == k).sum()) / n
    return metrics


@dataclass(frozen=True)
class Collected:
    """What the collecting stage hands on: the batch to train on, its total rewards, the
    reward's and the batch's metrics, and every response scored for it (under dynamic sampling
    the dropped groups' too, and ReMax's greedy replies), for the table of samples."""

    rollout: Rollout
    scores: torch.Tensor  # [B]
    metrics: dict[str, float]
    samples: list[ScoredSample]


class Collector:
    """Each step's batch: `next_batch()` -> `Collected`."""

    def __init__(
        self,
        *,
        sampler: Sampler,
        scorer: Callable[[list[Sample]], Scores],
        render: PromptRenderer,
        prompts: PromptStream,
        prompts_per_step: int,  # this rank's share
        group_size: int,
        shaping: Shaping,
        # What the advantage estimator needs of the batch (its `needs`): "greedy" adds a
        # greedy response per prompt, scored (ReMax's baseline), as `greedy_scores`.
        needs: frozenset[str],
        rng: random.Random,  # DUPO's choice of groups to duplicate
        max_staleness: int = 0,  # >= 1: rounds sampled that many steps ahead (RoundsAhead)
        rank: int = 0,
        world: int = 1,
    ):
        self.sampler, self.scorer, self.render, self.prompts = sampler, scorer, render, prompts
        self.P, self.G, self.shaping = prompts_per_step, group_size, shaping
        self.greedy = "greedy" in needs
        self.rng, self.rank, self.world = rng, rank, world
        self.max_staleness = max_staleness
        self.ahead = (
            RoundsAhead(max_staleness, self._draw, lambda: self.prompts.position, self._sample)
            if max_staleness
            else None
        )
        self.reward_seconds = self.waited = 0.0
        self.scored: list[ScoredSample] = []  # this step's, so far

    def _draw(self) -> list[Problem]:
        """This rank's share of the next problems of the stream (every rank draws them all)."""
        return self.prompts.take(self.P * self.world)[self.rank :: self.world]

    def _score(self, samples: list[Sample]) -> Scores:
        begin = time.perf_counter()  # reward time is reported apart from sampling time
        scores = self.scorer(samples)
        self.reward_seconds += time.perf_counter() - begin
        self.scored += scored_samples(samples, scores)
        return scores

    def _sample(self, problems: list[Problem]) -> tuple[Rollout, Rollout | None]:
        """A group per problem, and ReMax's greedy reply to each when it needs them."""
        batch = sample_problems(self.sampler, self.render, problems, self.G)
        if not self.greedy:
            return batch, None
        return batch, sample_problems(self.sampler, self.render, problems, 1, temperature=0.0)

    def _round(self) -> tuple[Rollout, Scores]:
        """One generation round, scored: sampled now, or taken from the rounds sampled ahead."""
        if self.ahead is None:
            problems = self._draw()
            batch, greedy = self._sample(problems)
        else:
            begin = time.perf_counter()  # the learner's wait for generation
            problems, (batch, greedy) = self.ahead.take()
            self.waited += time.perf_counter() - begin
        batch, scores = score_rollout(self._score, self.render, problems, self.G, batch)
        if greedy is not None:
            _, greedy_scores = score_rollout(self._score, self.render, problems, 1, greedy)
            baseline = greedy_scores.total.repeat_interleave(self.G)
            inputs = {**batch.estimator_inputs, "greedy_scores": baseline}
            batch = dataclasses.replace(batch, estimator_inputs=inputs)
        return batch, scores

    def resume_position(self) -> tuple[int, int]:
        """(the prompt stream's position a checkpoint records, the rounds sampled ahead that
        it leaves out): a resumed run samples those rounds' problems again."""
        if self.ahead is None or (oldest := self.ahead.oldest_position()) is None:
            return self.prompts.position, 0
        return oldest, len(self.ahead.queue)

    def next_batch(self, steps_after: int = 0) -> Collected:
        """The step's batch of P groups, shaped, its scores and metrics. DAPO's dynamic sampling
        keeps only the groups whose `algo.filter_metric` differs and samples more rounds until
        the batch is full (at most `max_gen_batches`, then the groups found, and an error only
        if there are none); DUPO replaces zero-signal groups by duplicates of informative ones.
        `steps_after`: the steps still to come after this one, which rounds sampled ahead are
        for (their metrics say how old each token is: `staleness_metrics`)."""
        P, G, shaping = self.P, self.G, self.shaping
        self.reward_seconds, self.waited, self.scored = 0.0, 0.0, []
        parts, kept_scores, rounds, sampled_groups, equal_groups = [], [], [], 0, 0
        episodes = []
        for _ in range(shaping.max_gen_batches if shaping.dynamic_sampling else 1):
            batch, round_scores = self._round()
            rounds.append(round_scores)
            episodes += batch.episodes or []
            scores = round_scores.total
            judged = filter_values(round_scores, shaping.filter_metric, list(shaping.components))
            informative = informative_groups(judged.view(P, G))
            sampled_groups += P
            equal_groups += int((~informative).sum())
            if not shaping.dynamic_sampling:
                break
            keep = informative.nonzero().flatten().tolist()
            parts.append(select_rows(batch, group_rows(keep, G)))
            kept_scores.append(scores.view(P, G)[keep].flatten())
            if sum(len(p.texts) for p in parts) >= P * G:
                batch = concat_rollouts(parts, self.render.tokenizer.pad_token_id)
                batch = select_rows(batch, list(range(P * G)))
                scores = torch.cat(kept_scores)[: P * G]
                break
        else:
            batch, scores = self._whatever_was_found(parts, kept_scores)
        if self.ahead is not None:  # the workers go on with the next steps' rounds
            self.ahead.top_up(steps_after)
        metrics = {
            **reward_metrics(rounds),
            "batch/groups_all_equal": equal_groups / sampled_groups,
            "batch/gen_batches": float(sampled_groups // P),
            "time/reward": self.reward_seconds,
            "time/rollout_wait": self.waited,
        }
        if episodes:  # env=...: every episode sampled this step, as the rewards' metrics
            metrics.update(episode_metrics(episodes))
        if batch.token_versions is not None:
            metrics.update(staleness_metrics(batch, self.sampler.version, self.max_staleness))
        if shaping.dynamic_sampling:
            metrics["batch/groups_short"] = float(P - len(batch.texts) // G)
        if shaping.dupo_fill:
            slots = dupo_fill(informative.tolist(), self.rng)  # one round: its groups as sampled
            metrics["batch/duplicated_groups"] = float(sum(g != i for i, g in enumerate(slots)))
            rows = group_rows(slots, G)
            batch, scores = select_rows(batch, rows), scores[rows]
        return Collected(batch, scores, metrics, self.scored)

    def _whatever_was_found(self, parts, kept_scores) -> tuple[Rollout, torch.Tensor]:
        """Dynamic sampling's last round is done and the batch is not full: the groups found."""
        found = sum(len(p.texts) for p in parts) // self.G
        if not found:
            shaping = self.shaping
            raise ConfigError(
                f"DAPO dynamic sampling found only {found} of {self.P} groups whose "
                f"{shaping.filter_metric} (algo.filter_metric) differs after "
                f"algo.max_gen_batches={shaping.max_gen_batches} generation rounds: every group "
                "is all right or all wrong. Raise algo.max_gen_batches, use an "
                "easier or harder dataset, or turn it off with algo.dynamic_sampling=false."
            )
        # A short batch beats stopping a run whose policy has nearly mastered its prompts.
        return concat_rollouts(parts, self.render.tokenizer.pad_token_id), torch.cat(kept_scores)
