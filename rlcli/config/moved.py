"""rlcli's own config keys that moved, and the message that says where to: a key given in its
old place gets its new one, not "not a config key"."""

# Old key -> new key. An advantage estimator's settings are its own.
MOVED = {
    "algo.gamma": "algo.advantage_settings.gamma",
    "algo.lam": "algo.advantage_settings.lam",
    "algo.whiten_advantages": "algo.advantage_settings.whiten",
}


def moved_message(key: str, value: str | None = None) -> str:
    """`key` is one of rlcli's earlier keys (`MOVED`): where it is now."""
    new = MOVED[key]
    message = (
        f"{key} is now {new}: an advantage estimator's settings are its own (gae's gamma, lam "
        "and whiten; reinforce_pp's gamma), listed by rlcli train --help algo."
    )
    given = (value or "").strip()
    return message + (f" Instead of {key}={given}, write {new}={given}." if given else "")
