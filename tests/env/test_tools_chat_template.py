"""env.tool_format=chat_template: the tools declared through the model's chat template and its
calls read in the template's format (Qwen2.5/Qwen3's `<tool_call>{json}</tool_call>`).

Nothing can be downloaded where the tests run, so no Qwen tokenizer is at hand: the template
in Qwen2.5's tool-calling format is written in tests/fixtures/tool_chat_template.jinja and set
on the tiny model's tokenizer. Every parse below reads text that this real template rendered.
"""

import contextlib
import io
import math
import shutil

import pytest

from rlcli.config import ConfigError
from rlcli.data.problems import render_prompt
from rlcli.env.chat_template import TemplateCalls, template_calls, tool_schemas
from rlcli.env.tools import Toolbox
from rlcli.runtime.models import load_tokenizer, smollm2_dir
from rlcli.validate import compose, section
from tests.conftest import FIXTURES

TEMPLATE = FIXTURES / "tool_chat_template.jinja"
CALL = {"name": "calculator", "arguments": {"expression": "12345 * 6789"}}


def tool_tokenizer(model_dir):
    """The tiny model's tokenizer (SmolLM2's vocabulary) with the Qwen-style template."""
    tokenizer = load_tokenizer(model_dir)
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


def assistant_turn(tokenizer, tool_calls, content="") -> str:
    """What the template writes for an assistant turn holding `tool_calls`, between its
    header and the end of the turn: what the model is to generate."""
    messages = [
        {"role": "user", "content": "What is 12345 * 6789?"},
        {"role": "assistant", "content": content, "tool_calls": tool_calls},
    ]
    tools = tool_schemas(["calculator"])
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    return text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")


def test_the_templates_call_tags_are_read_from_the_template_and_the_tools_declared(
    tiny_model_dir,
):
    tokenizer = tool_tokenizer(tiny_model_dir)
    assert template_calls(tokenizer) == TemplateCalls("<tool_call>", "</tool_call>")
    schemas = tool_schemas(["calculator", "python"])
    assert [s["function"]["name"] for s in schemas] == ["calculator", "python"]
    assert schemas[0]["function"]["parameters"]["required"] == ["expression"]
    declared = render_prompt(tokenizer, "What is 2 * 3?", "Be brief.", schemas)
    bare = render_prompt(tokenizer, "What is 2 * 3?", "Be brief.")
    assert declared != bare and declared.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '{"type": "function", "function": {"name": "calculator", ' in declared
    assert '"name": "python"' in declared and declared.endswith("<|im_start|>assistant\n")


def test_a_call_as_the_template_writes_it_is_parsed_and_run(tiny_model_dir):
    tokenizer = tool_tokenizer(tiny_model_dir)
    calls = template_calls(tokenizer)
    written = assistant_turn(tokenizer, [{"type": "function", "function": CALL}])
    assert written == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12345 * 6789"}}\n'
        "</tool_call>"
    )
    assert calls.parse(written) == ("calculator", {"expression": "12345 * 6789"})
    # Words before the call, as a model writes them, are no part of it.
    said = assistant_turn(tokenizer, [CALL], content="Let me compute.")
    assert said.startswith("Let me compute.\n<tool_call>")
    assert calls.parse(said) == ("calculator", {"expression": "12345 * 6789"})

    box = Toolbox(section("env", "calculator", tool_format="chat_template"), calls)
    done = box.call(said)
    assert (done.tool, done.input, done.result.text) == ("calculator", "12345 * 6789", "83810205")
    # A call with the arguments as a JSON string, or under another single key, still runs.
    assert box.call('<tool_call>{"name": "calculator", "arguments": "{\\"x\\": \\"6*7\\"}"}'
                    "</tool_call>").result.text == "42"  # fmt: skip
    # What the model reads back when its call is wrong.
    for bad, says in [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not JSON"),
        ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', 'names no tool under "name"'),
        ('<tool_call>{"name": "abacus", "arguments": {"x": "1"}}</tool_call>', "no tool named"),
        ('<tool_call>{"name": "calculator", "arguments": {"a": "1", "b": "2"}}</tool_call>',
         "calculator takes one argument, 'expression'"),
        ("no call here</tool_call>", "no <tool_call> came before </tool_call>"),
    ]:  # fmt: skip
        result = box.call(bad).result
        assert result.error and says in result.text, (bad, result.text)


def test_a_template_without_tool_support_is_refused_naming_the_model_and_the_way_out(tmp_path):
    """SmolLM2-135M-Instruct's template renders a prompt alike with and without tools=[...]:
    exit 2, before the model loads, naming the model and env.tool_format=rlcli."""
    from rlcli.cli import main

    with pytest.raises(ConfigError, match="SmolLM2-135M-Instruct has no tool support"):
        template_calls(load_tokenizer(str(smollm2_dir())))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as exit_:
            main(["train", "env=calculator", "env.tool_format=chat_template",
                  f"hydra.run.dir={tmp_path}"])  # fmt: skip
    message = " ".join(err.getvalue().split())
    assert exit_.value.code == 2 and "Traceback" not in message, message
    assert "SmolLM2-135M-Instruct has no tool support" in message
    assert "set env.tool_format=rlcli" in message


def test_a_short_real_episode_run_in_the_templates_format(tiny_model_dir, tmp_path):
    """The tiny model with the template, sampler=hf: its prompts declare the tools through
    the template, its episodes run and train (the random model writes no call; the episode
    mechanics with calls in this format are tests/env/test_env.py's)."""
    from rlcli.train.run import setup
    from rlcli.train.step import train_step

    model_dir = tmp_path / "tiny-tools"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text(TEMPLATE.read_text())
    cfg = compose([
        "model=tiny", f"model.path={model_dir}", "sampler=hf", "env=calculator",
        "env.tool_format=chat_template", "trainer.prompts_per_step=2", "trainer.group_size=2",
        "sampler.max_new_tokens=8", "env.max_tokens=32", "logger.progress=false",
    ])  # fmt: skip
    run = setup(cfg)
    assert run.sampler.calls == TemplateCalls("<tool_call>", "</tool_call>")
    collected = run.collector.next_batch()
    batch = collected.rollout
    prompt = run.tokenizer.decode(batch.input_ids[0, : batch.prompt_width])
    assert '"name": "calculator"' in prompt and "<tools>" in prompt
    assert "<tool>NAME</tool>" not in prompt  # rlcli's instructions are not added
    assert len(batch.episodes) == 4 and all(e["turns"][0]["trained"] for e in batch.episodes)
    trained = [e["trained_tokens"] for e in batch.episodes]
    assert trained == batch.response_mask.sum(-1).tolist()
    metrics = train_step(run)
    assert math.isfinite(metrics["loss/policy"]) and metrics["env/turns_mean"] >= 1
