"""The config's schema, at the bottom of the house (its validation, which reads every registry,
is `rlcli.validate`, above them).

`schema` holds the typed dataclasses every room reads (`Config`, `AlgoConfig`, ...) and
`ConfigError`; it imports nothing of rlcli, so any module may import it (this package
re-exports it). `overrides` checks a command line's keys and group choices before Hydra
composes, from the schema alone (and names rlcli's field for TRL's or verl's). `comments` reads
the comment above each field in conf/; `help` lays out `rlcli train --help` from them;
`checks` holds the checks of the sections with no one reader `rlcli.validate` can import
(`algo`, read across ops/ and train/; `eval` and `filter`, read by commands).
Defaults live in `conf/` alone, each field documented by the comment above it there.
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
    LoggerConfig,
    LoraConfig,
    ModelConfig,
    PairsConfig,
    RewardConfig,
    SamplerConfig,
    TrainerConfig,
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
    "LoggerConfig",
    "LoraConfig",
    "ModelConfig",
    "PairsConfig",
    "RewardConfig",
    "SamplerConfig",
    "TrainerConfig",
]
