"""The loss and the advantage estimator a config names: a registered piece, or a researcher's
own function in a file (`algo.loss=my_losses.py:fn`, `algo.advantage=my_adv.py:fn`).

A file's function is read as a registered one is (`ops.pieces`): its parameters that are
inputs are inputs, its keyword-only parameters with defaults are its settings
(`algo.loss_settings`, `algo.advantage_settings`), and what it needs is an attribute
`fn.needs = ("response_advantage", ...)` or the `needs=` of `register_loss` /
`register_advantage`, when the file registers it. It runs in the learner's process (it
computes on the policy's tensors): it is the user's own code, as a reward function is.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path

from rlcli.config import ConfigError
from rlcli.ops.advantages import ADVANTAGES
from rlcli.ops.losses import LOSS_INPUTS, LOSSES
from rlcli.ops.pieces import Piece, piece, settings_problem


def is_file_spec(name: str) -> bool:
    return ":" in name


def loss_piece(name: str) -> Piece:
    """`algo.loss`'s piece; ConfigError naming the bad value and the valid choices."""
    return _named_piece(name, "algo.loss", LOSSES, "a loss")


def advantage_piece(name: str) -> Piece:
    """`algo.advantage`'s piece; ConfigError naming the bad value and the valid choices."""
    return _named_piece(name, "algo.advantage", ADVANTAGES, "an estimator")


def _named_piece(name: str, key: str, registry: dict, noun: str) -> Piece:
    if name in registry:
        return registry[name]
    if is_file_spec(name):
        return _user_piece(name, key)
    choices = f"{', '.join(sorted(registry))}, or your own as 'path/to/file.py:function'"
    raise ConfigError(f"{key}={name} is not {noun}: {choices}.")


@functools.cache  # imported once per process, as a module is
def _user_piece(spec: str, key: str) -> Piece:
    registry, inputs = (LOSSES, LOSS_INPUTS) if key == "algo.loss" else (ADVANTAGES, ("x",))
    target, _, attr = spec.rpartition(":")
    fn = _load(spec, key, target, attr)
    registered = [p for p in registry.values() if p.fn is fn]
    if registered:  # the file registered it with its needs
        return registered[0]
    try:
        return piece(spec, fn, inputs, getattr(fn, "needs", ()))
    except ValueError as err:
        raise ConfigError(f"{key}={spec}: {err}.") from None


def _load(spec: str, key: str, target: str, attr: str):
    if not target or not attr.isidentifier():
        raise ConfigError(f"{key}={spec} is not of the form 'path/to/file.py:function'.")
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"{key}={spec}: no such file {path}.")
            module_spec = importlib.util.spec_from_file_location(f"rlcli_user_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ConfigError:
        raise
    except BaseException as err:  # noqa: BLE001 - the user's module failed to import
        why = f"{type(err).__name__}: {err}"
        raise ConfigError(f"{key}={spec}: importing {target} failed ({why}).") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{key}={spec}: {target} has no function {attr!r}.")
    return fn


def needs(cfg, what: str) -> bool:
    """Whether the config's advantage estimator declares `what` among its needs."""
    return what in advantage_piece(cfg.algo.advantage).needs


def choose_over_minibatch(cfg) -> bool:
    """Whether tokens are chosen over the whole mini-batch (not gathered across ranks yet)."""
    return cfg.algo.top_entropy > 0 or "minibatch_stats" in loss_piece(cfg.algo.loss).needs


def check_pieces(cfg) -> None:
    """The loss and the estimator exist, their settings are theirs, and the run gives them
    what they declare they need; ConfigError naming the bad value otherwise."""
    algo, trainer = cfg.algo, cfg.trainer
    if algo.objective != "clipped":  # DPO has a loss of its own
        return
    loss, estimator = loss_piece(algo.loss), advantage_piece(algo.advantage)
    for p, given, key in (
        (loss, algo.loss_settings, "algo.loss_settings"),
        (estimator, algo.advantage_settings, "algo.advantage_settings"),
    ):
        problem = settings_problem(p, dict(given), key)
        if problem:
            raise ConfigError(problem)
    if "groups" in estimator.needs and trainer.group_size < 2:
        raise ConfigError(
            f"trainer.group_size={trainer.group_size} is too small for algo.advantage="
            f"{algo.advantage}: group-normalised advantages compare responses to the same "
            "prompt, so every response would get advantage 0. Use trainer.group_size=2 or more."
        )
    if "response_advantage" in loss.needs and "response_advantage" not in estimator.needs:
        fitting = sorted(k for k, p in ADVANTAGES.items() if "response_advantage" in p.needs)
        raise ConfigError(
            f"algo.loss={algo.loss} needs one advantage per response, but algo.advantage="
            f"{algo.advantage} gives one per token; use one of: {', '.join(fitting)}."
        )
    if not 0.0 <= algo.top_entropy <= 1.0:
        raise ConfigError(
            f"algo.top_entropy={algo.top_entropy} must lie in [0, 1]: the share of tokens, "
            "highest entropy first, that carry the policy loss (0 = all of them)."
        )


def describe_pieces() -> str:
    """The losses and estimators with their settings and needs, for `rlcli train --help`."""
    lines = []
    for title, registry in (("algo.loss", LOSSES), ("algo.advantage", ADVANTAGES)):
        lines.append(f"{title} (or your own: 'path/to/file.py:function'):")
        for name, p in sorted(registry.items()):
            extra = ", ".join(f"{k}={v!r}" for k, v in p.settings.items())
            tail = (f"  [settings: {extra}]" if extra else "") + (
                f"  [needs: {', '.join(sorted(p.needs))}]" if p.needs else ""
            )
            lines.append(f"  {name:22} {p.doc}{tail}")
    return "\n".join(lines)
