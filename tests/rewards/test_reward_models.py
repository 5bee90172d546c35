"""Outcome and process reward models on tiny random Llama models with SmolLM2's tokenizer,
the pure helpers that turn step scores into per-token tensors for grpo_process, and the
messages for a model.path or reward.model_path that holds no loadable model."""

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig

from rlcli.config import ConfigError
from rlcli.ops.advantages import grpo_process_advantages
from rlcli.rewards.reward_models import (
    OutcomeRewardModel,
    ProcessRewardModel,
    split_steps,
    step_reward_tensors,
    token_index_at_char,
)
from rlcli.runtime.models import smollm2_dir

CPU = torch.device("cpu")
TAG = "<issue_comment>"  # a single special token of SmolLM2's vocabulary
RESPONSE = "Step 1: 12 + 30 = 42.\n\nStep 2: 42 * 2 = 84.\n\nThe answer is 84."
QUESTIONS = ["What is 2+2?", "Compute (12 + 30) * 2, showing your work step by step please.", "?"]
RESPONSES = ["4", RESPONSE, "First.\n\n\n\nSecond, much longer step of the response.\n\n"]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(smollm2_dir()))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tokenizer):
    """{(kind, num_labels): dir} of random 2-layer Llamas saved with SmolLM2's tokenizer."""
    from transformers import LlamaForSequenceClassification, LlamaForTokenClassification

    dirs = {}
    for kind, cls in [
        ("orm", LlamaForSequenceClassification),
        ("prm", LlamaForTokenClassification),
    ]:
        for num_labels in (1, 2):
            # No pad_token_id in the config: the ORM must set it itself to batch.
            config = LlamaConfig(
                vocab_size=len(tokenizer),
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                num_labels=num_labels,
            )
            torch.manual_seed(num_labels)
            model = cls(config)
            # ORM logits of order 1-10, so a raw logit leaves (0, 1); PRM step probabilities
            # that differ by ~0.1, well above float32 rounding, and do not saturate.
            model.score.weight.data *= 50 if kind == "orm" else 10
            out = tmp_path_factory.mktemp(f"{kind}{num_labels}")
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
            dirs[kind, num_labels] = str(out)
    return dirs


def _orm(model_dirs, num_labels=1, batch_size=4, max_length=512):
    return OutcomeRewardModel(model_dirs["orm", num_labels], CPU, "float32", batch_size, max_length)


def _prm(model_dirs, num_labels=2, batch_size=4, max_length=512, tag=TAG):
    path = model_dirs["prm", num_labels]
    return ProcessRewardModel(path, CPU, "float32", batch_size, max_length, "\n\n", tag)


def _chat(tokenizer, question, response):
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": response}]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def test_orm_batch_matches_one_at_a_time_and_is_deterministic(model_dirs):
    orm = _orm(model_dirs, batch_size=3)
    batched = orm.score(QUESTIONS, RESPONSES)
    assert orm.score(QUESTIONS, RESPONSES) == batched
    orm.batch_size = 1
    single = orm.score(QUESTIONS, RESPONSES)
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(batched)) == 3  # the padding rows are not read at a padding position


@pytest.mark.parametrize("num_labels", [1, 2])
def test_orm_reads_the_head_on_the_chat_rendering(model_dirs, tokenizer, num_labels):
    orm = _orm(model_dirs, num_labels)
    scores = torch.tensor(orm.score(QUESTIONS, RESPONSES))
    text = _chat(tokenizer, QUESTIONS[1], RESPONSES[1])
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = orm.model(input_ids=ids).logits[0]  # [num_labels]
    if num_labels == 1:
        assert scores[1].item() == pytest.approx(logits[0].item(), abs=1e-5)
        assert ((scores < 0) | (scores > 1)).any()  # a raw logit, not a probability
    else:
        assert scores[1].item() == pytest.approx(logits.softmax(-1)[1].item(), abs=1e-6)
        assert ((scores > 0) & (scores < 1)).all()


def test_orm_without_chat_template_reads_plain_text(model_dirs, tokenizer):
    orm = _orm(model_dirs)
    orm.tokenizer.chat_template = None
    ids = tokenizer(QUESTIONS[0] + "\n\n" + RESPONSES[0], return_tensors="pt").input_ids
    with torch.no_grad():
        want = orm.model(input_ids=ids).logits[0, 0].item()
    assert orm.score(QUESTIONS[:1], RESPONSES[:1]) == [pytest.approx(want, abs=1e-5)]


def test_orm_left_truncation_keeps_the_end_of_the_response(model_dirs):
    orm = _orm(model_dirs, max_length=12)
    long_response = "The sum is twelve plus thirty, which makes forty-two in total"
    a, b, c = orm.score(
        ["First question?", "A different, longer question about sums?", "First question?"],
        [long_response, long_response, long_response.replace("total", "all")],
    )
    assert a == b  # the questions were cut off; the last 12 tokens are the same
    assert a != c  # the changed last word was kept


def test_split_steps_on_hand_written_text():
    assert split_steps("a\n\nbb\n\nccc", "\n\n") == [(0, 1), (3, 5), (7, 10)]
    text = "\n\n  first \n\n\n\n\n\nsecond\n\n \n\nthird\n\n"
    assert [text[s:e] for s, e in split_steps(text, "\n\n")] == ["first", "second", "third"]
    assert split_steps(text, "\n\n")[0] == (4, 9)
    assert split_steps("  \n\n", "\n\n") == [] and split_steps("", "\n\n") == []


def test_token_index_at_char_on_smollm2(tokenizer):
    ids = tokenizer.encode(RESPONSE, add_special_tokens=False)
    step1_end = RESPONSE.index(".") + 1
    index = token_index_at_char(tokenizer, ids, step1_end)
    assert index == 15
    assert tokenizer.decode(ids[: index + 1]) == "Step 1: 12 + 30 = 42."
    assert token_index_at_char(tokenizer, ids, RESPONSE.index("answer") + 3) == 36  # "Ġanswer"
    assert token_index_at_char(tokenizer, ids, len(RESPONSE)) == len(ids) - 1
    assert token_index_at_char(tokenizer, ids, 1) == 0


def _response_batch(tokenizer, responses):
    """Right-padded response ids ending in EOS and their mask, as a Rollout holds them."""
    rows = [
        tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in responses
    ]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        assert tokenizer.decode(row, skip_special_tokens=True) == responses[i]
    return ids, mask


def test_step_reward_tensors_place_scores_at_step_ends(tokenizer):
    ids, mask = _response_batch(tokenizer, [RESPONSE, "Short."])
    scores = [[(21, 0.25), (43, 0.5), (len(RESPONSE), 0.75)], [(6, 0.875)]]
    rewards, ends = step_reward_tensors(tokenizer, ids, mask, scores)
    assert ends.dtype == torch.bool and rewards.dtype == torch.float32
    assert ends[0].nonzero().squeeze(-1).tolist() == [15, 32, 41]  # the three "." tokens
    assert rewards[0, [15, 32, 41]].tolist() == [0.25, 0.5, 0.75]
    assert ends[1].nonzero().squeeze(-1).tolist() == [1] and rewards[1, 1].item() == 0.875
    assert not (ends & ~mask.bool()).any() and rewards[~ends].eq(0).all()


def test_prm_scores_every_non_empty_step_at_its_end(model_dirs):
    prm = _prm(model_dirs)
    scored = prm.score_steps(QUESTIONS, RESPONSES)
    assert [len(s) for s in scored] == [1, 3, 2]
    assert [end for end, _ in scored[1]] == [21, 43, len(RESPONSE)]
    assert [end for end, _ in scored[2]] == [6, RESPONSES[2].index("response.") + 9]
    assert all(0 < p < 1 for row in scored for _, p in row)
    # A copy of the tag in the text is removed, so the PRM reads only the tags it was given.
    [tagged] = prm.score_steps([f"Why{TAG}?"], [f"One {TAG}step.\n\nTwo."])
    [plain] = prm.score_steps(["Why?"], ["One step.\n\nTwo."])
    assert [e for e, _ in tagged] == [len(f"One {TAG}step."), len(f"One {TAG}step.\n\nTwo.")]
    assert [p for _, p in tagged] == pytest.approx([p for _, p in plain], abs=1e-6)
    prm.batch_size = 1
    single = prm.score_steps(QUESTIONS, RESPONSES)
    for got, want in zip(scored, single, strict=True):
        assert [e for e, _ in got] == [e for e, _ in want]
        assert [p for _, p in got] == pytest.approx([p for _, p in want], abs=1e-6)


@pytest.mark.parametrize("num_labels", [1, 2])
def test_prm_reads_the_step_tags_after_each_step(model_dirs, tokenizer, num_labels):
    prm = _prm(model_dirs, num_labels)
    [scored] = prm.score_steps([QUESTIONS[1]], [RESPONSE])
    steps = f"Step 1: 12 + 30 = 42.{TAG}Step 2: 42 * 2 = 84.{TAG}The answer is 84.{TAG}"
    ids = tokenizer(_chat(tokenizer, QUESTIONS[1], steps), add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = prm.model(input_ids=torch.tensor([ids])).logits[0]  # [L, num_labels]
    at_tags = logits[torch.tensor(ids) == tokenizer.convert_tokens_to_ids(TAG)]
    want = at_tags[:, 0].sigmoid() if num_labels == 1 else at_tags.softmax(-1)[:, 1]
    assert [p for _, p in scored] == pytest.approx(want.tolist(), abs=1e-6)


def test_prm_left_truncation_scores_only_the_last_steps(model_dirs):
    prm = _prm(model_dirs, max_length=20)  # room for the last two steps' tags, not the first
    [scored] = prm.score_steps([QUESTIONS[1]], [RESPONSE])
    assert [end for end, _ in scored] == [43, len(RESPONSE)]


def test_prm_step_tag_must_be_one_token(model_dirs):
    with pytest.raises(ConfigError, match=r"<step>.*prm2.*reward\.step_tag"):
        _prm(model_dirs, tag="<step>")


def test_prm_scores_feed_grpo_process_advantages(model_dirs, tokenizer):
    responses = [RESPONSE, "Step 1: 42.\n\nSo 84.", "Just 84."]
    scored = _prm(model_dirs).score_steps([QUESTIONS[1]] * 3, responses)
    ids, mask = _response_batch(tokenizer, responses)
    step_rewards, step_ends = step_reward_tensors(tokenizer, ids, mask, scored)
    adv = grpo_process_advantages(step_rewards, step_ends)

    # By hand: normalise every step score by the group's mean and Bessel std (+1e-6).
    flat = [p for row in scored for _, p in row]
    mean = sum(flat) / len(flat)
    std = (sum((p - mean) ** 2 for p in flat) / (len(flat) - 1)) ** 0.5
    for row, steps in enumerate(scored):
        normed = [(p - mean) / (std + 1e-6) for _, p in steps]
        # 1e-4: the step rewards are float32 and ~0.01 apart, so normalising loses ~1e-5.
        assert adv[row, 0].item() == pytest.approx(sum(normed), abs=1e-4)
        last_end = step_ends[row].nonzero().max().item()
        assert last_end == mask[row].sum().item() - 2  # the final ".", just before EOS
        assert (adv[row, : last_end + 1] != 0).all()
        assert (adv[row, last_end + 1 :] == 0).all()  # EOS and padding


# --- the same models as the reward of a training run on the tiny policy -------------------------


def tiny_run(*overrides):
    from rlcli.train.run import setup
    from rlcli.validate import compose

    return setup(
        compose(
            [
                "model=tiny",
                "algo.beta=0",
                "trainer.prompts_per_step=2",
                "sampler.max_new_tokens=12",
                "logger.progress=false",
                *overrides,
            ]
        )
    )


def test_training_on_an_outcome_reward_model(model_dirs):
    from rlcli.train.step import train_step

    path = model_dirs["orm", 1]
    run = tiny_run("reward=reward_model", f"reward.model_path={path}")
    collected = run.collector.next_batch()
    batch, scores, metrics = collected.rollout, collected.scores, collected.metrics
    # The rewards are the ORM's scores of the sampled responses.
    expected = _orm(model_dirs).score([s.question for s in _questions(run, batch)], batch.texts)
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)
    assert metrics["reward/reward_model"] == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    step = train_step(run)
    assert step["actor/grad_norm"] > 0 and step["reward/errors"] == 0


def _questions(run, batch):
    by_id = {p.id: p for p in run.prompts.problems}
    return [by_id[i] for i in batch.prompt_ids]


def test_training_on_process_rewards_gives_token_level_advantages(model_dirs):
    from rlcli.ops.advantages import ADVANTAGES, AdvantageInputs
    from rlcli.train.step import train_step

    run = tiny_run(
        "reward=process",
        "algo.advantage=grpo_process",
        f"reward.model_path={model_dirs['prm', 2]}",
        f"reward.step_tag='{TAG}'",
        "reward.step_separator=' '",  # the random policy writes no newlines, but spaces
    )
    collected = run.collector.next_batch()
    batch, scores = collected.rollout, collected.scores
    ends = ~batch.estimator_inputs["step_rewards"].isnan()
    assert ends.sum() > len(batch.texts)  # several steps per response on average
    assert not (ends & ~batch.response_mask.bool()).any()
    mask = batch.response_mask
    inputs = AdvantageInputs(
        scores=scores, kl_penalty=torch.zeros(mask.shape), mask=mask,
        group_size=run.settings.group_size, prompt_ids=batch.prompt_ids,
        step_rewards=batch.estimator_inputs["step_rewards"],
    )  # fmt: skip
    advantages, _ = ADVANTAGES["grpo_process"](inputs)
    assert advantages.shape == batch.response_mask.shape
    # Per token, not per response: within a row the advantage changes at step ends.
    rows = zip(advantages, batch.response_mask.bool(), strict=True)
    assert any(len(set(row[m].tolist())) > 1 for row, m in rows)
    step = train_step(run)
    assert step["actor/grad_norm"] > 0 and 0 < step["reward/process"] < 1  # mean step probability


# --- model directories a user names: model.path and reward.model_path ------------------------


def _load_policy(path: str):
    """What `rlcli train` does with model.path: resolve it, load the tokenizer, then the model."""
    from rlcli.config import ModelConfig
    from rlcli.runtime.models import load_causal_lm, load_tokenizer, resolve_model_path

    cfg = ModelConfig("hub", "hub", path, False, 2, 64, 2)
    resolved = resolve_model_path(cfg, seed=0)
    load_tokenizer(resolved)
    return load_causal_lm(resolved, "float32", CPU)


def _load_orm(path: str):
    return OutcomeRewardModel(path, CPU, "float32", 2, 64)


def _load_prm(path: str):
    return ProcessRewardModel(path, CPU, "float32", 2, 64, "\n\n", TAG)


LOADERS = {"model.path": _load_policy, "reward.model_path": _load_orm, "process": _load_prm}


@pytest.fixture(scope="module")
def broken_dirs(tmp_path_factory, tiny_model_dir):
    """{case: path} of directories and files that are not a loadable model."""
    import shutil

    root = tmp_path_factory.mktemp("broken")

    def copy(name, drop=(), files=None):
        out = root / name
        shutil.copytree(tiny_model_dir, out, ignore=shutil.ignore_patterns(*drop))
        for file, content in (files or {}).items():
            (out / file).write_bytes(content)
        return str(out)

    (root / "empty").mkdir()
    (root / "file.bin").write_bytes(b"not a model")
    return {
        "empty": str(root / "empty"),
        "file": str(root / "file.bin"),
        "no weights": copy("no_weights", drop=["*.safetensors"]),
        "corrupt weights": copy("corrupt", files={"model.safetensors": b"\x08\x00\x00\x00garbage"}),
        "truncated weights": copy("truncated", files={"model.safetensors": b"{}" * 3}),
        "config not JSON": copy("bad_config", files={"config.json": b'{"model_type": llama'}),
        "no tokenizer": copy("no_tokenizer", drop=["tokenizer*"]),
    }


BROKEN = {
    "empty": "holds no config.json: not a Hugging Face model directory",
    "file": "is a file, not a directory",
    "no weights": "could not be loaded from it: Error no file named model.safetensors",
    "corrupt weights": "could not be loaded from it: Error while deserializing header",
    "truncated weights": "could not be loaded from it: Error while deserializing header",
    "config not JSON": "its config.json is not valid JSON (Expecting value: line 1 column 16",
    "no tokenizer": "holds no tokenizer (none of tokenizer.json, tokenizer_config.json",
}


@pytest.mark.parametrize("case", list(BROKEN))
@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_directory_that_is_no_model_is_named_with_what_is_wrong(broken_dirs, loader, case):
    key = "model.path" if loader == "model.path" else "reward.model_path"
    path = broken_dirs[case]
    with pytest.raises(ConfigError) as err:
        LOADERS[loader](path)
    message = str(err.value)
    assert message.startswith(f"{key}={path}") and BROKEN[case] in message, message
    assert "\n" not in message


def _offline(monkeypatch):
    """Offline mode: huggingface_hub fails at once instead of retrying the network for ~20 s."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_relative_model_path_is_taken_from_where_rlcli_started(
    tmp_path, monkeypatch, tiny_model_dir, loader
):
    import shutil

    _offline(monkeypatch)
    key = "model.path" if loader == "model.path" else "reward.model_path"
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "models" / "m"
    with pytest.raises(
        ConfigError, match=re.escape(f"{key}=./models/m does not exist (resolved to {missing})")
    ):
        LOADERS[loader]("./models/m")
    # Without a leading ./ it could be a hub id: the message names both places looked in.
    with pytest.raises(
        ConfigError,
        match=re.escape(f"{key}=models/m is not a local directory (there is no {missing})"),
    ):
        LOADERS[loader]("models/m")
    shutil.copytree(tiny_model_dir, missing)
    LOADERS[loader]("models/m")


def test_relative_paths_are_taken_from_the_launch_dir_when_hydra_moves_the_cwd(
    tmp_path, monkeypatch
):
    """hydra.job.chdir=true moves the working directory into the run's; Hydra keeps the one
    rlcli was started in as runtime.cwd."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    from rlcli.runtime.models import launch_dir

    assert launch_dir() == Path.cwd()  # no Hydra job: the working directory
    job = SimpleNamespace(runtime=SimpleNamespace(cwd=str(tmp_path)))
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: job))
    assert launch_dir() == tmp_path


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_hub_id_that_cannot_be_fetched_offline_says_so(monkeypatch, loader):
    _offline(monkeypatch)
    key = "model.path" if loader == "model.path" else "reward.model_path"
    with pytest.raises(ConfigError) as err:
        LOADERS[loader]("rlcli-tests/no-such-model")
    message = str(err.value)
    assert message.startswith(f"{key}=rlcli-tests/no-such-model is not a local directory (")
    assert "could not be fetched from the Hugging Face hub (offline, or no such repo): " in message
    assert f"(`hf download rlcli-tests/no-such-model --local-dir DIR`) and set {key}=DIR" in message
