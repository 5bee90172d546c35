"""rlcli's own config keys that moved, and the message that says where to: a key given in its
old place gets its new one, not "not a config key"."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Moved:
    new: str  # the key that replaced it
    why: str  # one sentence
    # Old value -> new value, where they differ
    values: dict[str, str] = field(default_factory=dict)


_ESTIMATOR = (
    "an advantage estimator's settings are its own (gae's gamma, lam and whiten; "
    "reinforce_pp's gamma), listed by rlcli train --help algo"
)
MOVED = {
    "algo.gamma": Moved("algo.advantage_settings.gamma", _ESTIMATOR),
    "algo.lam": Moved("algo.advantage_settings.lam", _ESTIMATOR),
    "algo.whiten_advantages": Moved("algo.advantage_settings.whiten", _ESTIMATOR),
    "sampler.async_rollout": Moved(
        "sampler.max_staleness",
        "the workers stream rollouts up to that many weight updates ahead of the learner "
        "(0: each batch sampled after the previous update; 1: what async_rollout=true did)",
        {"true": "1", "false": "0"},
    ),
}


def moved_message(key: str, value: str | None = None) -> str:
    """`key` is one of rlcli's earlier keys (`MOVED`): where it is now."""
    moved = MOVED[key]
    message = f"{key} is now {moved.new}: {moved.why}."
    given = (value or "").strip()
    if not given:
        return message
    new_value = moved.values.get(given.lower(), given)
    return message + f" Instead of {key}={given}, write {moved.new}={new_value}."
