"""What a piece of the objective declares, read from its own definition: the inputs it takes,
its settings, and what it needs from the run.

A piece (a per-token loss, an advantage estimator) is a plain function called by keyword.
Its parameters that are in the caller's list of inputs are inputs; its keyword-only
parameters with a default are its settings (`algo.loss_settings`, `algo.advantage_settings`),
so the default lives once, in the signature, and validation reads the names and types from
there. `NEEDS` lists what a piece may need from the run; a piece may also bring a `check` of
its settings, and a loss its mini-batch token `select`ion (`Piece`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

# What a piece may need from the run (`needs=`):
# - critic: a value model (PPO's), trained beside the policy;
# - groups: G >= 2 responses per prompt (`trainer.group_size`);
# - response_advantage: one advantage per response (not per token);
# - greedy: a greedy response per prompt, sampled and scored in the same step;
# - reference: the reference model's log-probs;
# - minibatch_stats: the current policy's log-probs and entropies over the whole mini-batch
#   before its passes (a selection that must not depend on how it is split);
# - step_rewards: a reward per reasoning step (`reward=process`);
# - whole_batch: statistics over the whole batch (whitening, counts), which are not gathered
#   across torchrun ranks yet, so the piece runs in one process only;
# - on_policy: exactly on-policy updates (one mini-batch, one epoch); more are warned of.
NEEDS = (
    "critic", "groups", "response_advantage", "greedy", "reference", "minibatch_stats",
    "step_rewards", "whole_batch", "on_policy",
)  # fmt: skip


@dataclass(frozen=True)
class Piece:
    """A registered function and what its definition declares."""

    name: str
    fn: Callable
    inputs: frozenset[str]  # the caller's inputs it reads, by keyword
    settings: dict[str, object]  # its own settings, name -> default
    needs: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""  # its docstring's first line, for --help
    # settings -> why they are invalid, a sentence starting "key=value ...", or None; run
    # before anything loads
    check: Callable[[dict], str | None] | None = None
    # a loss's token selection over the mini-batch (Clip-Cov, KL-Cov: `ops.losses`)
    select: Callable | None = None
    # a factory of the state an estimator keeps across steps (DCPO's per-prompt statistics):
    # an object with `state_dict`/`load_state_dict`, which the run holds, hands the piece as
    # `x.state` each step, and checkpoints
    state: Callable[[], object] | None = None

    def __call__(self, *args, **kwargs):
        """The function itself, called as written."""
        return self.fn(*args, **kwargs)

    def run(self, settings: dict, **available):
        """Call it with the inputs it names (of `available`) and its settings over the
        defaults."""
        return self.fn(**{k: available[k] for k in self.inputs}, **{**self.settings, **settings})


def piece(
    name: str,
    fn: Callable,
    inputs: tuple[str, ...],
    needs=(),
    check=None,
    select=None,
    state=None,
) -> Piece:
    """A `Piece` from `fn`'s signature; ValueError if it takes something that is neither an
    input nor a setting with a default."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"{name}: unknown needs {sorted(unknown)}; valid: {', '.join(NEEDS)}")
    taken, settings = set(), {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in inputs:
            taken.add(param.name)
        elif param.kind is param.KEYWORD_ONLY and param.default is not param.empty:
            settings[param.name] = param.default
        else:
            raise ValueError(
                f"{name}: parameter {param.name!r} is neither an input ({', '.join(inputs)}) "
                "nor a keyword-only setting with a default (def f(..., *, name=default))"
            )
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    if state is not None and not callable(state):
        raise ValueError(f"{name}: state must make the piece's state (a class or function)")
    needs, taken = frozenset(needs), frozenset(taken)
    return Piece(name, fn, taken, settings, needs, doc, check, select, state)


def registrar(registry: dict[str, Piece], inputs: tuple[str, ...]):
    """A decorator `register(name, needs=..., check=..., select=..., state=...)` that adds a
    function to `registry`."""

    def register(name: str, *, needs=(), check=None, select=None, state=None):
        def add(fn: Callable) -> Callable:
            if name in registry:
                raise ValueError(f"a piece named {name!r} is registered already")
            registry[name] = piece(name, fn, inputs, needs, check, select, state)
            return fn

        return add

    return register


def settings_problem(p: Piece, given: dict, where: str) -> str | None:
    """Why `given` are not valid settings of `p` (a sentence naming the bad key or value and
    the valid ones), or None."""
    valid = ", ".join(f"{k}={v!r}" for k, v in p.settings.items()) or "none"
    for key, value in given.items():
        if key not in p.settings:
            return f"{where}.{key} is not a setting of {p.name}; its settings are: {valid}."
        default = p.settings[key]
        if default is None or value is None:
            continue
        if isinstance(default, bool) != isinstance(value, bool):
            return f"{where}.{key}={value!r} must be a {type(default).__name__}, like {default!r}."
        number = isinstance(default, (int, float)) and isinstance(value, (int, float))
        if not number and not isinstance(value, type(default)):
            return f"{where}.{key}={value!r} must be a {type(default).__name__}, like {default!r}."
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
            if not value.is_integer():
                return f"{where}.{key}={value!r} must be a whole number, like {default!r}."
    why = p.check({**p.settings, **given}) if p.check is not None else None
    return f"{where}.{why}" if why else None


class PieceError(Exception):
    """A piece (most often a researcher's own, from a file) raised or returned something the
    objective cannot use; `str(self)` names it and says what was expected. `updated` says
    whether an optimiser step of the current training step had already happened."""

    updated: bool = False


def _where(err: BaseException) -> str:
    """file:line of the innermost frame of `err`'s traceback: the line in the user's file."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""


def call_piece(p: Piece, key: str, settings: dict, **available):
    """`p.run(settings, **available)`, with anything it raises turned into a `PieceError`
    naming `key`={p.name} and where it raised."""
    try:
        return p.run(settings, **available)
    except Exception as err:  # noqa: BLE001 - the piece may be a user's code
        raise PieceError(
            f"{key}={p.name} raised {type(err).__name__}: {err}{_where(err)}. Fix the function "
            '(the Algorithms page\'s "Your own loss or estimator" says what it receives).'
        ) from err


def loss_output_problem(out, shape: tuple[int, ...], with_grad: bool) -> str | None:
    """Why `out` is not what a loss returns, `(loss of `shape`, {name: one-number tensor})`
    with the loss carrying a gradient when `with_grad`, as a phrase, or None."""
    import torch  # here, so that the registry's readers before Hydra need no torch

    if not (isinstance(out, tuple) and len(out) == 2):
        return f"a {type(out).__name__}, not a pair (loss, metrics)"
    loss, metrics = out
    if not isinstance(loss, torch.Tensor):
        return f"a loss of type {type(loss).__name__}, not a tensor"
    if tuple(loss.shape) != shape:
        return f"a loss of shape {list(loss.shape)} where {list(shape)} was expected"
    if with_grad and not loss.requires_grad:
        return "a loss with no gradient (built from detached tensors, .item() or .tolist()?)"
    if not isinstance(metrics, dict):
        return f"metrics of type {type(metrics).__name__}, not a dict"
    for name, value in metrics.items():
        if not (isinstance(value, torch.Tensor) and value.numel() == 1):
            return f"the metric {name!r} as a {type(value).__name__}, not a one-number tensor"
    return None


def advantage_output_problem(out, rows: int, width: int, per_response: bool) -> str | None:
    """Why `out` is not what an estimator returns, `(advantages [rows] or [rows, width],
    returns [rows, width] or None)`, as a phrase, or None."""
    import torch

    if not (isinstance(out, tuple) and len(out) == 2):
        return f"a {type(out).__name__}, not a pair (advantages, returns or None)"
    advantages, returns = out
    shapes = [(rows,)] if per_response else [(rows,), (rows, width)]
    if not isinstance(advantages, torch.Tensor):
        return f"advantages of type {type(advantages).__name__}, not a tensor"
    if tuple(advantages.shape) not in shapes:
        wanted = " or ".join(str(list(s)) for s in shapes)
        return f"advantages of shape {list(advantages.shape)} where {wanted} was expected"
    if not (returns is None or isinstance(returns, torch.Tensor)):
        return f"returns of type {type(returns).__name__}, not a tensor or None"
    return None
