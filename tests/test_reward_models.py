"""Outcome and process reward models on tiny random Llama models with SmolLM2's tokenizer,
and the pure helpers that turn step scores into per-token tensors for grpo_process."""

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig

from rlcli.config import ConfigError
from rlcli.ops.advantages import grpo_process_advantages
from rlcli.rewards.models import (
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
    from rlcli.config.validate import compose
    from rlcli.train.run import setup

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
    from rlcli.train.step import collect_batch, train_step

    path = model_dirs["orm", 1]
    run = tiny_run("reward=reward_model", f"reward.model_path={path}")
    batch, scores, metrics = collect_batch(run)
    # The rewards are the ORM's scores of the sampled responses.
    expected = _orm(model_dirs).score([s.question for s in _questions(run, batch)], batch.texts)
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)
    assert metrics["reward/reward_model"] == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    step = train_step(run)
    assert step["grad_norm"] > 0 and step["reward/errors"] == 0


def _questions(run, batch):
    by_id = {p.id: p for p in run.prompts.problems}
    return [by_id[i] for i in batch.prompt_ids]


def test_training_on_process_rewards_gives_token_level_advantages(model_dirs):
    from rlcli.ops.advantages import ADVANTAGES, AdvantageInputs
    from rlcli.train.step import collect_batch, train_step

    run = tiny_run(
        "reward=process",
        "algo.advantage=grpo_process",
        f"reward.model_path={model_dirs['prm', 2]}",
        f"reward.step_tag='{TAG}'",
        "reward.step_separator=' '",  # the random policy writes no newlines, but spaces
    )
    batch, scores, _ = collect_batch(run)
    ends = ~batch.step_rewards.isnan()
    assert ends.sum() > len(batch.texts)  # several steps per response on average
    assert not (ends & ~batch.response_mask.bool()).any()
    mask = batch.response_mask
    inputs = AdvantageInputs(
        scores=scores, kl_penalty=torch.zeros(mask.shape), mask=mask,
        group_size=run.cfg.trainer.group_size, prompt_ids=batch.prompt_ids,
        step_rewards=batch.step_rewards,
    )  # fmt: skip
    advantages, _ = ADVANTAGES["grpo_process"](inputs)
    assert advantages.shape == batch.response_mask.shape
    # Per token, not per response: within a row the advantage changes at step ends.
    rows = zip(advantages, batch.response_mask.bool(), strict=True)
    assert any(len(set(row[m].tolist())) > 1 for row, m in rows)
    step = train_step(run)
    assert step["grad_norm"] > 0 and 0 < step["reward/process"] < 1  # mean step probability
