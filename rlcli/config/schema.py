"""The config schema: one typed dataclass per group, and `ConfigError`.

Fields are documented once, by the comment above each of them in `conf/**/*.yaml`, which also
holds every default; this module fixes their types. It imports nothing of rlcli, so every
room may read the config (validation is `config.validate`, above the registries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# The Hydra config tree (`conf/` at the top of the repository).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


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
    surrogate: str = "ppo_clip"
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
    # the training loop: clipped (RL on sampled responses) or dpo (preference pairs)
    objective: str = "clipped"
    max_length: int = 1024


@dataclass
class RewardConfig:
    name: str = "math"
    components: list[str] = field(default_factory=lambda: ["math"])
    weights: list[float] | None = None
    pattern: str = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"
    overlong_cache_len: int = 0
    timeout_s: float = 5.0
    # python
    function: str | None = None
    # reward_model, process
    model_path: str | None = None
    batch_size: int = 8
    max_length: int = 1024
    step_separator: str = "\n"
    step_tag: str = "<extra_0>"


@dataclass
class SamplerConfig:
    name: str = "vllm"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48
    max_prompt_tokens: int = 512
    long_prompts: str = "error"
    stop: list[str] = field(default_factory=list)
    old_logp: str = "learner"
    tis_cap: float = 2.0
    # vLLM engine
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    cpu_kv_cache_gb: float = 0.125
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
    # generated: arith, countdown
    difficulty: int = 2
    operators: str = "+-"
    num_operands: int = 2
    num_train: int = 2000
    # records: jsonl, parquet, gsm8k, math, dapo_math_17k
    path: str | None = None
    test_path: str | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    train_split: str = "train"
    test_split: str | None = None
    prompt_field: str = "question"
    answer_field: str = "answer"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    answer_format: str = "plain"
    template: str | None = None
    dedupe: bool = False
    limit: int | None = None
    # all
    num_test: int = 200
    instruction: str = ""
    system_prompt: str | None = None
    seed: int = 1234


@dataclass
class PairsConfig:
    k: int = 8
    min_margin: float = 0.0
    prompts_per_batch: int = 16
    out: str | None = None


@dataclass
class FilterConfig:
    k: int = 8
    correct_above: float = 0.5
    drop_never_correct: bool = False
    prompts_per_batch: int = 16
    out: str | None = None


@dataclass
class TrainerConfig:
    max_steps: int = 30
    seed: int = 0
    prompts_per_step: int = 4
    group_size: int = 4
    mini_batches: int = 1
    epochs: int = 1
    micro_batch_size: int = 8
    max_tokens_per_micro_batch: int = 512
    bf16_autocast: bool = True
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    device: str = "auto"
    dtype: str = "float32"
    save_every: int = 50
    keep_last: int | None = 2
    resume: str | None = "auto"
    max_bad_steps: int = 3
    eval_every: int = 0


@dataclass
class LoggerConfig:
    name: str = "jsonl"
    progress: bool = True
    sample_every: int = 0
    project: str = "rlcli"
    entity: str | None = None
    run_name: str | None = None
    table_every: int = 10


@dataclass
class EvalConfig:
    k: int = 8
    temperature: float = 1.0
    max_problems: int | None = None
    prompts_per_batch: int = 32
    correct_above: float = 0.5


@dataclass
class Config:
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
