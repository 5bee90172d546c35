"""DPO: preference pairs in text and chat form, best-vs-worst pairing, the cached reference,
a tiny-model run that learns its pairs, and `rlcli pairs` feeding `rlcli train algo=dpo`.
(The DPO loss itself is checked by hand in test_ops.py: test_dpo_loss_value_and_gradient_sign.)
"""

import json
import math

import pytest
import torch

from rlcli.commands.make_pairs import best_vs_worst
from rlcli.config import ConfigError
from rlcli.data import load_splits
from rlcli.train.dpo import encode_pairs, pair_metrics, sequence_logprobs, setup, train_step
from rlcli.validate import compose
from tests.conftest import FIXTURES
from tests.train.test_train import rlcli

FIXTURE = FIXTURES / "pairs.jsonl"
# DPO on the tiny model and the fixture's 12 pairs, all of them in each step.
TINY_DPO = [
    "model=tiny",
    "algo=dpo",
    "data=pairs",
    f"data.path={FIXTURE}",
    "trainer.prompts_per_step=12",
    "trainer.micro_batch_size=4",
    "logger.progress=false",
]


def pairs_cfg(path, *overrides):
    return compose(["algo=dpo", "data=pairs", f"data.path={path}", *overrides]).data


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_text_pairs_load_with_a_held_out_split():
    train, test = load_splits(pairs_cfg(FIXTURE, "data.num_test=2"))
    assert len(train) == 10 and len(test) == 2
    first = {p.id: p for p in train + test}["pairs-train-0"]
    assert first.prompt == [{"role": "user", "content": "What is 3 + 4?"}]
    assert first.chosen == "3 + 4 = 7. The answer is 7."
    assert first.rejected == "3 + 4 = 5. The answer is 5."


def test_chat_pairs_explicit_and_implicit_prompt_and_field_names(tmp_path):
    user = {"role": "user", "content": "Say hi."}
    rows = [
        {
            "q": [user],
            "good": [{"role": "assistant", "content": "Hi!"}],
            "bad": [{"role": "assistant", "content": "No."}],
        }
    ]
    path = write(tmp_path / "chat.jsonl", rows)
    fields = ["data.prompt_field=q", "data.chosen_field=good", "data.rejected_field=bad"]
    (pair,), _ = load_splits(pairs_cfg(path, *fields, "data.system_prompt=Be kind."))
    assert pair.prompt == [{"role": "system", "content": "Be kind."}, user]
    assert (pair.chosen, pair.rejected) == ("Hi!", "No.")
    # Anthropic-HH style: no prompt field, the conversations share everything but the reply.
    hh = [
        {
            "chosen": [user, {"role": "assistant", "content": "Hi!"}],
            "rejected": [user, {"role": "assistant", "content": "No."}],
        }
    ]
    (pair,), _ = load_splits(pairs_cfg(write(tmp_path / "hh.jsonl", hh)))
    assert pair.prompt == [user] and (pair.chosen, pair.rejected) == ("Hi!", "No.")
    with pytest.raises(ConfigError, match="no field 'chosen' in row 0"):
        load_splits(pairs_cfg(path))


def test_best_vs_worst_skips_ties_and_unscored():
    nan = math.nan
    scores = torch.tensor([[0.0, 1.0, 0.5], [1.0, 1.0, 1.0], [nan, 0.0, 1.0], [nan, nan, 1.0]])
    assert best_vs_worst(scores) == [(1, 0), None, (2, 1), None]
    assert best_vs_worst(torch.tensor([[0.0, 0.2]]), min_margin=0.5) == [None]


@pytest.fixture(scope="module")
def tiny_dpo():
    return setup(compose([*TINY_DPO, "trainer.lr=1e-3"]))


def test_the_reference_cache_holds_the_initial_policys_log_probs(tiny_dpo):
    run = tiny_dpo
    pairs = run.pairs.problems[:4]
    batch = encode_pairs(run.tokenizer, pairs, run.settings.max_length, run.device)
    # Rows: the replies ended by EOS after their chat-rendered prompts, chosen then rejected.
    reply = batch.input_ids[0, batch.prompt_width :][batch.response_mask[0].bool()]
    assert run.tokenizer.decode(reply) == pairs[0].chosen + run.tokenizer.eos_token
    logp = sequence_logprobs(run.policy, batch, torch.arange(8), 4)
    cached = torch.tensor([run.reference[p.id] for p in pairs])
    assert torch.allclose(logp[:4], cached[:, 0], atol=1e-4)
    assert torch.allclose(logp[4:], cached[:, 1], atol=1e-4)
    assert not hasattr(run, "reference_model")  # only the numbers are kept


def test_a_short_run_learns_its_pairs(tiny_dpo):
    run = tiny_dpo
    pairs = run.pairs.problems
    before = pair_metrics(run, pairs)
    # The policy is the reference: every implicit reward is 0, the loss is log 2.
    assert before["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert before["reward/accuracy"] == 0.0 and before["reward/margin"] == pytest.approx(0)
    steps = [train_step(run) for _ in range(10)]
    after = pair_metrics(run, pairs)
    assert after["reward/accuracy"] > 0.9, (before, after)
    assert after["reward/margin"] > 0.3 and after["loss"] < math.log(2) - 0.15
    assert steps[-1]["logp/chosen"] > steps[0]["logp/chosen"]  # chosen replies grew likelier
    assert {"reward/chosen", "reward/rejected", "logp/rejected", "actor/grad_norm"} <= set(steps[0])


# Ties on even answers (a constant reward), the response length otherwise.
REWARD = """
def by_answer(prompts, responses, answers, **fields):
    return [1.0 if int(a) % 2 == 0 else float(len(r)) for r, a in zip(responses, answers)]
"""


def test_rlcli_pairs_then_rlcli_train_algo_dpo(tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    pairs_file = tmp_path / "pairs.jsonl"
    out = rlcli(
        "pairs", "model=tiny", "data.num_train=12", "data.num_test=2", "reward=python",
        f"reward.function={tmp_path / 'reward.py'}:by_answer", "pairs.k=4",
        "sampler.max_new_tokens=8", f"pairs.out={pairs_file}", f"hydra.run.dir={tmp_path / 'p'}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    train, _ = load_splits(compose(["data.num_train=12", "data.num_test=2"]).data)
    odd = [p for p in train if int(p.answer) % 2]
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    # One pair per odd-answer prompt (lengths differ), none where all rewards tie.
    assert 0 < len(rows) <= len(odd) and all(int(r["answer"]) % 2 for r in rows)
    assert all(r["chosen_score"] > r["rejected_score"] for r in rows)
    assert all(len(r["chosen"]) > len(r["rejected"]) for r in rows)
    assert f"wrote {len(rows)} pairs from 12 prompts" in out.stdout

    run_dir = tmp_path / "dpo"
    out = rlcli(
        "train", "model=tiny", "algo=dpo", "data=pairs", f"data.path={pairs_file}",
        "trainer.max_steps=2", "trainer.prompts_per_step=2", "logger.progress=false",
        f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ["loss/policy", "reward/accuracy", "reward/margin", "logp/chosen", "logp/rejected"]:
        assert all(key in m for m in metrics), key
    assert (run_dir / "checkpoints" / "step_2" / "model.safetensors").exists()
