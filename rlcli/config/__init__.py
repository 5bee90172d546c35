"""The config's schema, at the bottom of the house (its validation, which reads every registry,
is `rlcli.validate`, above them).

`schema` holds the typed dataclasses every room reads (`Config`, `AlgoConfig`, ...) and
`ConfigError`; it imports nothing of rlcli, so any module may import it (this package
re-exports it). Beside it, from the schema and conf/ alone: `overrides` (a command line's keys
and choices, before Hydra composes), `comments` and `help` (conf/'s comments, `--help`) and
`checks` (the sections with no one reader `rlcli.validate` can import). Defaults live in
`conf/` alone, each field documented by the comment above it there.
"""

from rlcli.config.schema import (
    CONF_DIR,
    VLLM_HEAD_SIZES,
    AlgoConfig,
    Config,
    ConfigError,
    DataConfig,
    EnvConfig,
    EvalConfig,
    FilterConfig,
    LauncherConfig,
    LoggerConfig,
    LoraConfig,
    ModelConfig,
    PairsConfig,
    RewardConfig,
    SamplerConfig,
    TrainerConfig,
    config_dict,
)

__all__ = [
    "CONF_DIR",
    "VLLM_HEAD_SIZES",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "FilterConfig",
    "LauncherConfig",
    "LoggerConfig",
    "LoraConfig",
    "ModelConfig",
    "PairsConfig",
    "RewardConfig",
    "SamplerConfig",
    "TrainerConfig",
    "config_dict",
]
