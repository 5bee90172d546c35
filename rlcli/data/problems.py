"""The `Problem` record, rendering its prompt, the seeded training stream, and writing
records back as JSON lines."""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rlcli.config import ConfigError, DataConfig, EnvConfig, SamplerConfig
from rlcli.env import prompt_tools, system_prompt, tool_instructions


@dataclass(frozen=True)
class Problem:
    """One prompt: `id` is stable across runs (DCPO keys its state on it)."""

    id: str
    question: str  # the prompt text (template and instruction applied), before chat rendering
    answer: str  # the ground truth the reward checks against
    # The source record's fields: `reward=python` functions receive them, `rlcli filter` writes
    # them back. Generated problems hold {"question", "answer"} plus their own fields.
    record: dict = field(default_factory=dict, hash=False)
    # The prompt as chat messages, when the data gives it so (TRL's conversational format:
    # system, user and earlier turns, tool calls and tool messages, each message as the data
    # gives it, `data.instruction` added to the last user message); it is rendered whole, and
    # a TRL reward function gets it as its prompt. None: a text prompt.
    conversation: tuple[dict, ...] | None = field(default=None, hash=False)


Splits = tuple[list[Problem], list[Problem]]


def write_jsonl(rows: list[dict], path: str | os.PathLike) -> None:
    """Rows as JSON lines, atomically: to a temporary file in the same directory, then
    renamed over `path`, so a crash never leaves half a file."""
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a dataset is meant to be shared
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(problems: list[Problem], path: str | os.PathLike) -> None:
    """Write the problems' source records as JSON lines (atomically); the result loads again
    with the same adapter and `data.path=<path>`."""
    if Path(path).suffix.lower() != ".jsonl":
        raise ConfigError(
            f"{path}: records are written as JSON lines; use a name ending in .jsonl."
        )
    write_jsonl([p.record for p in problems], path)


# --- prompts for the model ------------------------------------------------------------------------


def render_prompt(
    tokenizer, question: str, system_prompt: str | None, tools: list[dict] | None = None
) -> str:
    """The question as the model's chat template renders a user turn, ready for the reply;
    `tools` (JSON schemas, env.tool_format=chat_template) are declared through the template."""
    messages = [{"role": "user", "content": question}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if tokenizer.chat_template is None:
        return question
    return render_messages(tokenizer, messages, tools)


def render_messages(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """Chat messages as the model's template renders them, ready for the reply. A conversation
    that ends with an assistant message is continued, as TRL does: rendered with
    continue_final_message and no generation prompt, so the model goes on with that turn. A
    model without a template (a base model) gets their contents' text, a blank line apart."""
    if tokenizer.chat_template is None:
        return "\n\n".join(content_text(m.get("content")) for m in messages)
    if any(isinstance(m.get("content"), list) for m in messages) and not takes_parts(tokenizer):
        messages = [_with_text_content(m) for m in messages]
    final = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=not final,
        continue_final_message=final,
    )


# --- message content: text, or a list of text parts (OpenAI's and TRL's form) ---------------------

_PART_PROBE = "rlcli_probe_part"
_TAKES_PARTS: dict[str, bool] = {}  # chat template -> whether it renders a list of text parts


def content_text(content) -> str:
    """A message's content as text: a string as it is, a list of text parts joined without a
    separator (as the chat templates that take parts, Qwen2-VL's or Llama 4's, write them), and
    no content (an assistant turn of tool calls) as ""."""
    if isinstance(content, list):
        return "".join(part["text"] for part in content if part.get("type") == "text")
    return content or ""


def with_text(content, text: str, separator: str):
    """`content` (text or a list of text parts) with `text` added after `separator`: to its last
    text part, or as a new part when it has none. Unchanged when `text` is empty."""
    if not text:
        return content
    if not isinstance(content, list):
        return f"{content}{separator}{text}" if content else text
    parts = list(content)
    texts = [i for i, part in enumerate(parts) if part.get("type") == "text"]
    if not texts:
        return [*parts, {"type": "text", "text": text}]
    last = parts[texts[-1]]
    parts[texts[-1]] = {**last, "text": with_text(last["text"], text, separator)}
    return parts


def takes_parts(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders content given as a list of text parts as
    it renders the same text given as a string. SmolLM2's adds the content to a string, so a
    list fails there: such a template is given each list's text instead."""
    template = str(tokenizer.chat_template)
    if template not in _TAKES_PARTS:

        def render(content) -> str:
            messages = [{"role": "user", "content": content}]
            return tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )

        try:
            as_parts = render([{"type": "text", "text": _PART_PROBE}])
            _TAKES_PARTS[template] = as_parts == render(_PART_PROBE)
        except Exception:  # the template's own error, or Jinja's on adding a list to a string
            _TAKES_PARTS[template] = False
    return _TAKES_PARTS[template]


def _with_text_content(message: dict) -> dict:
    content = message.get("content")
    return {**message, "content": content_text(content)} if isinstance(content, list) else message


def with_system(
    conversation: tuple[dict, ...], system: str | None, instructions: str | None
) -> list[dict]:
    """A conversation with the run's system message: its own system message is kept (the
    data's author chose it over data.system_prompt), with the tools' instructions added to
    it; one without gets the run's (data.system_prompt and the tools' instructions)."""
    messages = [dict(m) for m in conversation]
    if messages[0]["role"] == "system":
        messages[0]["content"] = with_text(messages[0]["content"], instructions or "", "\n\n")
    elif system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


@dataclass(frozen=True)
class PromptRenderer:
    """A problem's prompt as the model's chat template renders it, with the run's system
    message and tools fixed once (`prompt_renderer`): what training, evaluation and the
    commands that sample all send to the sampler."""

    tokenizer: object
    system: str | None  # data.system_prompt, then the tools' instructions
    tools: list[dict] | None = None  # JSON schemas, env.tool_format=chat_template
    instructions: str | None = None  # the tools' instructions alone (rlcli's tool format)

    def __call__(self, question: str) -> str:
        return render_prompt(self.tokenizer, question, self.system, self.tools)

    def prompt(self, problem: Problem) -> str:
        """The problem's prompt: its conversation rendered whole, or its question as a user
        turn."""
        if problem.conversation is None:
            return self(problem.question)
        messages = with_system(problem.conversation, self.system, self.instructions)
        try:
            return render_messages(self.tokenizer, messages, self.tools)
        except Exception as err:  # the template's raise_exception, or a field it cannot write
            raise ConfigError(
                f"The chat template of {self.tokenizer.name_or_path} cannot render the "
                f"conversation of problem {problem.id!r} ({type(err).__name__}: {err}). Use a "
                "model whose template writes what the conversation holds (tool calls and tool "
                "messages: Qwen2.5, Qwen3), or give the prompt without it."
            ) from None


def prompt_renderer(data: DataConfig, env: EnvConfig, tokenizer) -> PromptRenderer:
    """The run's renderer: `data.system_prompt` with the tools' instructions, and the tools'
    schemas where the chat template declares them (a template that cannot take them is
    refused here)."""
    tools = prompt_tools(env, tokenizer)
    system = system_prompt(data.system_prompt, env)
    return PromptRenderer(tokenizer, system, tools, tool_instructions(env))


class PromptStream:
    """Shuffled passes over the training split, seeded; `position` makes resume exact."""

    def __init__(self, problems: list[Problem], seed: int, position: int = 0):
        self.problems, self.seed, self.position = problems, seed, position

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Problem]:
        out, order, order_epoch = [], [], -1
        for _ in range(n):
            epoch, index = divmod(self.position, len(self.problems))
            if epoch != order_epoch:
                order, order_epoch = self._order(epoch), epoch
            out.append(self.problems[order[index]])
            self.position += 1
        return out


def fit_prompts(
    sampler: SamplerConfig,
    data_name: str,
    render: PromptRenderer,
    problems: list[Problem],
    split: str,
) -> list[Problem]:
    """`problems` whose rendered prompt fits sampler.max_prompt_tokens; a longer one is an
    error unless sampler.long_prompts=drop, which drops it with a count. An empty list (no
    held-out split: data.num_test=0) is returned as it is."""
    if not problems:
        return problems  # a tokenizer given no text fails rather than returning nothing
    s, tokenizer = sampler, render.tokenizer
    rendered = [render.prompt(p) for p in problems]
    lengths = [len(ids) for ids in tokenizer(rendered, add_special_tokens=False).input_ids]
    too_long = [i for i, n in enumerate(lengths) if n > s.max_prompt_tokens]
    if not too_long:
        return problems
    longest = max(too_long, key=lengths.__getitem__)
    if s.long_prompts == "error":
        raise ConfigError(
            f"{len(too_long)} of {len(problems)} {split} prompts of data={data_name} are "
            f"longer than sampler.max_prompt_tokens={s.max_prompt_tokens} (the longest, "
            f"{problems[longest].id!r}, has {lengths[longest]} tokens with the chat template). "
            "Raise sampler.max_prompt_tokens (with sampler.max_model_len on vLLM), or drop "
            "them with sampler.long_prompts=drop."
        )
    print(
        f"rlcli: dropped {len(too_long)} of {len(problems)} {split} prompts longer than "
        f"sampler.max_prompt_tokens={s.max_prompt_tokens}."
    )
    drop = set(too_long)
    kept = [p for i, p in enumerate(problems) if i not in drop]
    if not kept:
        limit = s.max_prompt_tokens
        raise ConfigError(f"No {split} prompt fits in sampler.max_prompt_tokens={limit}.")
    return kept
