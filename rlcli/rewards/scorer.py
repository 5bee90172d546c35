"""Scoring a batch of responses: the configured reward components, weighted and isolated.

`reward.components` names the components and `reward.weights` their weights (default 1);
a response's reward is the weighted sum, plus DAPO's soft overlong punishment when
`reward.overlong_cache_len` is set. Every component is logged on its own (`reward/<name>`);
a weight of 0 logs a component without training on it. A component that raises or runs past
`reward.timeout_s` on one sample marks that sample as missing (NaN): the trainer gives it no
gradient and counts it in `reward/errors`, and the run goes on. The rules themselves are in
`rlcli.rewards`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rlcli.config import Config, ConfigError, RewardConfig
from rlcli.data.countdown import countdown_score
from rlcli.data.problems import Problem
from rlcli.ops.policy_loss import overlong_penalty
from rlcli.rewards.rules import accuracy, dcpo_score, format_match, signed_accuracy, space_rate

log = logging.getLogger("rlcli")


@dataclass(frozen=True)
class Sample:
    """One response to score, with what its problem knows."""

    question: str  # the prompt text, before chat rendering
    response: str
    answer: str  # ground truth
    record: dict  # the dataset record's fields (countdown's numbers and target, ...)
    length: int  # response tokens


# Per-sample rules: (sample, reward config) -> float.
RULES: dict[str, Callable[[Sample, RewardConfig], float]] = {
    "math": lambda s, cfg: accuracy(s.response, s.answer),
    "math_pm1": lambda s, cfg: signed_accuracy(s.response, s.answer),
    "format": lambda s, cfg: format_match(s.response, cfg.pattern),
    "dcpo": lambda s, cfg: dcpo_score(s.response, s.answer, cfg.pattern),
    "countdown": lambda s, cfg: countdown_score(
        s.response, s.record["numbers"], s.record["target"]
    ),
    "space_rate": lambda s, cfg: space_rate(s.response),
}
# Components that score the whole batch: the user's function and the two reward models.
BATCHED = ("python", "reward_model", "process")
COMPONENTS = sorted([*RULES, *BATCHED])


@dataclass
class Scores:
    """A batch's rewards. B responses; NaN marks a missing score."""

    total: Tensor  # [B] weighted sum of the components, plus the overlong punishment
    components: dict[str, Tensor]  # [B] each component's own (unweighted) score
    errors: list[str]  # why samples went missing, one line per failure
    # process reward only: per response, (character where a step ends, that step's score)
    steps: list[list[tuple[int, float]]] | None = None

    @property
    def missing(self) -> Tensor:  # [B] bool
        return self.total.isnan()

    def metrics(self) -> dict[str, float]:
        out = {f"reward/{name}": nanmean(v) for name, v in self.components.items()}
        out["reward/errors"] = float(self.missing.sum())
        return out


def nanmean(values: Tensor) -> float:
    valid = values[~values.isnan()]
    return valid.mean().item() if valid.numel() else float("nan")


class RewardTimeout(BaseException):
    """Raised inside a reward call that outlives its time limit.

    A BaseException, so that a user's `except Exception:` cannot swallow it.
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


def _as_score(value) -> float:
    """A finite float, or NaN for None (the function's way of saying 'no score')."""
    if value is None:
        return math.nan
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"returned {value!r}, not a finite number")
    return score


def describe(err: BaseException) -> str:
    """'Type: first line of the message', for one-line reports."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _failure(name: str, err: BaseException) -> str:
    return f"{name}: {describe(err)}"


def load_function(spec: str) -> Callable:
    """The user's reward function from 'package.module:function' or 'path/file.py:function'."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"reward.function={spec!r} is not of the form 'package.module:function' or "
            "'path/to/file.py:function'."
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise ConfigError(f"reward.function={spec!r}: no such file {path}.")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            # The console script's sys.path lacks the directory rlcli was started from.
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as err:  # the user's module failed to import: show why, briefly
        raise ConfigError(
            f"reward.function={spec!r}: importing {module_name} failed ({describe(err)})."
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward.function={spec!r}: {module_name} has no function {attr!r}.")
    return fn


class Scorer:
    """Builds the configured components once (loading any reward model), then scores batches."""

    def __init__(self, cfg: RewardConfig, max_new_tokens: int, device: torch.device, dtype: str):
        from rlcli.rewards.models import OutcomeRewardModel, ProcessRewardModel

        self.cfg, self.max_new_tokens = cfg, max_new_tokens
        names = set(cfg.components)
        self.function = load_function(cfg.function) if "python" in names else None
        model_args = (cfg.model_path, device, dtype, cfg.batch_size, cfg.max_length)
        self.orm = OutcomeRewardModel(*model_args) if "reward_model" in names else None
        self.prm = (
            ProcessRewardModel(*model_args, cfg.step_separator, cfg.step_tag)
            if "process" in names
            else None
        )

    def __call__(self, samples: list[Sample]) -> Scores:
        components, errors, steps = {}, [], None
        weights = self.cfg.weights or [1.0] * len(self.cfg.components)
        for name in self.cfg.components:
            if name in RULES:
                components[name] = self._rule(name, samples, errors)
            elif name == "python":
                components[name] = self._python(samples, errors)
            elif name == "reward_model":
                questions, responses = [s.question for s in samples], [s.response for s in samples]
                components[name] = torch.tensor(self.orm.score(questions, responses))
            else:  # process: the outcome logged is the mean of the step scores (0 if none)
                questions, responses = [s.question for s in samples], [s.response for s in samples]
                steps = self.prm.score_steps(questions, responses)
                means = [sum(v for _, v in s) / len(s) if s else 0.0 for s in steps]
                components[name] = torch.tensor(means)
        total = sum(
            w * components[n].float() for n, w in zip(self.cfg.components, weights, strict=True)
        )
        if self.cfg.overlong_cache_len:
            lengths = torch.tensor([s.length for s in samples])
            penalty = overlong_penalty(lengths, self.max_new_tokens, self.cfg.overlong_cache_len)
            components["overlong"] = penalty
            total = total + penalty
        if total.isnan().all():
            why = f"first error: {errors[0]}" if errors else "the reward returned None for all"
            raise ConfigError(
                f"No response of this batch could be scored ({len(samples)} responses; {why}). "
                "Fix the reward (reward.components, reward.function) and run again."
            )
        if errors:
            log.warning(
                "rlcli: %d reward failure(s) this step, scored as missing; first: %s",
                len(errors),
                errors[0],
            )
        return Scores(total.float(), components, errors, steps)

    def _rule(self, name: str, samples: list[Sample], errors: list[str]) -> Tensor:
        rule, scores = RULES[name], []
        for sample in samples:
            try:
                with time_limit(self.cfg.timeout_s):
                    scores.append(_as_score(rule(sample, self.cfg)))
            except (Exception, RewardTimeout) as err:
                errors.append(_failure(name, err))
                scores.append(math.nan)
        return torch.tensor(scores)

    def _call_function(self, samples: list[Sample]) -> list[float]:
        """fn(prompts, responses, answers, **record fields) -> one score (or None) per sample."""
        records = [s.record for s in samples]
        reserved = {"prompts", "responses", "answers"}
        keys = [k for k in dict.fromkeys(k for r in records for k in r) if k not in reserved]
        out = self.function(
            prompts=[s.question for s in samples],
            responses=[s.response for s in samples],
            answers=[s.answer for s in samples],
            **{k: [r.get(k) for r in records] for k in keys},
        )
        out = list(out)
        if len(out) != len(samples):
            raise ValueError(f"returned {len(out)} scores for {len(samples)} responses")
        return [_as_score(v) for v in out]

    def _python(self, samples: list[Sample], errors: list[str]) -> Tensor:
        """The whole batch in one call; if that fails, one call per sample to isolate it."""
        try:
            with time_limit(self.cfg.timeout_s * len(samples)):
                return torch.tensor(self._call_function(samples))
        except (Exception, RewardTimeout):
            pass
        scores = []
        for sample in samples:
            try:
                with time_limit(self.cfg.timeout_s):
                    scores.append(self._call_function([sample])[0])
            except (Exception, RewardTimeout) as err:
                errors.append(_failure("python", err))
                scores.append(math.nan)
        return torch.tensor(scores)


def check_reward_fields(cfg: Config, problems: list[Problem]) -> None:
    """The countdown reward reads `numbers` and `target` from each record: check they exist."""
    if "countdown" in cfg.reward.components:
        missing = [k for k in ("numbers", "target") if k not in problems[0].record]
        if missing:
            raise ConfigError(
                f"reward component 'countdown' needs records with fields numbers and target; "
                f"data={cfg.data.name} has no {missing[0]!r}. Use data=countdown."
            )
