"""The learning-rate schedule (`trainer.lr_scheduler`): transformers' schedules over the run's
optimiser updates, and their checks before any model loads, at every update the run will make;
beside them the trainer section's other checks (`check_trainer`): the run's steps, batch shape
and updates, what it stops on, keeps and evaluates.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import warnings

import torch

from rlcli.config import ConfigError, TrainerConfig

# `trainer.lr_scheduler`: transformers' schedules that need only the warm-up and the total
# number of updates. Left out: reduce_lr_on_plateau and greedy (they follow a loss going down,
# which an RL loss does not), cosine_warmup_with_min_lr (cosine_with_min_lr with another start
# of the warm-up, which `lr_schedule` already moves), warmup_stable_decay (its phases are set
# in optimiser updates, not in steps).
LR_SCHEDULES = (
    "constant_with_warmup",
    "constant",
    "linear",
    "cosine",
    "cosine_with_min_lr",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
)
# Arguments of a schedule function that `lr_schedule` sets itself, not lr_scheduler_kwargs.
_SET_BY_RLCLI = {"optimizer", "num_warmup_steps", "num_training_steps", "last_epoch"}


def lr_schedule(optimizer: torch.optim.Optimizer, t: TrainerConfig):
    """`trainer.lr_scheduler` over the run's optimiser updates (trainer.mini_batches x
    trainer.epochs per step, trainer.max_steps steps), from `transformers.get_scheduler`.

    transformers' warm-up gives update 0 a rate of 0: a whole RL step sampled for nothing.
    So the schedule is built one update longer and stepped once before training: with W
    warm-up updates, update i runs at lr (i+1)/(W+1) up to the full rate (the warm-up rlcli
    always had), and what follows is transformers' schedule unchanged (linear's last update
    at lr/(T-W), as in TRL).
    """
    from transformers import get_scheduler

    per_step = t.mini_batches * t.epochs
    scheduler = get_scheduler(
        t.lr_scheduler,
        optimizer,
        num_warmup_steps=t.warmup_steps * per_step + 1,
        num_training_steps=t.max_steps * per_step + 1,
        scheduler_specific_kwargs=dict(t.lr_scheduler_kwargs),
    )
    with warnings.catch_warnings():  # torch warns of a scheduler step before the optimiser's
        warnings.simplefilter("ignore")
        scheduler.step()
    return scheduler


def lr_schedule_settings(name: str) -> list[str]:
    """The settings (`trainer.lr_scheduler_kwargs`) the schedule `name` takes."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, SchedulerType

    if name in ("constant", "constant_with_warmup"):  # get_scheduler passes them none
        return []
    function = TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)]
    return [p for p in inspect.signature(function).parameters if p not in _SET_BY_RLCLI]


def check_trainer(trainer: TrainerConfig) -> None:
    """A ConfigError for a run length, batch shape, rate or stop/keep setting that cannot work."""
    positive = {
        "trainer.max_steps": trainer.max_steps,
        "trainer.prompts_per_step": trainer.prompts_per_step,
        "trainer.group_size": trainer.group_size,
        "trainer.mini_batches": trainer.mini_batches,
        "trainer.epochs": trainer.epochs,
        "trainer.micro_batch_size": trainer.micro_batch_size,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}={value} is not allowed: it must be a whole number >= 1.")
    if trainer.lr <= 0:
        raise ConfigError(f"trainer.lr={trainer.lr} is not allowed: the learning rate must be > 0.")
    if trainer.max_tokens_per_micro_batch < 0:
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={trainer.max_tokens_per_micro_batch} must be "
            ">= 0 (0 = only trainer.micro_batch_size limits a micro-batch)."
        )
    batch = trainer.prompts_per_step * trainer.group_size
    if batch % trainer.mini_batches:
        raise ConfigError(
            f"trainer.mini_batches={trainer.mini_batches} does not divide the batch of "
            f"{batch} responses (prompts_per_step x group_size); choose a divisor of {batch}."
        )
    if trainer.max_bad_steps < 0 or (trainer.keep_last is not None and trainer.keep_last < 1):
        raise ConfigError(
            f"trainer.max_bad_steps={trainer.max_bad_steps} must be >= 0 (0 = never stop) and "
            f"trainer.keep_last={trainer.keep_last} >= 1 or null (keep every checkpoint)."
        )
    if trainer.eval_every < 0:
        raise ConfigError(f"trainer.eval_every={trainer.eval_every} must be >= 0 (0 = never).")


def check_lr_schedule(t: TrainerConfig) -> None:
    """A ConfigError for a schedule rlcli does not run, settings it does not take, or a rate
    that is not a finite number >= 0 (or cannot be computed) at any update of the run: the
    schedule is built on a stand-in parameter and evaluated at each update, so that it fails
    here rather than after the models load, or after the last step."""
    name, kwargs = t.lr_scheduler, dict(t.lr_scheduler_kwargs)
    if name not in LR_SCHEDULES:
        raise ConfigError(
            f"trainer.lr_scheduler={name!r} is not one of the valid choices: "
            f"{', '.join(LR_SCHEDULES)}."
        )
    if t.warmup_steps < 0:
        raise ConfigError(
            f"trainer.warmup_steps={t.warmup_steps} is not allowed: it is the number of warm-up "
            "steps, a whole number >= 0 (0 = none)."
        )
    if name == "constant" and t.warmup_steps:
        raise ConfigError(
            f"trainer.lr_scheduler=constant has no warm-up, but trainer.warmup_steps="
            f"{t.warmup_steps}: use trainer.lr_scheduler=constant_with_warmup (the default), or "
            "trainer.warmup_steps=0."
        )
    settings = lr_schedule_settings(name)
    if unknown := sorted(set(kwargs) - set(settings)):
        raise ConfigError(
            f"trainer.lr_scheduler_kwargs sets {', '.join(unknown)}, which "
            f"trainer.lr_scheduler={name} does not take; its settings: "
            f"{', '.join(settings) or 'none'}."
        )
    _check_floor(t, kwargs)
    factor = _check_every_update(t, settings)
    if t.warmup_steps >= t.max_steps and os.environ.get("RANK", "0") == "0":
        # A warning, not an error: a recipe's warm-up is longer than a quick try of it with a
        # small trainer.max_steps, and that try still trains at a sound (lower) rate.
        last = t.max_steps * t.mini_batches * t.epochs
        print(
            f"rlcli: warning: trainer.warmup_steps={t.warmup_steps} is not shorter than the run "
            f"(trainer.max_steps={t.max_steps}): the rate only ramps up, to "
            f"{t.lr * factor(last):.3g} at the last update, and never reaches trainer.lr="
            f"{t.lr}. Lower trainer.warmup_steps unless this is a quick try.",
            file=sys.stderr,
        )


def _check_floor(t: TrainerConfig, kwargs: dict) -> None:
    """cosine_with_min_lr's floor: transformers clamps a rate below 0 to 0, so a negative
    floor would silently train nothing over the run's last updates."""
    for key, top, what in (("min_lr_rate", 1, "a share of trainer.lr"), ("min_lr", t.lr, "a rate")):
        value = kwargs.get(key)
        if isinstance(value, int | float) and not 0 <= value <= top:
            raise ConfigError(
                f"trainer.lr_scheduler_kwargs.{key}={value} is not allowed: it is the floor the "
                f"cosine falls to, {what}, so it must be in [0, {top}]; below 0 the rate would "
                "be held at 0 and the run's last updates would train nothing."
            )


# What keeps each schedule's rate finite and >= 0 over the run (the error's valid choices).
_SOUND = {
    "polynomial": "lr_end in [0, trainer.lr), power >= 0 and trainer.warmup_steps below "
    "trainer.max_steps",
    "inverse_sqrt": "timescale > 0",
    "cosine_with_min_lr": "exactly one of min_lr_rate in [0, 1] and min_lr in [0, trainer.lr]",
}


def _check_every_update(t: TrainerConfig, settings: list[str]):
    """The schedule's lr factor function, after checking it at every optimiser update of the
    run and at the scheduler step after the last (`learn` steps it after each update): the
    rate must be computable, finite and >= 0. transformers checks its settings only where it
    builds the schedule; polynomial with a negative power divides by zero only at the run's
    end, and a negative lr_end climbs the loss instead of descending it."""
    per_step = t.mini_batches * t.epochs
    total = t.max_steps * per_step
    described = (
        f"trainer.lr_scheduler={t.lr_scheduler} with trainer.lr_scheduler_kwargs="
        f"{dict(t.lr_scheduler_kwargs)}, trainer.warmup_steps={t.warmup_steps} and "
        f"trainer.max_steps={t.max_steps}"
    )
    listed = ", ".join(settings) or "none"
    sound = _SOUND.get(t.lr_scheduler, f"settings of {t.lr_scheduler} ({listed}) in their range")
    stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=t.lr)
    try:
        factor = lr_schedule(stand_in, t).lr_lambdas[0]  # transformers checks its settings here
    except Exception as err:  # noqa: BLE001 - any failure of a user's settings is a ConfigError
        raise ConfigError(f"{described} cannot be built: {_why(err)}. Valid: {sound}.") from None
    for update in _updates(t.warmup_steps * per_step + 1, total + 1):
        try:
            rate = t.lr * float(factor(update))
        except Exception as err:  # noqa: BLE001 - 0 ** -1, a division by 0, a complex power
            raise ConfigError(
                f"{described} cannot be computed at {_when(update, total)}: {_why(err)}; the "
                f"run would stop there. Valid: {sound}."
            ) from None
        if not (math.isfinite(rate) and rate >= 0):
            raise ConfigError(
                f"{described} gives a learning rate of {rate:.3g} at {_when(update, total)}: a "
                "negative rate climbs the loss and a non-finite one ruins the weights. Valid: "
                f"{sound}."
            )
    return factor


def _why(err: Exception) -> str:
    return str(err) if isinstance(err, ValueError | TypeError) else f"{type(err).__name__}: {err}"


def _updates(warm: int, last: int) -> list[int]:
    """The scheduler positions to check, 1 to `last`: every one up to 100,000 (a tenth of a
    second), beyond that every k-th, plus those around the warm-up's end `warm` and the
    run's, where the schedules change formula."""
    stride = -(-last // 100_000)
    edges = {k for edge in (warm, last) for k in range(edge - 2, edge + 2) if 1 <= k <= last}
    return sorted({*range(1, last + 1, stride), *edges})


def _when(update: int, total: int) -> str:
    if update > total:
        return f"the scheduler's step after the run's last update (update {total})"
    return f"optimiser update {update} of the run's {total}"
