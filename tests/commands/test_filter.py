"""`rlcli filter` (DUPO's pre-filter) on the tiny model: the real command samples with vLLM,
scores, and writes a smaller copy of the dataset with a report of what it dropped."""

import json

import torch

from rlcli.commands.filter import verdicts
from rlcli.data import load_splits
from rlcli.validate import compose, section
from tests.train.test_train import rlcli

# Always right on answers divisible by 3, never on those leaving 1; on the rest it depends
# on the sampled response (its length's parity), so those prompts are usually mixed.
REWARD = """
def by_answer(prompts, responses, answers, **fields):
    out = []
    for response, answer in zip(responses, answers):
        rest = int(answer) % 3
        out.append(1.0 if rest == 0 else 0.0 if rest == 1 else float(len(response) % 2))
    return out
"""


def test_verdicts():
    nan = float("nan")
    scores = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, nan], [0.6, 0.5]])
    assert verdicts(scores, 0.5) == ["always", "never", "mixed", "mixed", "mixed"]


def test_rlcli_filter_writes_a_smaller_dataset_and_reports_the_counts(tmp_path):
    (tmp_path / "by_answer.py").write_text(REWARD)
    data = ["data.num_train=24", "data.num_test=4"]
    run_dir, out = tmp_path / "run", tmp_path / "kept.jsonl"
    result = rlcli(
        "filter",
        "model=tiny",
        *data,
        "reward=python",
        f"reward.function={tmp_path / 'by_answer.py'}:by_answer",
        "filter.k=4",
        "filter.prompts_per_batch=10",
        "sampler.max_new_tokens=8",
        f"filter.out={out}",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr
    train, _ = load_splits(compose(["sampler=hf", *data]).data)
    rests = [int(p.answer) % 3 for p in train]
    report = json.loads((run_dir / "filter_report.json").read_text())
    assert report["prompts"] == 24
    assert report["dropped_always_correct"] == rests.count(0) > 0
    assert report["never_correct"] >= rests.count(1) > 0
    assert report["dropped_never_correct"] == 0  # kept unless filter.drop_never_correct
    assert report["kept"] == 24 - rests.count(0) < 24
    assert f"kept {report['kept']} of 24 prompts" in result.stdout

    # The written copy loads as a dataset again and holds exactly the kept problems.
    kept, _ = load_splits(section("data", "jsonl", path=str(out), num_test=0))
    assert len(kept) == report["kept"]
    assert {p.question for p in kept} == {p.question for p in train if int(p.answer) % 3}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(int(r["answer"]) % 3 for r in rows)

    dropped_never = rlcli(
        "filter", "model=tiny", *data, "reward=python",
        f"reward.function={tmp_path / 'by_answer.py'}:by_answer", "filter.k=4",
        "sampler.max_new_tokens=8", "filter.drop_never_correct=true",
        f"hydra.run.dir={tmp_path / 'run2'}",
    )  # fmt: skip
    assert dropped_never.returncode == 0, dropped_never.stderr
    report = json.loads((tmp_path / "run2" / "filter_report.json").read_text())
    assert report["dropped_never_correct"] == report["never_correct"] >= rests.count(1)
    assert report["kept"] == 24 - report["dropped_always_correct"] - report["never_correct"]
    assert (tmp_path / "run2" / "filtered.jsonl").exists()
