"""What `reward.components` and `reward.function` name: the components a run scores and logs,
the user's functions among them, and the checks of the reward config.

`python` in reward.components stands for the functions of `reward.function` (one, or a list as
TRL's `reward_funcs`), in their order: each is a component of its own, named after the function
(`my_rewards.py:accuracy` is `accuracy`), weighted by its entry of `reward.weights` (TRL's
`reward_weights`) and logged as `reward/accuracy` like a rule.
"""

from __future__ import annotations

import re

from rlcli.config import ConfigError, RewardConfig
from rlcli.rewards.rules import RULES

# Components that score the whole batch: the user's functions and the two reward models.
BATCHED = ("python", "reward_model", "process")
COMPONENTS = sorted([*RULES, *BATCHED])
# Names a function cannot take: metrics of their own (reward/mean, reward/std, reward/errors,
# reward/log_only_errors, reward/overlong) and algo.filter_metric's other choices.
RESERVED = ("mean", "std", "errors", "log_only_errors", "overlong", "total", "correctness")


def function_specs(cfg: RewardConfig) -> list[str]:
    """reward.function as a list: [] (none), [spec], or the list given."""
    if cfg.function is None:
        return []
    return [cfg.function] if isinstance(cfg.function, str) else list(cfg.function)


def function_name(spec: str) -> str:
    """The component name of a function: `path/to/file.py:score` and `pkg.mod:score` are `score`."""
    return str(spec).rpartition(":")[2]


def component_names(cfg: RewardConfig) -> list[str]:
    """reward.components with `python` replaced by the names of reward.function's functions:
    what is scored, weighted by reward.weights, logged as reward/<name>, and what
    algo.filter_metric may name."""
    functions = [function_name(spec) for spec in function_specs(cfg)]
    return [n for c in cfg.components for n in (functions if c == "python" else [c])]


def _check_functions(r: RewardConfig) -> None:
    specs = r.function if isinstance(r.function, list) else [r.function]
    if r.function is not None and not all(isinstance(s, str) and ":" in s for s in specs):
        raise ConfigError(
            f"reward.function={r.function!r} is not of the form 'path/to/file.py:function' or "
            "'package.module:function', nor a list of them (reward.function=[a.py:f,b.py:g])."
        )
    used = "python" in r.components
    if used and not function_specs(r):
        raise ConfigError(
            "reward=python needs reward.function=<module:function or path/file.py:function> "
            "(or a list of them, reward.function=[a.py:f,b.py:g], weighted by reward.weights)."
        )
    if not used and function_specs(r):
        raise ConfigError(
            f"reward.function={r.function} is set, but reward.components={list(r.components)} "
            "does not include python, so it would never be called: add reward=python (or "
            f"reward.components=[{','.join([*r.components, 'python'])}])."
        )
    names = component_names(r)
    for spec in function_specs(r):
        name = function_name(spec)
        if name in RESERVED or names.count(name) > 1:
            why = (
                f"{name!r} is a name rlcli's own metrics use ({', '.join(RESERVED)})"
                if name in RESERVED
                else f"another component of {names} has the name {name!r}"
            )
            raise ConfigError(
                f"reward.function has {spec!r}, logged as reward/<function name>, but {why}. "
                "Give the function a name of its own (def another_name(...), or "
                "another_name = score in its file)."
            )


def check_reward_config(r: RewardConfig, max_new_tokens: int) -> None:
    """ConfigError for a reward config that cannot run: unknown or repeated components, weights
    that do not match them, a reward.function that is not used or is missing, a bad pattern or
    range. (Whether the algorithm takes process rewards is `rlcli.validate`'s check.)"""
    if not r.components or len(set(r.components)) < len(r.components):
        raise ConfigError(
            f"reward.components={list(r.components)} must name one or more different "
            f"components, e.g. reward.components=[math,format]. Components: "
            f"{', '.join(COMPONENTS)}."
        )
    for name in r.components:
        if name not in COMPONENTS:
            raise ConfigError(
                f"reward.components has {name!r}, which is not one of the valid components: "
                f"{', '.join(COMPONENTS)}."
            )
    _check_functions(r)
    names = component_names(r)
    if r.weights is not None and len(r.weights) != len(names):  # finite: validate's check
        python = (
            " (python: one per function of reward.function)" if "python" in r.components else ""
        )
        raise ConfigError(
            f"reward.weights={list(r.weights)} must hold one finite number per component of "
            f"{names}{python} (or be null: every weight 1)."
        )
    for name in ("reward_model", "process"):
        if name in r.components and not r.model_path:
            raise ConfigError(
                f"reward component {name!r} needs reward.model_path=<local dir or hub id> of "
                "the reward model."
            )
    if {"format", "dcpo"} & set(r.components):
        try:
            re.compile(r.pattern)
        except re.error as err:
            raise ConfigError(
                f"reward.pattern={r.pattern!r} is not a valid regular expression ({err})."
            ) from None
    if not 0 <= r.overlong_cache_len < max_new_tokens:
        raise ConfigError(
            f"reward.overlong_cache_len={r.overlong_cache_len} must be >= 0 and smaller than "
            f"sampler.max_new_tokens={max_new_tokens} (the punishment ramps over "
            "the last overlong_cache_len tokens before the limit)."
        )
    if r.timeout_s < 0 or r.batch_size < 1 or r.max_length < 1:
        raise ConfigError(
            f"reward.timeout_s={r.timeout_s} must be >= 0 (0 = no limit), reward.batch_size="
            f"{r.batch_size} and reward.max_length={r.max_length} >= 1."
        )
