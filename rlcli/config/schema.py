"""The config schema: one typed dataclass per group, and `ConfigError`.

Fields are documented once, by the comment above each of them in `conf/**/*.yaml`, which also
holds every default (`conf/<group>_base.yaml` has all of a group's fields): here every field is
MISSING, so a value the YAML does not give is an error, not a second default. This module
fixes the types. It imports nothing of rlcli, so every room may read the config (validation
is `rlcli.validate`, above the registries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

# The Hydra config tree (`conf/` at the top of the repository).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


# Attention head sizes that vLLM's CPU attention kernels support (a subset of CUDA's).
VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class ConfigError(ValueError):
    """A config value a user must change; the message names the value and the valid choices."""


@dataclass
class AlgoConfig:
    name: str = MISSING
    advantage: str = MISSING
    ratio: str = MISSING
    clip: str = MISSING
    loss: str = MISSING
    loss_settings: dict[str, Any] = MISSING
    advantage_settings: dict[str, Any] = MISSING
    top_entropy: float = MISSING
    eps_low: float = MISSING
    eps_high: float = MISSING
    dual_clip: float | None = MISSING
    kl: str = MISSING
    beta: float = MISSING
    kl_in: str = MISSING
    kl_target: float | None = MISSING
    kl_horizon: int = MISSING
    entropy_coef: float = MISSING
    aggregation: str = MISSING
    norm_len: int | None = MISSING
    # batch shaping (DAPO, DUPO)
    dynamic_sampling: bool = MISSING
    max_gen_batches: int = MISSING
    overlong_filter: bool = MISSING
    dupo_fill: bool = MISSING
    filter_metric: str = MISSING
    # PPO critic and pretraining mix
    vf_coef: float = MISSING
    value_clip: float = MISSING
    critic_path: str | None = MISSING
    critic_lr: float | None = MISSING
    ptx_coef: float = MISSING
    ptx_path: str | None = MISSING
    # the training loop: clipped (RL on sampled responses) or dpo (preference pairs)
    objective: str = MISSING
    max_length: int = MISSING


@dataclass
class RewardConfig:
    name: str = MISSING
    components: list[str] = MISSING
    weights: list[float] | None = MISSING
    pattern: str = MISSING
    overlong_cache_len: int = MISSING
    timeout_s: float = MISSING
    # python: 'file.py:fn', a list of them, or null (Any: OmegaConf has no str-or-list type)
    function: Any = MISSING
    # reward_model, process
    model_path: str | None = MISSING
    batch_size: int = MISSING
    max_length: int = MISSING
    step_separator: str = MISSING
    step_tag: str = MISSING


@dataclass
class SamplerConfig:
    name: str = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    top_k: int = MISSING  # 0 (or -1) = off
    min_p: float = MISSING
    repetition_penalty: float = MISSING
    max_new_tokens: int = MISSING
    max_prompt_tokens: int = MISSING
    long_prompts: str = MISSING
    stop: list[str] = MISSING
    old_logp: str = MISSING
    tis_cap: float = MISSING
    is_correction: str = MISSING  # truncate or mask
    # vLLM engine
    max_model_len: int = MISSING
    gpu_memory_utilization: float = MISSING
    tensor_parallel_size: int = MISSING
    cpu_kv_cache_gb: float = MISSING
    enforce_eager: bool | None = MISSING
    # rollout workers (vLLM servers in processes of their own)
    workers: int = MISSING
    urls: list[str] = MISSING
    max_staleness: int = MISSING
    transfer_address: str = MISSING
    worker_timeout_s: float = MISSING
    serve_port: int = MISSING


@dataclass
class EnvConfig:
    name: str = MISSING
    tools: list[str] = MISSING
    tool_format: str = MISSING  # rlcli or chat_template
    max_turns: int = MISSING
    max_tokens: int = MISSING
    instructions: str = MISSING
    tool_timeout_s: float = MISSING
    tool_output_chars: int = MISSING
    python_memory_mb: int = MISSING
    python_disk_mb: int = MISSING
    sandbox: str = MISSING
    corpus: str | None = MISSING
    search_top_k: int = MISSING


@dataclass
class LoraConfig:
    rank: int = MISSING
    alpha: float = MISSING
    dropout: float = MISSING
    target_modules: list[str] = MISSING


@dataclass
class ModelConfig:
    name: str = MISSING
    source: str = MISSING
    path: str | None = MISSING
    gradient_checkpointing: str = MISSING  # auto, true, false or selective
    # from_pretrained's keyword arguments (TRL's model_init_kwargs), free-form
    init_kwargs: dict[str, Any] = MISSING
    lora: LoraConfig = field(default_factory=LoraConfig)
    tiny_layers: int = MISSING
    tiny_hidden: int = MISSING
    tiny_heads: int = MISSING


@dataclass
class DataConfig:
    name: str = MISSING
    # generated: arith, countdown
    difficulty: int = MISSING
    operators: str = MISSING
    num_operands: int = MISSING
    num_train: int = MISSING
    # records: jsonl, parquet, gsm8k, math, dapo_math_17k
    path: str | None = MISSING
    test_path: str | None = MISSING
    hub_id: str | None = MISSING
    hub_config: str | None = MISSING
    train_split: str = MISSING
    test_split: str | None = MISSING
    prompt_field: str = MISSING
    answer_field: str | None = MISSING
    chosen_field: str = MISSING
    rejected_field: str = MISSING
    answer_format: str = MISSING
    template: str | None = MISSING
    dedupe: bool = MISSING
    limit: int | None = MISSING
    # all
    num_test: int = MISSING
    instruction: str = MISSING
    system_prompt: str | None = MISSING
    seed: int = MISSING


@dataclass
class PairsConfig:
    k: int = MISSING
    min_margin: float = MISSING
    prompts_per_batch: int = MISSING
    out: str | None = MISSING


@dataclass
class FilterConfig:
    k: int = MISSING
    correct_above: float = MISSING
    drop_never_correct: bool = MISSING
    prompts_per_batch: int = MISSING
    out: str | None = MISSING


@dataclass
class TrainerConfig:
    max_steps: int = MISSING
    seed: int = MISSING
    prompts_per_step: int = MISSING
    group_size: int = MISSING
    mini_batches: int = MISSING
    epochs: int = MISSING
    micro_batch_size: int = MISSING
    max_tokens_per_micro_batch: int = MISSING
    share_prompts: bool = MISSING
    attention: str = MISSING
    bf16_autocast: bool = MISSING
    bf16_weights: bool = MISSING
    compile: str = MISSING  # auto, true or false
    lr: float = MISSING
    weight_decay: float = MISSING
    warmup_steps: int = MISSING
    lr_scheduler: str = MISSING
    lr_scheduler_kwargs: dict[str, Any] = MISSING
    max_grad_norm: float = MISSING
    device: str = MISSING
    dtype: str = MISSING
    save_every: int = MISSING
    keep_last: int | None = MISSING
    resume: str | None = MISSING
    push_to_hub: str | None = MISSING
    max_bad_steps: int = MISSING
    eval_every: int = MISSING
    val_before_train: bool = MISSING


@dataclass
class LoggerConfig:
    name: str = MISSING
    progress: bool = MISSING
    backends: list[str] = MISSING
    samples_every: int = MISSING
    print_samples_every: int = MISSING
    project: str = MISSING
    entity: str | None = MISSING
    run_name: str | None = MISSING
    table_every: int = MISSING


@dataclass
class LauncherConfig:
    name: str = MISSING
    address: str | None = MISSING
    learner_ranks: int = MISSING
    cpus_per_rank: float = MISSING
    cpus_per_worker: float = MISSING
    stop_grace_s: float = MISSING


@dataclass
class EvalConfig:
    k: int = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    max_problems: int | None = MISSING
    prompts_per_batch: int = MISSING
    correct_above: float = MISSING


@dataclass
class Config:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


def config_dict(cfg: Config) -> dict:
    """The config as plain JSON-ready data: what config.yaml shows, a checkpoint keeps of the
    run that wrote it, and the trackers record."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))
