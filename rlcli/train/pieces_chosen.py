"""The loss and the advantage estimator a config names: a registered piece, or a researcher's
own function in a file (`algo.loss=my_losses.py:fn`, `algo.advantage=my_adv.py:fn`).

A file's function is read as a registered one is (`ops.pieces`): its input parameters are
inputs, its keyword-only ones with defaults its settings (`algo.loss_settings`,
`algo.advantage_settings`), its needs `fn.needs = (...)` (a loss's mini-batch token selection
`fn.select`) or the `needs=` of `register_loss` / `register_advantage` when the file registers
it. It runs in the learner's process, on the policy's tensors: the user's own code, as a
reward function is.
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
from rlcli.ops.pieces import Piece, piece


def is_file_spec(name: str) -> bool:
    return ":" in name


def loss_piece(name: str) -> Piece:
    """`algo.loss`'s piece; ConfigError naming the bad value and the valid choices."""
    return _named_piece(name, "algo.loss", LOSSES, "a loss")


def advantage_piece(name: str) -> Piece:
    """`algo.advantage`'s piece; ConfigError naming the bad value and the valid choices."""
    return _named_piece(name, "algo.advantage", ADVANTAGES, "an estimator")


def own_pieces(cfg) -> tuple[str, ...]:
    """The user's own functions the objective runs, as "algo.loss=file.py:fn"."""
    if cfg.algo.objective != "clipped":
        return ()
    keys = {"algo.loss": cfg.algo.loss, "algo.advantage": cfg.algo.advantage}
    return tuple(f"{key}={name}" for key, name in keys.items() if is_file_spec(name))


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
        # What a registration would declare, as attributes of the function (`fn.needs = ...`).
        needs, select = getattr(fn, "needs", ()), getattr(fn, "select", None)
        return piece(spec, fn, inputs, needs, select=select, state=getattr(fn, "state", None))
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
    # Not BaseException: Ctrl-C while the user's module imports stays Ctrl-C.
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's module failed to import
        why = f"{type(err).__name__}: {err}"
        raise ConfigError(f"{key}={spec}: importing {target} failed ({why}).") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{key}={spec}: {target} has no function {attr!r}.")
    return fn
