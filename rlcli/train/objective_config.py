"""The loss and the advantage estimator a config names: a registered piece, or a researcher's
own function in a file (`algo.loss=my_losses.py:fn`, `algo.advantage=my_adv.py:fn`).

A file's function is read as a registered one is (`ops.pieces`): its parameters that are
inputs are inputs, its keyword-only parameters with defaults are its settings
(`algo.loss_settings`, `algo.advantage_settings`), and what it needs is an attribute
`fn.needs = ("response_advantage", ...)` (and a loss's mini-batch token selection
`fn.select = choose`, as `register_loss(select=...)` gives one) or the `needs=` of
`register_loss` / `register_advantage`, when the file registers it. Ctrl-C while it imports
stays Ctrl-C. It runs in the learner's process (it
computes on the policy's tensors): it is the user's own code, as a reward function is.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from functools import partial
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlcli.config import CONF_DIR, AlgoConfig, ConfigError, SamplerConfig
from rlcli.env.tools import unboxed_warning
from rlcli.ops.advantages import ADVANTAGES, AdvantageInputs
from rlcli.ops.estimate import estimate
from rlcli.ops.losses import LOSS_INPUTS, LOSSES
from rlcli.ops.objective import Objective, loss_of
from rlcli.ops.pieces import Piece, PieceError, piece, settings_problem
from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS


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
        needs, select = getattr(fn, "needs", ()), getattr(fn, "select", None)
        return piece(spec, fn, inputs, needs, select=select)
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
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's module failed to import
        why = f"{type(err).__name__}: {err}"
        raise ConfigError(f"{key}={spec}: importing {target} failed ({why}).") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{key}={spec}: {target} has no function {attr!r}.")
    return fn


def own_pieces(cfg) -> tuple[str, ...]:
    """The user's own functions the objective runs, as "algo.loss=file.py:fn"."""
    if cfg.algo.objective != "clipped":
        return ()
    keys = {"algo.loss": cfg.algo.loss, "algo.advantage": cfg.algo.advantage}
    return tuple(f"{key}={name}" for key, name in keys.items() if is_file_spec(name))


def start_warnings(cfg) -> list[str]:
    """What a run should hear at its start about its pieces' settings."""
    t, algo = cfg.trainer, cfg.algo
    lines = []
    if "on_policy" in advantage_piece(algo.advantage).needs and t.mini_batches * t.epochs > 1:
        lines.append(
            f"rlcli: warning: algo.advantage={algo.advantage} is meant for exactly on-policy "
            f"updates (one mini-batch, one epoch), but trainer.mini_batches={t.mini_batches} and "
            f"trainer.epochs={t.epochs} make every update after the first learn from an older "
            "policy's samples; its baseline no longer is the optimal one."
        )
    if (unboxed := unboxed_warning(cfg.env)) is not None:
        lines.append(unboxed)
    return lines


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
    if algo.top_entropy > 0 and "response_advantage" in loss.needs:
        raise ConfigError(
            f"algo.top_entropy={algo.top_entropy} chooses the tokens that carry a per-token "
            f"loss, but algo.loss={algo.loss} gives one loss per response (its sequence ratio "
            "spans every token), so there is no token's loss to keep or drop. Use a per-token "
            "loss (ppo_clip, cispo, sapo, clip_cov, kl_cov, gpg) or algo.top_entropy=0."
        )
    check_clip_fields(algo, loss)
    if not {"ratio", "old_logp"} & loss.inputs and trainer.mini_batches * trainer.epochs > 1:
        raise ConfigError(
            f"algo.loss={algo.loss} reads no importance ratio (neither ratio nor old_logp), so "
            "it is right only on samples of the policy being updated; with trainer.mini_batches"
            f"={trainer.mini_batches} and trainer.epochs={trainer.epochs} every update after "
            "the first learns from an older policy's samples with no correction. Use "
            "trainer.mini_batches=1 trainer.epochs=1, or a loss with a ratio (ppo_clip)."
        )
    if own_pieces(cfg):
        try:
            try_user_pieces(cfg, loss, estimator)
        except PieceError as err:
            raise ConfigError(
                f"{err} (rlcli tried it on a small made-up batch before loading anything.)"
            ) from None


# The inputs through which a loss reads each clip setting of `algo`.
CLIP_READERS = {
    "ratio": {"ratio"},
    "clip": {"lo", "hi"},
    "eps_low": {"lo", "hi", "eps_low"},
    "eps_high": {"eps_high"},  # and lo, hi unless the clip is symmetric (1 +- eps_low)
    "dual_clip": {"dual_clip"},
}


def check_clip_fields(algo, loss: Piece) -> None:
    """A clip setting changed from its default (`conf/algo_base.yaml`) that the loss does not
    read is refused: a run that silently ignores it compares a config with itself."""
    base = OmegaConf.load(CONF_DIR / "algo_base.yaml")
    for field, readers in CLIP_READERS.items():
        if field == "eps_high" and algo.clip != "symmetric":
            readers = readers | {"lo", "hi"}
        value = getattr(algo, field)
        if readers & loss.inputs or value == base[field]:
            continue
        if field == "eps_high" and {"lo", "hi"} & loss.inputs:
            why = (
                "algo.clip=symmetric bounds the ratio by 1 +- eps_low on both sides; for a "
                "separate upper width use algo.clip=decoupled (DAPO's clip-higher)"
            )
        else:
            why = (
                f"algo.loss={algo.loss} reads only {', '.join(sorted(loss.inputs))}, so it "
                f"never uses algo.{field}; leave it at {base[field]}"
            )
        raise ConfigError(f"algo.{field}={value} would be ignored: {why}.")


def try_user_pieces(cfg, loss: Piece, estimator: Piece) -> None:
    """A researcher's own loss and estimator called once on a made-up batch (2 prompts x 2
    responses x 3 tokens, float32), so that one that raises or returns the wrong thing stops
    the run before a model loads; `PieceError` names it."""
    algo = cfg.algo
    gen = torch.Generator().manual_seed(0)
    rows, width, group = 4, 3, 2
    mask = torch.ones(rows, width)
    mask[1, 2] = 0.0  # a shorter response
    if is_file_spec(algo.advantage):
        x = AdvantageInputs(
            scores=torch.tensor([1.0, 0.0, 0.5, 0.0]),
            kl_penalty=torch.zeros(rows, width),
            mask=mask,
            group_size=group,
            prompt_ids=["a", "a", "b", "b"],
            values=torch.zeros(rows, width),
            step_rewards=torch.full((rows, width), torch.nan),
            lengths=mask.sum(-1),
            greedy_scores=torch.tensor([0.5, 0.5, 0.0, 0.0]),
        )
        estimate(estimator, dict(algo.advantage_settings), x)
    if is_file_spec(algo.loss):
        old = -torch.rand(rows, width, generator=gen) - 0.5
        logp = (old + 0.1 * torch.randn(rows, width, generator=gen)).requires_grad_()
        lo, hi = CLIP_BOUNDS[algo.clip](old, eps_low=algo.eps_low, eps_high=algo.eps_high)
        per_response = "response_advantage" in loss.needs
        advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(rows, width)
        loss_of(
            objective_from_config(algo, cfg.sampler, algo.norm_len or 1),
            logp=logp,
            old_logp=old,
            ref_logp=old.clone(),
            advantages=advantages,
            mask=mask,
            entropy=torch.rand(rows, width, generator=gen),
            ratio=RATIOS[algo.ratio](logp, old, mask),
            lo=lo,
            hi=hi,
            selected=torch.zeros(rows, width, dtype=torch.bool) if not per_response else None,
        )


def objective_from_config(algo: AlgoConfig, sampler: SamplerConfig, norm_len: int) -> Objective:
    """The policy loss `algo.*` chooses, over the distribution `sampler.*` samples from."""
    loss = loss_piece(algo.loss)
    return Objective(
        ratio=RATIOS[algo.ratio],
        bounds=partial(CLIP_BOUNDS[algo.clip], eps_low=algo.eps_low, eps_high=algo.eps_high),
        loss=loss,
        # KL in the reward (PPO) is applied to the rewards, not here.
        kl=KL_ESTIMATORS[algo.kl] if algo.beta > 0 and algo.kl_in == "loss" else None,
        aggregate=partial(AGGREGATIONS[algo.aggregation], norm_len=norm_len),
        beta=algo.beta,
        dual_clip=algo.dual_clip,
        entropy_coef=algo.entropy_coef,
        eps_low=algo.eps_low,
        eps_high=algo.eps_high,
        loss_settings=dict(algo.loss_settings),
        select=loss.select if "minibatch_stats" in loss.needs else None,
        top_entropy=algo.top_entropy,
        temperature=sampler.temperature,
        tis_cap=sampler.tis_cap if sampler.old_logp == "sampler" else None,
        is_correction=sampler.is_correction,
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
