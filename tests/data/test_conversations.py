"""A TRL user's conversational data, end to end: a prompt that is a list of chat messages is
rendered whole (its system message and earlier turns kept), TRL-style reward functions get the
prompts and completions as messages with completion_ids and trainer_state, and samples.jsonl
and eval_samples.jsonl keep the conversation. Also prompt-only data (data.answer_field=null),
CSV files and datasets' save_to_disk folders."""

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch

from rlcli.config import ConfigError
from rlcli.data import load_splits
from rlcli.data.problems import Problem, prompt_renderer
from rlcli.rewards.scorer import Sample, Scorer
from rlcli.runtime.models import load_tokenizer
from rlcli.validate import compose, section

SYSTEM = "You are a terse calculator. Reply with digits only."


def conversation(i: int) -> list[dict]:
    """TRL's conversational prompt: a system message, an earlier exchange, the question."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": f"What is {i} + {i}?"},
    ]


RECORDS = [{"prompt": conversation(i), "solution": str(2 * i)} for i in range(10)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def data_section(path: Path, **values):
    values = {"prompt_field": "prompt", "answer_field": "solution", **values}
    return section("data", "jsonl", path=str(path), **values)


def test_a_conversation_is_kept_whole_with_the_instruction_on_the_last_user_turn(tmp_path):
    cfg = data_section(write_jsonl(tmp_path / "chat.jsonl", RECORDS), instruction="Be quick.")
    train, _ = load_splits(cfg)
    problem = next(p for p in train if p.answer == "6")
    assert [m["role"] for m in problem.conversation] == ["system", "user", "assistant", "user"]
    assert problem.conversation[-1]["content"] == "What is 3 + 3? Be quick."
    assert problem.conversation[1]["content"] == "What is 1 + 1?"  # earlier turns untouched
    assert problem.question == "What is 3 + 3? Be quick."  # the text: its last user turn


def test_dedupe_tells_conversations_apart_by_more_than_their_last_turn(tmp_path):
    other = [{"role": "system", "content": "Answer in French."}, conversation(3)[-1]]
    records = [RECORDS[3], {"prompt": other, "solution": "6"}, RECORDS[3]]
    train, _ = load_splits(data_section(write_jsonl(tmp_path / "d.jsonl", records), dedupe=True))
    assert len(train) == 2  # the repeat goes, the conversation with its own system stays


def rendered(tiny_model_dir, problem: Problem, *overrides: str) -> str:
    cfg = compose(["model=tiny", "sampler=hf", *overrides])
    return prompt_renderer(cfg.data, cfg.env, load_tokenizer(tiny_model_dir)).prompt(problem)


def test_the_prompt_rendered_holds_the_system_message_and_earlier_turns(tiny_model_dir):
    problem = Problem("c-0", "What is 3 + 3?", "6", {}, tuple(conversation(3)))
    text = rendered(tiny_model_dir, problem, "data.system_prompt=Ignored here.")
    # The data's own system message wins over data.system_prompt, and every turn is there,
    # in order, ready for the assistant's reply.
    assert SYSTEM in text and "Ignored here." not in text
    order = [text.index(s) for s in (SYSTEM, "What is 1 + 1?", "2<|im_end|>", "What is 3 + 3?")]
    assert order == sorted(order)
    assert text.endswith("<|im_start|>assistant\n")
    # Without a system message of its own, the run's is put first.
    bare = Problem("c-1", "What is 3 + 3?", "6", {}, tuple(conversation(3)[1:]))
    text = rendered(tiny_model_dir, bare, "data.system_prompt=Be brief.")
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    # With rlcli's tools on, their instructions join the conversation's own system message.
    text = rendered(tiny_model_dir, problem, "env=calculator")
    assert SYSTEM in text and "calculator" in text.split("<|im_end|>")[0]


def test_a_lone_user_message_renders_as_the_same_question_as_text(tiny_model_dir):
    as_text = Problem("t", "What is 3 + 3?", "6")
    as_chat = Problem(
        "t", "What is 3 + 3?", "6", {}, ({"role": "user", "content": "What is 3 + 3?"},)
    )
    for overrides in ([], ["data.system_prompt=Be brief."]):
        assert rendered(tiny_model_dir, as_chat, *overrides) == rendered(
            tiny_model_dir, as_text, *overrides
        )


# TRL's documented kinds of reward function, written here for conversational data: each
# reads completion[0]["content"], one the prompt's messages, one the token ids and one the
# trainer's progress.
TRL_CHAT_REWARDS = """
import re


def digits_only(completions, **kwargs):
    return [1.0 if re.fullmatch(r"\\s*\\d+\\s*", c[0]["content"]) else 0.0 for c in completions]


def right_sum(prompts, completions, solution, **kwargs):
    assert prompts[0][0]["role"] == "system" and prompts[0][-1]["role"] == "user"
    return [float(s in c[0]["content"]) for c, s in zip(completions, solution)]


def short(completions, completion_ids, **kwargs):
    return [-len(ids) / 8 for ids in completion_ids]


def progress(completions, trainer_state, **kwargs):
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)
"""


def chat_sample(i: int, response: str, ids: list[int]) -> Sample:
    convo = conversation(i)
    record = {"prompt": convo, "solution": str(2 * i)}
    return Sample(convo[-1]["content"], response, str(2 * i), record, len(ids), f"c-{i}",
                  torch.tensor(ids), conversation=convo)  # fmt: skip


def test_trl_reward_functions_get_messages_token_ids_and_the_trainer_state(tmp_path):
    (tmp_path / "chat_rewards.py").write_text(TRL_CHAT_REWARDS)
    functions = [f"{tmp_path}/chat_rewards.py:{n}" for n in ("digits_only", "right_sum", "short",
                                                              "progress")]  # fmt: skip
    cfg = compose(["model=tiny", "reward=python", f"reward.function=[{','.join(functions)}]"])
    scorer = Scorer(cfg.reward, 8, torch.device("cpu"), "float32")
    try:
        scorer.at_step(3, 12)
        samples = [chat_sample(2, " 4", [19, 20]), chat_sample(3, "It is 7.", [5, 6, 7, 8])]
        scores = scorer.score(samples)
    finally:
        scorer.close()
    assert scores.errors == []
    got = {name: values.tolist() for name, values in scores.components.items()}
    assert got == {
        "digits_only": [1.0, 0.0],
        "right_sum": [1.0, 0.0],
        "short": [-0.25, -0.5],
        "progress": [0.25, 0.25],
    }


def test_rlcli_convention_keeps_text_prompts_for_conversational_data(tmp_path):
    (tmp_path / "own.py").write_text(
        "def own(prompts, responses, answers):\n"
        "    return [float(isinstance(p, str) and p.endswith('?')) for p in prompts]\n"
    )
    cfg = compose(["model=tiny", "reward=python", f"reward.function={tmp_path}/own.py:own"])
    scorer = Scorer(cfg.reward, 8, torch.device("cpu"), "float32")
    try:
        scores = scorer.score([chat_sample(2, "4", [1])])
    finally:
        scorer.close()
    assert scores.total.tolist() == [1.0]


def rlcli(command: str, cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "rlcli", command, *overrides]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_conversational_prompt_only_data_trains_and_keeps_the_conversation(tmp_path):
    # No answer column: the reward reads only the completions (data.answer_field=null).
    records = [{"prompt": conversation(i)} for i in range(12)]
    write_jsonl(tmp_path / "chat.jsonl", records)
    (tmp_path / "chat_rewards.py").write_text(TRL_CHAT_REWARDS)
    run_dir = tmp_path / "run"
    done = rlcli(
        "train", tmp_path, "model=tiny", "sampler=hf", "trainer.max_steps=2",
        "trainer.prompts_per_step=2", "trainer.group_size=2", "sampler.max_new_tokens=6",
        "logger.progress=false", "data=jsonl", "data.path=chat.jsonl", "data.prompt_field=prompt",
        "data.answer_field=null", "data.num_test=2", "trainer.eval_every=2", "eval.k=1",
        "reward=python", "reward.function=[chat_rewards.py:digits_only,chat_rewards.py:progress]",
        f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    console = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in console, console[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/errors"] for r in rows] == [0, 0]  # messages, not strings: no failure
    assert [r["reward/progress"] for r in rows] == [0.0, 0.5]  # global_step 0 then 1, of 2
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["conversation"][0] == {"role": "system", "content": SYSTEM} for s in samples)
    assert all(s["conversation"][-1]["content"] == s["prompt"] for s in samples)
    assert all(s["answer"] == "" for s in samples)
    # The held-out evaluation at step 2 keeps it too.
    evaluated = [
        json.loads(line) for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()
    ]
    assert len(evaluated) == 2
    assert all(r["conversation"][0]["content"] == SYSTEM for r in evaluated)


def test_prompt_only_data_with_a_reward_that_needs_an_answer_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}])
    done = rlcli(
        "train", tmp_path, "model=tiny", "data=jsonl", f"data.path={path}",
        "data.prompt_field=prompt", "data.answer_field=null", "reward=math",
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    message = " ".join((done.stdout + done.stderr).split())
    assert "data.answer_field=null" in message and "'math'" in message
    assert "format" in message  # a valid choice named


def test_prompt_only_records_have_no_answer(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Say {i}."} for i in range(3)])
    train, _ = load_splits(data_section(path, answer_field=None))
    assert [p.answer for p in train] == ["", "", ""] and train[0].conversation is None


def test_a_csv_file_is_read(tmp_path):
    path = tmp_path / "sums.csv"
    path.write_text("question,answer\n" + "".join(f'"What is {i}, plus {i}?",{2 * i}\n'
                                                   for i in range(4)))  # fmt: skip
    train, _ = load_splits(section("data", "jsonl", path=str(path)))
    assert [(p.question, p.answer) for p in train][1] == ("What is 1, plus 1?", "2")


def test_save_to_disk_folders_are_read_a_dataset_and_a_dataset_dicts_splits(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)]
    split = datasets.Dataset.from_list(rows)
    split.save_to_disk(tmp_path / "one")
    datasets.DatasetDict({"train": split, "test": split.select(range(2))}).save_to_disk(
        tmp_path / "both"
    )
    train, _ = load_splits(section("data", "jsonl", path=str(tmp_path / "one")))
    assert [p.answer for p in train] == [r["answer"] for r in rows]
    cfg = section("data", "jsonl", path=str(tmp_path / "both"), test_path=str(tmp_path / "both"))
    train, test = load_splits(cfg)
    assert (len(train), len(test)) == (6, 2)
    # A DatasetDict without the split asked for names the ones it has.
    datasets.DatasetDict({"validation": split}).save_to_disk(tmp_path / "val")
    with pytest.raises(ConfigError, match="holds the splits validation, not 'train'"):
        load_splits(section("data", "jsonl", path=str(tmp_path / "val")))
