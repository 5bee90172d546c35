"""Validating a composed config: types, unknown keys, allowed values, ranges, combinations.

Above every registry, whose keys are the valid choices (`ADVANTAGES`, `RATIOS`, `LOSSES`,
`DATASETS`, `COMPONENTS`, `TRAINERS`, ...), below the entry points that call it.
`validate` returns the typed config or raises `ConfigError` with a message meant for the user
(cli.py prints it without a traceback); `compose` is the config `rlcli train OVERRIDES` would
run, for Python; `section` is one group's typed values. Each section's own checks sit beside
the code that reads it (`check_trainer`, `check_sampler`, `check_data`, ...); here are the
choices, nan/inf, and what spans sections. The config comes back as the user wrote it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from rlcli.config.schema import CONF_DIR, Config, ConfigError


def _choices() -> dict[str, list[str]]:
    """Allowed values of the string fields that pick a piece, read from the registries."""
    from rlcli.data import DATASETS
    from rlcli.data.answers import ANSWER_FORMATS
    from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS
    from rlcli.rollout.backends import backend_names
    from rlcli.tracking.trackers import BACKENDS
    from rlcli.train.loop import TRAINERS

    return {
        "algo.kl_in": ["loss", "reward"],
        "algo.objective": sorted(TRAINERS),
        "algo.ratio": sorted(RATIOS),
        "algo.clip": sorted(CLIP_BOUNDS),
        "algo.kl": sorted(KL_ESTIMATORS),
        "algo.aggregation": sorted(AGGREGATIONS),
        "sampler.name": backend_names(),
        "sampler.old_logp": ["auto", "learner", "sampler"],
        "sampler.long_prompts": ["error", "drop"],
        "model.source": ["smollm2_gguf", "tiny", "hub"],
        "data.name": sorted(DATASETS),
        "data.answer_format": sorted(ANSWER_FORMATS),
        "logger.name": list(BACKENDS),
        "trainer.dtype": ["float32", "bfloat16", "float16"],
        "trainer.attention": ["auto", "eager", "sdpa", "flex_attention"],
        "model.gradient_checkpointing": ["auto", "true", "false", "selective"],
        "trainer.compile": ["auto", "true", "false"],
        "launcher.name": ["local", "ray"],
    }


def _check_reward(cfg: Config) -> None:
    from rlcli.rewards.components import check_reward_config
    from rlcli.train.objective_checks import needs

    r = cfg.reward
    check_reward_config(r, cfg.sampler.max_new_tokens)
    if cfg.data.answer_field is None:  # prompt-only data: no rule may compare with an answer
        from rlcli.rewards.rules import RULES, reads_answer

        if wanting := [n for n in r.components if n in RULES and reads_answer(RULES[n])]:
            raise ConfigError(
                f"data.answer_field=null gives the problems no answer, but the reward component "
                f"{wanting[0]!r} compares each response with one. Name the field that holds the "
                "answer in data.answer_field, or use a reward that needs none (format, "
                "space_rate, reward_model, or your own reward.function)."
            )
    process, stepwise = "process" in r.components, needs(cfg, "step_rewards")
    if process and len(r.components) > 1:
        raise ConfigError(
            "reward=process scores steps, not whole responses, so it cannot be mixed with "
            f"other components (reward.components={list(r.components)}); use it alone."
        )
    if process != stepwise:
        raise ConfigError(
            f"algo.advantage={cfg.algo.advantage} with reward.components={list(r.components)}: "
            "process rewards (reward=process) and the grpo_process advantage only work "
            "together; use both (reward=process algo.advantage=grpo_process) or neither."
        )


def _check_ranges(cfg: Config) -> None:
    """Each section's checks, in the room that reads it; here only what spans sections."""
    # Those rooms import torch: not for the checks before Hydra.
    from rlcli.config.checks import check_algo, check_eval, check_filter
    from rlcli.data import check_data
    from rlcli.data.pairs import check_pairs
    from rlcli.launch.placement import check_launcher
    from rlcli.rewards.components import component_names
    from rlcli.rollout.backends import check_sampler
    from rlcli.runtime.models import check_model
    from rlcli.tracking.trackers import check_backends
    from rlcli.train.objective_checks import check_pieces
    from rlcli.train.schedule import check_trainer

    trainer, sampler, model, algo = cfg.trainer, cfg.sampler, cfg.model, cfg.algo
    check_trainer(trainer)
    check_sampler(sampler, model)
    _check_world(cfg)
    check_model(model, trainer)  # model.init_kwargs.attn_implementation vs trainer.attention
    check_pieces(cfg)
    check_data(cfg.data)
    check_algo(algo)
    metrics = ["correctness", "total", *component_names(cfg.reward)]  # python: its functions
    if algo.filter_metric not in metrics:
        raise ConfigError(
            f"algo.filter_metric={algo.filter_metric!r} is not one of the valid choices: "
            f"{', '.join(metrics)} (correctness = the first of reward.components)."
        )
    if (algo.objective == "dpo") != (cfg.data.name == "pairs"):
        raise ConfigError(
            f"algo.objective={algo.objective} with data={cfg.data.name}: DPO trains on "
            "preference pairs and the RL algorithms on prompts, so algo=dpo goes with "
            "data=pairs and only with it (make pairs with `rlcli pairs`)."
        )
    check_pairs(cfg.pairs)
    check_eval(cfg.eval)
    check_backends(cfg.logger)
    check_filter(cfg.filter)
    check_launcher(cfg.launcher, under_torchrun=int(os.environ.get("WORLD_SIZE", "1")) > 1)
    _check_reward(cfg)


def _check_finite(value, key: str = "") -> None:
    """nan and inf (OmegaConf reads `=nan`, `=inf`) in any float of the config, sections and
    lists walked so that no field escapes; the range checks' comparisons let nan through."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _check_finite(getattr(value, f.name), f"{key}.{f.name}".lstrip("."))
        return
    numbers = value if isinstance(value, list) else [value]
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        what = "holds a value that is not" if numbers is value else "is not"
        raise ConfigError(
            f"{key}={value} {what} a finite number; nan and inf are never valid settings: give "
            "a finite number."
        )


def _check_world(cfg: Config) -> None:
    """Under torchrun (WORLD_SIZE > 1): what data-parallel training supports."""
    from rlcli.train.objective_checks import choose_over_minibatch, needs

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return
    if cfg.trainer.prompts_per_step % world:
        raise ConfigError(
            f"trainer.prompts_per_step={cfg.trainer.prompts_per_step} must be a multiple of the "
            f"{world} processes torchrun started: each samples an equal share of the prompts."
        )
    unsupported = {
        "algo=dpo (preference pairs)": cfg.algo.objective == "dpo",
        f"algo.advantage={cfg.algo.advantage} (a critic)": needs(cfg, "critic"),
        f"algo.advantage={cfg.algo.advantage} (statistics over the whole batch: whitening, "
        "counts of flat groups)": needs(cfg, "whole_batch"),
        "algo.ptx_coef > 0": cfg.algo.ptx_coef > 0,
        f"algo.loss={cfg.algo.loss} or algo.top_entropy > 0 (tokens chosen over the whole "
        "mini-batch)": choose_over_minibatch(cfg),
        "model.lora.rank > 0 (LoRA)": cfg.model.lora.rank > 0,
    }
    for what, used in unsupported.items():
        if used:
            raise ConfigError(
                f"{what} runs in one process only for now, but torchrun started {world}; run "
                "it without torchrun, or pick one of the group-based algorithms (grpo, "
                "dr_grpo, dapo, dupo, gspo, dcpo, rloo, opo)."
            )


def validate(raw: DictConfig) -> Config:
    """Check types, unknown keys and allowed values; return the typed config object."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
        # Interpolations (${...}) resolve here: one that names no key fails here too.
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        # OmegaConf's own message names the key and the expected type; keep only its first line.
        first = str(err).strip().splitlines()[0]
        key = getattr(err, "full_key", None)
        hint = ""
        if isinstance(err, InterpolationResolutionError):
            hint = " (${...} refers to another key of the config by its path, e.g. ${trainer.lr})"
        raise ConfigError(
            f"Invalid config value{f' at {key}' if key else ''}: {first}{hint}"
        ) from None
    # A YAML or command-line true/false reaches the string fields as "True"/"False".
    cfg.model.gradient_checkpointing = cfg.model.gradient_checkpointing.lower()
    cfg.trainer.compile = cfg.trainer.compile.lower()
    for key, allowed in _choices().items():
        group, name = key.split(".")
        value = getattr(getattr(cfg, group), name)
        if value not in allowed:
            valid = ", ".join(allowed)
            raise ConfigError(f"{key}={value!r} is not one of the valid choices: {valid}.")
    _check_finite(cfg)
    _check_ranges(cfg)
    from rlcli.env.tools import check_env
    from rlcli.rollout.workers.processes import check_worker_settings
    from rlcli.runtime.models import check_device
    from rlcli.train.schedule import check_lr_schedule

    check_device(cfg.trainer)  # trainer.device, and trainer.attention on it
    if cfg.env.name != "none" and cfg.algo.objective == "dpo":
        raise ConfigError(
            f"algo=dpo trains on preference pairs and samples nothing, so env={cfg.env.name} "
            "would be ignored: drop env= (or set env=none)."
        )
    check_env(cfg.env)
    check_worker_settings(cfg.sampler)  # sampler.urls, worker_timeout_s, serve_port
    check_lr_schedule(cfg.trainer)  # trainer.lr_scheduler and its settings
    # cfg goes back as the user wrote it: `sampler.old_logp=auto` is resolved where it is read
    # (`rollout.backends.resolved_old_logp`), so config.yaml shows `auto`.
    return cfg


def with_default_sampler(overrides: Sequence[str]) -> list[str]:
    """`overrides`, plus the first sampler backend that needs nothing installed when none is
    chosen and the default one's package is absent (vLLM's, on a machine without it)."""
    from omegaconf import OmegaConf

    from rlcli.rollout.backends import backend, backend_names

    overrides = list(overrides)
    if any(o.lstrip("+~").split("=")[0] == "sampler" for o in overrides):
        return overrides
    missing = {n for n in backend_names() if not backend(n).installed()}
    if not missing:  # the usual case: conf/config.yaml need not be read
        return overrides
    defaults = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    if next(d["sampler"] for d in defaults if "sampler" in d) in missing:
        overrides.append(f"sampler={next(n for n in backend_names() if not backend(n).package)}")
    return overrides


def section(group: str, choice: str, **values):
    """The typed section `group=choice` selects (its YAML over `conf/<group>_base.yaml`), with
    `values` replaced, unvalidated: one section without a whole config (tests, scripts)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        raw = hydra_compose("config", overrides=[f"{group}={choice}"])[group]
    typed = OmegaConf.structured(type(getattr(Config(), group)))
    return dataclasses.replace(OmegaConf.to_object(OmegaConf.merge(typed, raw)), **values)


def compose(overrides: Sequence[str] = ()) -> Config:
    """The validated config `rlcli train OVERRIDES...` would run, for use from Python."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return validate(hydra_compose("config", overrides=with_default_sampler(overrides)))
