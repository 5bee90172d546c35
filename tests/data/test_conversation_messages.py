"""Chat messages in a user's data kept whole: every field a chat template reads (an assistant's
tool calls with null content, a tool message's name and tool_call_id, content as a list of text
parts) goes from the data file through the chat template to samples.jsonl and `rlcli eval`
unchanged; what a template cannot render, and prompts and answers of the wrong type, are
refused with the row and the field named. A conversation that ends with an assistant message
is continued, as TRL does."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.config import ConfigError
from rlcli.data import load_splits
from rlcli.data.pairs import pair_from_record
from rlcli.data.problems import Problem, prompt_renderer, render_messages
from rlcli.rewards.conventions import trl_prompt_and_completion
from rlcli.runtime.models import load_tokenizer
from rlcli.validate import compose, section
from tests.data.test_conversations import data_section, write_jsonl

# What SmolLM2's template (the tiny model's) puts first when a conversation has no system turn.
SMOL_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n"
)

# A ChatML template written for this test that renders every field rlcli passes through:
# content as text or as text parts, an assistant's tool calls as JSON, and a tool message's
# name and tool_call_id. (SmolLM2's own adds content to a string, so it has no tool support.)
TOOL_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role }}"
    "{%- if m.role == 'tool' %}{{- ' name=' + m.name + ' id=' + m.tool_call_id }}{%- endif %}"
    "{{- '\\n' }}"
    "{%- if m.content is string %}{{- m.content }}"
    "{%- elif m.content %}{%- for part in m.content %}{{- part.text }}{%- endfor %}"
    "{%- endif %}"
    "{%- for call in m.tool_calls or [] %}"
    "{{- '<tool_call>' + (call.function | tojson) + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tool_conversation(i: int) -> list[dict]:
    """A conversation with every kind of message: a system message, a question answered by a
    tool call (content null), the tool's reply, then a new question."""
    call = {"name": "add", "arguments": {"a": 2, "b": 3}}
    return [
        {"role": "system", "content": "You add numbers with the add tool."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "content": "5", "tool_call_id": "call_1", "name": "add"},
        {"role": "user", "content": f"And 5 + {i}?"},
    ]  # fmt: skip


def load_one(tmp_path: Path, record: dict, **values) -> Problem:
    train, _ = load_splits(data_section(write_jsonl(tmp_path / "d.jsonl", [record]), **values))
    return train[0]


def refusal(tmp_path: Path, records: list[dict], **values) -> str:
    """The ConfigError's message for `records` as a data file, with `{path}` for its path."""
    path = write_jsonl(tmp_path / "d.jsonl", records)
    with pytest.raises(ConfigError) as err:
        load_splits(data_section(path, **values))
    return str(err.value).replace(str(path), "{path}")


def rlcli(command: str, cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "rlcli", command, *overrides]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def tool_model(tiny_model_dir, tmp_path) -> Path:
    """The tiny model with TOOL_TEMPLATE as its chat template."""
    model = tmp_path / "tool_model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return model


def test_a_tool_conversation_survives_file_template_samples_and_eval_unchanged(
    tmp_path, tool_model
):
    records = [{"prompt": tool_conversation(i), "solution": 5 + i} for i in range(6)]
    write_jsonl(tmp_path / "tools.jsonl", records)
    data = ["data=jsonl", "data.path=tools.jsonl", "data.prompt_field=prompt",
            "data.answer_field=solution", "data.num_test=2"]  # fmt: skip
    tiny = ["model=tiny", f"model.path={tool_model}", "sampler=hf", "sampler.max_new_tokens=4",
            "logger.progress=false"]  # fmt: skip

    # The rendered prompt is exactly the tokenizer's own rendering of the file's messages.
    cfg = compose([*tiny, *data])
    cfg.data.path = str(tmp_path / "tools.jsonl")
    train, test = load_splits(cfg.data)
    problem = train[0]
    row = int(problem.id.rsplit("-", 1)[1])
    assert list(problem.conversation) == records[row]["prompt"]
    tokenizer = load_tokenizer(str(tool_model))
    rendered = prompt_renderer(cfg.data, cfg.env, tokenizer).prompt(problem)
    own = tokenizer.apply_chat_template(
        records[row]["prompt"], add_generation_prompt=True, tokenize=False
    )
    assert rendered == own
    # ... in which the template did write the call and the tool message's fields.
    assert '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}' in own
    assert "<|im_start|>tool name=add id=call_1\n5<|im_end|>" in own
    assert problem.question == f"And 5 + {row}?" and problem.answer == str(5 + row)

    # Training writes each sample's conversation, message for message as the file holds it.
    done = rlcli("train", tmp_path, *tiny, *data, "trainer.max_steps=1",
                 "trainer.prompts_per_step=2", "trainer.group_size=2", "reward=space_rate",
                 f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    samples = jsonl(tmp_path / "run" / "samples.jsonl")
    assert len(samples) == 4
    for sample in samples:
        row = int(sample["problem_id"].rsplit("-", 1)[1])
        assert sample["conversation"] == records[row]["prompt"]
        assert sample["prompt"] == f"And 5 + {row}?"

    # So does `rlcli eval`, for each held-out problem.
    done = rlcli("eval", tmp_path, *tiny, *data, "reward=space_rate", "eval.k=1",
                 f"hydra.run.dir={tmp_path / 'eval'}")  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    evaluated = jsonl(tmp_path / "eval" / "eval_samples.jsonl")
    assert [r["problem_id"] for r in evaluated] == [p.id for p in test]
    for record in evaluated:
        row = int(record["problem_id"].rsplit("-", 1)[1])
        assert record["conversation"] == records[row]["prompt"]


def rendered(tiny_model_dir, problem: Problem) -> str:
    cfg = compose(["model=tiny", "sampler=hf"])
    return prompt_renderer(cfg.data, cfg.env, load_tokenizer(tiny_model_dir)).prompt(problem)


def test_content_as_text_parts_is_kept_and_rendered_as_its_text(tmp_path, tiny_model_dir):
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+3?"}]
    problem = load_one(tmp_path, {"prompt": [{"role": "user", "content": parts}], "solution": 5})
    assert problem.conversation == ({"role": "user", "content": parts},)  # as data, whole
    assert problem.question == "What is 2+3?" and problem.answer == "5"
    # SmolLM2's template cannot take parts: it is given their text.
    expected = f"{SMOL_SYSTEM}<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert rendered(tiny_model_dir, problem) == expected


class RecordingTokenizer:
    """A tokenizer whose template takes text parts, keeping what it was given to render."""

    name_or_path = "recording"
    chat_template = "renders parts"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, **kwargs) -> str:
        self.calls.append((messages, kwargs))
        return "".join(m["content"] if isinstance(m["content"], str) else
                       "".join(p["text"] for p in m["content"]) for m in messages)  # fmt: skip


def test_a_template_that_takes_text_parts_is_given_the_messages_untouched():
    tokenizer = RecordingTokenizer()
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi."}]}]
    assert render_messages(tokenizer, messages) == "Hi."
    assert tokenizer.calls[-1] == (
        messages,
        {"tools": None, "tokenize": False, "add_generation_prompt": True,
         "continue_final_message": False},
    )  # fmt: skip


def test_the_instruction_goes_to_the_last_text_part_or_a_new_one(tmp_path):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+3?"}]
    record = {"prompt": [{"role": "user", "content": parts}], "solution": "5"}
    problem = load_one(tmp_path, record, instruction="Be quick.")
    assert problem.conversation[0]["content"] == [
        {"type": "text", "text": "What is"},
        {"type": "text", "text": "2+3? Be quick."},
    ]
    assert problem.question == "What is2+3? Be quick."
    assert parts[1]["text"] == "2+3?"  # the record itself is left as the file gave it
    empty = {"prompt": [{"role": "user", "content": []}], "solution": "5"}
    problem = load_one(tmp_path, empty, instruction="Be quick.")
    assert problem.conversation[0]["content"] == [{"type": "text", "text": "Be quick."}]


def test_a_final_assistant_message_is_continued(tmp_path, tiny_model_dir):
    record = {
        "prompt": [
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "The answer is"},
        ],
        "solution": "5",
    }
    problem = load_one(tmp_path, record)
    assert problem.question == "What is 2+3?"
    # No end of turn and no generation prompt: the model goes on with "The answer is".
    assert rendered(tiny_model_dir, problem) == (
        f"{SMOL_SYSTEM}<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is"
    )
    # A TRL reward function is given it as TRL gives it: the prompt without that message, and
    # its text at the start of the completion.
    prompt, completion = trl_prompt_and_completion(problem.question, " 5.", problem.conversation)
    assert prompt == [{"role": "user", "content": "What is 2+3?"}]
    assert completion == [{"role": "assistant", "content": "The answer is 5."}]


def test_a_template_that_cannot_render_the_conversation_is_a_config_error(tmp_path, tiny_model_dir):
    problem = load_one(tmp_path, {"prompt": tool_conversation(4), "solution": 9})
    with pytest.raises(ConfigError) as err:
        rendered(tiny_model_dir, problem)
    assert str(err.value).startswith(
        f"The chat template of {tiny_model_dir} cannot render the conversation of problem "
        "'jsonl-train-0' (TypeError: can only concatenate str (not \"NoneType\") to str)."
    )


def test_dedupe_compares_whole_messages(tmp_path):
    other = tool_conversation(4)
    other[2]["tool_calls"][0]["function"]["arguments"] = {"a": 3, "b": 2}
    records = [{"prompt": p, "solution": 9} for p in (tool_conversation(4), other)]
    train, _ = load_splits(data_section(write_jsonl(tmp_path / "d.jsonl", records * 2),
                                        dedupe=True))  # fmt: skip
    assert [p.id for p in train] == ["jsonl-train-0", "jsonl-train-1"]


def test_a_pair_keeps_its_prompts_tool_calls(tmp_path):
    cfg = section("data", "pairs", path=str(tmp_path / "p.jsonl"))
    record = {"prompt": tool_conversation(1), "chosen": "6", "rejected": "7"}
    pair = pair_from_record(record, "p-0", cfg, "row 0")
    assert pair.prompt == tool_conversation(1) and (pair.chosen, pair.rejected) == ("6", "7")


def user(content) -> dict:
    return {"role": "user", "content": content}


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([user("Hi"), {"role": "usr", "content": "2+3?"}],
         'In row 1 of data.path={path}, prompt.1.role is a string ("usr"), which is not a chat '
         "role: the valid roles are system, user, assistant, tool."),
        ([user([{"type": "image", "image": "x.png"}])],
         'In row 1 of data.path={path}, prompt.0.content.0.type is a string ("image"): the only '
         'valid content part is {"type": "text", "text": "..."}, as rlcli trains language '
         "models on text (an image or audio part would be lost); drop the part or give its "
         "text."),
        ([user("Hi"), {"role": "assistant", "content": None, "tool_calls": {"name": "add"}},
          user("Go")],
         'In row 1 of data.path={path}, prompt.1.tool_calls is an object ({"name": "add"}); '
         "tool_calls is a list of calls, each an object: [{\"type\": \"function\", "
         '"function": {"name": ..., "arguments": {...}}}].'),
        ([user("Hi"), "2+3?"],
         'In row 1 of data.path={path}, prompt.1 is a string ("2+3?"), not a chat message; give '
         'each message as an object: {"role": "user", "content": "..."}.'),
        ([{"role": "user"}],
         "In row 1 of data.path={path}, prompt.0.content is missing; only an assistant message "
         "with tool_calls may have no content: give the message its text, or a list of text "
         "parts."),
        ([{"role": "system", "content": "Be brief."}],
         "In row 1 of data.path={path}, data.prompt_field=prompt is a list with no user "
         "message; set data.prompt_field to the prompt text or messages."),
        ([user("Hi"), {"role": "assistant", "content": None,
                       "tool_calls": [{"type": "function", "function": {"name": "add"}}]}],
         "In row 1 of data.path={path}, the conversation ends with an assistant message "
         "(prompt.1) that holds no text to continue (tool calls, or empty content). End it "
         "with the user or tool message the model replies to, or an assistant message whose "
         "text the model goes on with."),
    ],
    ids=["unknown role", "image part", "tool_calls not a list", "message not an object",
         "no content", "no user message", "final tool call"],
)  # fmt: skip
def test_a_message_the_template_cannot_render_is_refused_naming_row_and_field(
    tmp_path, prompt, message
):
    records = [{"prompt": [user("1+1?")], "solution": "2"}, {"prompt": prompt, "solution": "5"}]
    assert refusal(tmp_path, records) == message


def test_a_null_prompt_is_named_null_in_its_row(tmp_path):
    records = [{"prompt": "1+1?", "solution": "2"}, {"prompt": None, "solution": "5"}]
    assert refusal(tmp_path, records) == (
        "The field 'prompt' (data.prompt_field) is null in row 1 of data.path={path} (fields "
        "present: solution); a row without the field, where other rows have it, reads as null "
        "too. Give every record a value there, or drop the records without one."
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [({"text": "1+1?"}, 'an object ({"text": "1+1?"})'), (True, "a boolean (true)"),
     (12, "a number (12)")],
)  # fmt: skip
def test_a_prompt_that_is_neither_text_nor_messages_is_refused(tmp_path, value, shown):
    records = [{"prompt": value, "solution": "2"}] * 2
    assert refusal(tmp_path, records) == (
        f"In row 0 of data.path={{path}}, data.prompt_field=prompt is {shown}, not a prompt: a "
        "prompt is text or a list of chat messages; point data.prompt_field at the field that "
        "holds it (a dotted path reaches into a nested record), or give data.template."
    )


def test_numeric_answers_are_kept_as_text(tmp_path):
    records = [{"prompt": "1+1?", "solution": 2}, {"prompt": "1/4?", "solution": 0.25}]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    train, _ = load_splits(data_section(path))
    assert [p.answer for p in train] == ["2.0", "0.25"]  # one column: JSON's numbers as floats
    path = write_jsonl(tmp_path / "i.jsonl", records[:1] * 2)
    assert [p.answer for p in load_splits(data_section(path))[0]] == ["2", "2"]


@pytest.mark.parametrize(
    ("value", "message"),
    [(None, "The field 'solution' (data.answer_field) is null in row 0 of data.path={path}"),
     (["5"], 'In row 0 of data.path={path}, data.answer_field=solution is a list (["5"]), not an '
             "answer: an answer is text or a number; point data.answer_field at the field that "
             "holds it (a dotted path reaches into a nested record, e.g. "
             "reward_model.ground_truth).")],
)  # fmt: skip
def test_a_null_or_list_answer_is_refused(tmp_path, value, message):
    assert refusal(tmp_path, [{"prompt": "2+3?", "solution": value}] * 2).startswith(message)
