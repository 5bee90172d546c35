"""Prompt datasets: each adapter returns a train and a held-out test list of `Problem`s.

The room of everything a run reads before it samples: `problems` (the `Problem` record, its
prompt rendered with the model's chat template, the training stream, writing records back),
`generated` (seeded `arith` and `countdown` sets), `files` (reading a local file, a
save_to_disk folder or a hub split), `records` (their records as problems), `answers` (how an
answer field writes the answer), `pairs` (DPO's preference pairs). `DATASETS` maps `data.name`
to its adapter; `check_data` is the data section's checks.
"""

from __future__ import annotations

from collections.abc import Callable

from rlcli.config import ConfigError, DataConfig
from rlcli.data.generated import arith_splits, countdown_splits
from rlcli.data.pairs import pair_from_record
from rlcli.data.problems import Splits
from rlcli.data.records import record_splits

# Two kinds of adapter: generated from a seed (`arith`, `countdown`), and records read from a
# local .jsonl/.json/.parquet/.csv file or save_to_disk folder (`data.path`) or a Hugging Face
# hub dataset (`data.hub_id`). `jsonl`, `parquet`, `gsm8k`, `math` and `dapo_math_17k` are one
# adapter, `record_splits`, which each conf/data/*.yaml configures: where the prompt and the
# answer are (dotted paths into nested records), how the answer is written
# (`answers.ANSWER_FORMATS`), a prompt template, de-duplication and a size limit.
DATASETS: dict[str, Callable[[DataConfig], Splits]] = {
    "arith": arith_splits,
    "countdown": countdown_splits,
    "jsonl": record_splits,
    "parquet": record_splits,
    "gsm8k": record_splits,
    "math": record_splits,
    "dapo_math_17k": record_splits,
    # Preference pairs for algo=dpo (data.pairs.Pair, not Problem).
    "pairs": lambda cfg: record_splits(
        cfg, pair_from_record, key=lambda p: (str(p.prompt), p.chosen, p.rejected)
    ),
}


def load_splits(cfg: DataConfig) -> Splits:
    """The train and test problems of the dataset `cfg.name` names."""
    if cfg.name not in DATASETS:
        raise ConfigError(
            f"data.name={cfg.name!r} is not one of the valid choices: "
            f"{', '.join(sorted(DATASETS))}."
        )
    return DATASETS[cfg.name](cfg)


def check_data(data: DataConfig) -> None:
    """A ConfigError for a record dataset without records, or a file given to a generated set."""
    if data.name in ("jsonl", "parquet", "pairs") and not (data.path or data.hub_id):
        raise ConfigError(
            f"data={data.name} needs data.path=<.jsonl, .json, .parquet or .csv file> (or "
            "data.hub_id=<Hugging Face dataset id>): the training records."
        )
    given = [
        f"data.{key}={value}"
        for key, value in [
            ("path", data.path),
            ("test_path", data.test_path),
            ("hub_id", data.hub_id),
        ]
        if value
    ]
    if data.name in ("arith", "countdown") and given:
        # Every data field has a value (conf/data_base.yaml), so Hydra would not object.
        raise ConfigError(
            f"{given[0]} is read by the record datasets, but data={data.name} generates its "
            "problems and would ignore it. For your own file use data=jsonl (or parquet, "
            f"gsm8k, math, dapo_math_17k, pairs) with {given[0]}."
        )
