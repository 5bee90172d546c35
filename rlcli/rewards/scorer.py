"""Scoring a batch of responses: the configured reward components, weighted and isolated.

`reward.components` names the components and `reward.weights` their weights (default 1);
`python` stands for the functions of `reward.function`, each a component named after itself
(`rlcli.rewards.components`). `Scorer.score` gives each response the weighted sum, NaN where a
trained component failed; a batch with no score at all is `Unscorable`. The rules
(`rlcli.rewards`) run in this process under a SIGALRM time limit; the user's functions run in
worker processes (`rlcli.rewards.worker`), one per function, so that one that hangs, exits,
crashes or prints costs its samples, not the run.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from rlcli.config import ConfigError, RewardConfig
from rlcli.data.problems import Problem
from rlcli.ops.policy_loss import overlong_penalty
from rlcli.rewards.components import component_names, function_name, function_specs
from rlcli.rewards.conventions import CallPlan, as_score, call_keywords
from rlcli.rewards.rules import RULES, call_rule
from rlcli.rewards.worker import BadSpec, FunctionWorker, WorkerLost, describe

log = logging.getLogger("rlcli")


@dataclass(frozen=True)
class Sample:
    """One response to score, with what its problem knows."""

    question: str  # the prompt text, before chat rendering
    response: str
    answer: str  # ground truth
    record: dict  # the dataset record's fields (countdown's numbers and target, ...)
    length: int  # response tokens
    problem_id: str = ""  # the problem's id (a group's responses share it)
    # [n] the response's token ids, tool turns included (a view into the rollout): TRL's
    # completion_ids, made a list only for a function that names them
    token_ids: Tensor | None = None
    # The episode's transcript (env=...: its turns, tool calls and outputs, token counts;
    # `env.episode.Episode.transcript`), which samples.jsonl writes; None for one reply
    episode: dict | None = None
    # The weight versions that sampled its tokens, oldest first (rollout workers; more than
    # one when the weights changed mid-response, sampler.max_staleness >= 1); None otherwise
    versions: list[int] | None = None
    # Its prompt as chat messages, for conversational data (`Problem.conversation`); None
    # for a text prompt
    conversation: tuple[dict, ...] | None = None


@dataclass
class Scores:
    """A batch's rewards. B responses; NaN marks a missing score."""

    total: Tensor  # [B] weighted sum of the components, plus the overlong punishment
    components: dict[str, Tensor]  # [B] each component's own (unweighted) score
    errors: list[str]  # why samples went missing, one line per failure
    # process reward only: per response, (character where a step ends, that step's score)
    steps: list[list[tuple[int, float]]] | None = None
    log_only: tuple[str, ...] = ()  # the components of weight 0: logged, not in `total`

    @property
    def missing(self) -> Tensor:  # [B] bool
        return self.total.isnan()

    def metrics(self) -> dict[str, float]:
        """reward/mean and reward/std of the totals, reward/<component> of each component,
        reward/errors and, with log-only components, reward/log_only_errors, all over the same
        responses: these."""
        scored = self.total[~self.missing]
        out = {
            "reward/mean": nanmean(self.total),
            "reward/std": scored.std().item() if scored.numel() > 1 else 0.0,
        }
        out.update({f"reward/{name}": nanmean(v) for name, v in self.components.items()})
        out["reward/errors"] = float(self.missing.sum())
        if self.log_only:  # apart from reward/errors: these responses train as usual
            unscored = [int(self.components[name].isnan().sum()) for name in self.log_only]
            out["reward/log_only_errors"] = float(sum(unscored))
        return out


class Unscorable(ConfigError):
    """No response of a batch could be scored, so there is nothing to learn from or measure.
    `count` is the batch's size, `why` the first failure (or that every score was None)."""

    def __init__(self, count: int, why: str, what: str = "response of this batch"):
        self.count, self.why = count, why
        super().__init__(
            f"No {what} could be scored ({count} responses; {why}). Fix the reward "
            "(reward.components, reward.function) and run again."
        )


def unscored_reason(errors: list[str]) -> str:
    """Why a batch has no score: its first failure, else every score was None."""
    return f"first error: {errors[0]}" if errors else "the reward returned None for all"


def in_float32_range(total: Tensor, errors: list[str]) -> Tensor:
    """`total` with NaN, and a line in `errors`, where the weighted sum left float32's range
    (components in range, weighted up): an inf reward would make the step's advantages NaN."""
    over = total.isinf()
    errors.extend(
        f"total: the weighted sum of the components is {v:g} in float32 (|reward| <= 3.4e38): "
        "scale the rewards or reward.weights down"
        for v in total[over].tolist()
    )
    return total.masked_fill(over, math.nan)


def nanmean(values: Tensor) -> float:
    valid = values[~values.isnan()]
    return valid.mean().item() if valid.numel() else float("nan")


class RewardTimeout(BaseException):
    """Raised inside a rule (RULES) that outlives its time limit.

    A BaseException, so that an `except Exception:` in the rule cannot swallow it.
    """


@contextmanager
def time_limit(seconds: float):
    """Interrupt the body after `seconds` with RewardTimeout (main thread only, via SIGALRM).

    Pure-Python work (sympy, a user's loop) is interrupted; off the main thread, where
    signals cannot be received, the body runs without a limit.
    """
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise RewardTimeout(f"took longer than reward.timeout_s={seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _failure(name: str, err: BaseException) -> str:
    return f"{name}: {describe(err)}"


class Scorer:
    """Builds the configured components once (loading any reward model), then scores batches."""

    def __init__(self, cfg: RewardConfig, max_new_tokens: int, device: torch.device, dtype: str):
        from rlcli.rewards.reward_models import OutcomeRewardModel, ProcessRewardModel

        self.cfg, self.max_new_tokens = cfg, max_new_tokens
        # TRL's trainer_state for the functions that read it: the optimiser steps done, of how
        # many (`at_step`; commands that only sample stay at step 0 of 0)
        self.trainer_state = {"global_step": 0, "max_steps": 0}
        self.names = component_names(cfg)  # python: each function of reward.function
        names = set(cfg.components)
        specs = function_specs(cfg) if "python" in names else []
        # One worker per function, started (and its signature checked) before any model loads.
        self.workers: dict[str, FunctionWorker] = {}
        try:
            for spec in specs:
                self.workers[function_name(spec)] = start_worker(spec)
        except ConfigError:
            self.close()
            raise
        model_args = (cfg.model_path, device, dtype, cfg.batch_size, cfg.max_length)
        self.orm = OutcomeRewardModel(*model_args) if "reward_model" in names else None
        self.prm = (
            ProcessRewardModel(*model_args, cfg.step_separator, cfg.step_tag)
            if "process" in names
            else None
        )

    def at_step(self, global_step: int, max_steps: int) -> None:
        """Training has done `global_step` of `max_steps` optimiser steps (trainer_state)."""
        self.trainer_state = {"global_step": global_step, "max_steps": max_steps}

    def __call__(self, samples: list[Sample]) -> Scores:
        """`score`, then Unscorable when no response of the batch has a score."""
        scores = self.score(samples)
        if scores.missing.all():
            raise Unscorable(len(samples), unscored_reason(scores.errors))
        return scores

    def score(self, samples: list[Sample]) -> Scores:
        """Each component over `samples` and their weighted total, plus DAPO's soft overlong
        punishment when `reward.overlong_cache_len` is set; a batch with no score is returned
        as it is. A trained component that raises, runs past `reward.timeout_s` (0: no limit)
        or returns what is no float32 number on one sample marks that sample as missing (NaN):
        the trainer gives it no gradient and counts it in `reward/errors`, and the run goes on.
        Every component is logged on its own (`reward/<name>`); a weight of 0 logs one without
        training on it, so its failures are counted apart (`reward/log_only_errors`) and never
        touch the total."""
        weights = self.cfg.weights or [1.0] * len(self.names)
        components, errors, log_only_errors, steps = {}, [], [], None
        total = torch.zeros(len(samples))
        for name, weight in zip(self.names, weights, strict=True):
            # A log-only component's failures are not missing samples: they go apart.
            values, found = self._component(name, samples, errors if weight else log_only_errors)
            components[name], steps = values, steps if found is None else found
            if weight:  # not 0 x NaN: a log-only component's failure must not touch training
                total = total + weight * values.float()
        if self.cfg.overlong_cache_len:
            lengths = torch.tensor([s.length for s in samples])
            penalty = overlong_penalty(lengths, self.max_new_tokens, self.cfg.overlong_cache_len)
            components["overlong"] = penalty
            total = total + penalty
        total = in_float32_range(total, errors)
        if errors:
            log.warning(
                "rlcli: %d reward failure(s) this step, scored as missing; first: %s",
                len(errors),
                errors[0],
            )
        if log_only_errors:
            log.warning(
                "rlcli: %d failure(s) of log-only reward components (weight 0) this step, "
                "training unaffected (reward/log_only_errors); first: %s",
                len(log_only_errors),
                log_only_errors[0],
            )
        log_only = tuple(n for n, w in zip(self.names, weights, strict=True) if not w)
        return Scores(total.float(), components, errors, steps, log_only)

    def _component(
        self, name: str, samples: list[Sample], errors: list[str]
    ) -> tuple[Tensor, list | None]:
        """One component's scores [B] (NaN where it failed, the failure in `errors`), and the
        process reward's steps (None for the others)."""
        if name in self.workers:  # before RULES: a function may share a rule's name
            return self._python(name, samples, errors), None
        if name in RULES:
            return self._rule(name, samples, errors), None
        questions, responses = [s.question for s in samples], [s.response for s in samples]
        if name == "reward_model":
            return torch.tensor(self.orm.score(questions, responses)), None
        # process: the outcome logged is the mean of the step scores (0 if none)
        steps = self.prm.score_steps(questions, responses)
        means = [sum(v for _, v in s) / len(s) if s else 0.0 for s in steps]
        return torch.tensor(means), steps

    def _rule(self, name: str, samples: list[Sample], errors: list[str]) -> Tensor:
        rule, scores = RULES[name], []
        for sample in samples:
            try:
                with time_limit(self.cfg.timeout_s):
                    available = {**sample.record, "response": sample.response,
                                 "answer": sample.answer, "pattern": self.cfg.pattern}  # fmt: skip
                    scores.append(as_score(call_rule(rule, available)))
            except (Exception, RewardTimeout) as err:
                errors.append(_failure(name, err))
                scores.append(math.nan)
        return torch.tensor(scores)

    def _python(self, name: str, samples: list[Sample], errors: list[str]) -> Tensor:
        """The whole batch in one call to the function's worker, with reward.timeout_s per
        sample; failures go to `errors` under the function's name.

        The batch has timeout_s x B in all (timeout_s=0: no limit at all). The one call gets
        half of it (all of it for one sample); if it fails or runs past that (an exception,
        the worker's death, a hang), each sample is called alone to find which failed, with
        min(timeout_s, what is left), so a sample that hangs costs its timeout_s and the
        others are still scored; samples left when the time is spent are timeouts. A call
        that returns a score count other than B is not retried: every sample is unscored.
        Restarting a worker that died or was killed is part of the time spent."""
        worker, n = self.workers[name], len(samples)
        timeout = self.cfg.timeout_s or math.inf  # 0: no limit
        budget = timeout * n
        keywords = function_keywords(worker.plan, samples, self.trainer_state)
        first = worker.call(keywords, budget if n == 1 else budget / 2)
        if first.error is None:
            errors.extend(f"{name}: {why}" for why in first.invalid.values())
            return torch.tensor(first.scores)
        if first.miscounted:  # every sample unscored, saying why; retrying one by one hides it
            errors.extend([f"{name}: {first.error}"] * n)
            return torch.full((n,), math.nan)
        if n == 1:
            late = f"RewardTimeout: took longer than reward.timeout_s={timeout:g} s"
            errors.append(f"{name}: {late if first.timed_out else first.error}")
            return torch.full((1,), math.nan)
        spent, scores = first.seconds, []
        for sample in samples:
            left = budget - spent
            if left <= 0:
                errors.append(
                    f"{name}: RewardTimeout: not called, the batch's {budget:g} s are spent"
                )
                scores.append(math.nan)
                continue
            limit = min(timeout, left)
            one = worker.call(function_keywords(worker.plan, [sample], self.trainer_state), limit)
            spent += one.seconds
            why = one.error or one.invalid.get(0)
            if one.timed_out:
                late = f"reward.timeout_s={timeout:g} s"
                if limit < timeout:
                    late = f"the {limit:.2g} s left of the batch's {budget:g} s"
                why = f"RewardTimeout: took longer than {late}"
            if why:
                errors.append(f"{name}: {why}")
            scores.append(math.nan if one.error else one.scores[0])
        return torch.tensor(scores)

    def check_records(self, problems: list[Problem], data_name: str) -> None:
        """ConfigError when the records of `problems` lack a field a component reads: the
        countdown rule's numbers and target, or a parameter of a function of reward.function
        without a default that neither convention fills (checked on the first record, before
        the policy loads)."""
        record = problems[0].record if problems else {}
        if "countdown" in self.names and (
            missing := [k for k in ("numbers", "target") if k not in record]
        ):
            raise ConfigError(
                f"reward component 'countdown' needs records with fields numbers and target; "
                f"data={data_name} has no {missing[0]!r}. Use data=countdown."
            )
        for worker in self.workers.values():
            missing = [name for name in worker.plan.fields if name not in record]
            if missing:
                present = ", ".join(record) or "none"
                raise ConfigError(
                    f"reward.function={worker.spec!r} takes the parameter {missing[0]!r}, which "
                    f"is filled from the record field of that name, but the records of "
                    f"data={data_name} have no {missing[0]!r} (fields: {present}). Rename the "
                    "parameter after a field, give it a default, or read it from **kwargs."
                )

    def close(self) -> None:
        """Stop the reward workers, if any (garbage collection and exit stop them too)."""
        for worker in self.workers.values():
            worker.close()


def start_worker(spec: str) -> FunctionWorker:
    """The worker for reward.function, its function imported; ConfigError if it cannot be."""
    try:
        return FunctionWorker(spec)
    except BadSpec as err:
        raise ConfigError(str(err)) from None
    except WorkerLost as err:
        raise ConfigError(f"reward.function={spec!r}: {err} while importing it.") from None


def function_keywords(
    plan: CallPlan, samples: list[Sample], trainer_state: dict | None = None
) -> dict[str, list]:
    """The keywords of a function's call over `samples`, as its convention has them."""
    return call_keywords(
        plan,
        prompts=[s.question for s in samples],
        responses=[s.response for s in samples],
        answers=[s.answer for s in samples],
        records=[s.record for s in samples],
        token_ids=lambda: [[] if s.token_ids is None else s.token_ids.tolist() for s in samples],
        conversations=[s.conversation for s in samples],
        trainer_state=trainer_state,
    )
