"""Prompt datasets: each adapter returns a train and a held-out test list of `Problem`s.

The room of everything a run reads before it samples: `problems` (the `Problem` record,
rendering a prompt, the training stream, writing records back), `generated` (seeded `arith`
and `countdown` sets; `countdown` holds that task's generator and checker), `records` (local
files and hub datasets), `answers` (how an answer field writes the answer), `pairs` (DPO's
preference pairs). Two kinds of adapter, picked by
`data.name` from `DATASETS` below:

- generated from a seed: `arith` and `countdown`;
- records, read from a local .jsonl/.json/.parquet file (`data.path`) or a Hugging Face hub
  dataset (`data.hub_id`): `jsonl`, `parquet`, `gsm8k`, `math` and `dapo_math_17k` are one
  adapter, `record_splits`, which each conf/data/*.yaml configures: where the prompt and the
  answer are (dotted paths into nested records), how the answer is written
  (`answers.ANSWER_FORMATS`), a prompt template, de-duplication and a size limit.

Every problem keeps its source record, so `write_records` can write a filtered copy that the
same adapter reads back with `data.path=`. Prompts are rendered with the model's chat template
by `render_prompt`; `PromptStream` feeds the training split to the trainer.
"""

from __future__ import annotations

from collections.abc import Callable

from rlcli.config import ConfigError, DataConfig
from rlcli.data.generated import arith_splits, countdown_splits
from rlcli.data.pairs import pair_from_record
from rlcli.data.problems import Splits
from rlcli.data.records import record_splits

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
