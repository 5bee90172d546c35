"""The checks of the sections with no one room below validation to sit in, from the schema alone.

`algo.*` is read across the house (the math in `ops/`, the step, shaping and DPO in `train/`),
and `eval.*` and `filter.*` by the commands (`rlcli eval`, `rlcli filter`), which sit below
`rlcli.validate` and so cannot hold a check it calls. Each function takes its one section; what
spans sections (`algo.filter_metric` against the reward, `algo=dpo` against `data=pairs`) stays
in `rlcli.validate`.
"""

from __future__ import annotations

from rlcli.config.schema import AlgoConfig, ConfigError, EvalConfig, FilterConfig


def check_algo(algo: AlgoConfig) -> None:
    """A ConfigError for an algorithm setting out of range or two that exclude each other."""
    if algo.dual_clip is not None and algo.dual_clip <= 1:
        raise ConfigError(f"algo.dual_clip={algo.dual_clip} is not allowed: it must be > 1.")
    if algo.ptx_coef > 0 and not algo.ptx_path:
        raise ConfigError(
            f"algo.ptx_coef={algo.ptx_coef} needs algo.ptx_path=<text or jsonl file> of "
            "pretraining text for the PPO-ptx language-model loss."
        )
    if algo.dynamic_sampling and algo.dupo_fill:
        raise ConfigError(
            "algo.dynamic_sampling=true and algo.dupo_fill=true both replace zero-signal groups; "
            "choose one (DAPO re-samples, DUPO duplicates)."
        )
    if algo.max_gen_batches < 1:
        raise ConfigError(f"algo.max_gen_batches={algo.max_gen_batches} must be >= 1.")
    if algo.objective == "dpo" and (algo.beta <= 0 or algo.max_length < 2):
        raise ConfigError(
            f"algo=dpo needs algo.beta > 0 (the DPO temperature, 0.1 in the paper; got "
            f"{algo.beta}) and algo.max_length >= 2 (got {algo.max_length})."
        )


def check_eval(evaluation: EvalConfig) -> None:
    """A ConfigError for held-out evaluation settings that cannot sample or count."""
    if (
        min(evaluation.k, evaluation.prompts_per_batch) < 1
        or evaluation.temperature <= 0
        or not 0 < evaluation.top_p <= 1
    ):
        raise ConfigError(
            f"eval.k={evaluation.k} and eval.prompts_per_batch={evaluation.prompts_per_batch} "
            f"must be >= 1, eval.temperature={evaluation.temperature} > 0 and "
            f"eval.top_p={evaluation.top_p} in (0, 1]."
        )


def check_filter(filtering: FilterConfig) -> None:
    """A ConfigError for `rlcli filter` settings that sample nothing."""
    if filtering.k < 1 or filtering.prompts_per_batch < 1:
        raise ConfigError(
            f"filter.k={filtering.k} and filter.prompts_per_batch={filtering.prompts_per_batch} "
            "must be >= 1."
        )
