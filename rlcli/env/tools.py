"""The tools a model may call, `TOOLS`, and the `Toolbox` an episode calls them through.

Every tool is a callable `str -> ToolResult` (the call's argument text in, text out) with a
time limit and an output size limit: `calculator` (arithmetic parsed by `ast`, never
evaluated as Python), `search` (BM25 over `env.corpus`, with bm25s), `python` (code in the
sandbox of `env.sandbox`), and a user's function named `file.py:fn` (run in a process of its
own, with the same time and output limits; the user's own code, so not sandboxed). A tool
takes one argument text: an rlcli call gives it as written, a chat template's JSON call under
the tool's argument name (`ToolSpec.argument`; a user function's first parameter).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import operator
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rlcli.config import ConfigError, EnvConfig
from rlcli.env.calls import RLCLI_CALLS, CallFormat, ToolCall, ToolResult
from rlcli.env.sandbox import (
    SANDBOXES,
    check_function,
    run_function,
    run_python,
    sandbox_problem,
)

# --- calculator -------------------------------------------------------------------------------

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
# Bounds that keep one expression from taking seconds or gigabytes (9**9**9 would).
MAX_EXPONENT, MAX_DIGITS = 1000, 1000
# Levels of nesting (signs, operators and the brackets around them) an expression may have:
# `_value` recurses once a level, and 1,000 dashes before a number passed Python's limit.
MAX_DEPTH = 200


def _value(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
            # Checked before computing: (10**999)**1000 would take minutes and gigabytes.
            if abs(left) > 1 and right > 0 and right * math.log10(abs(left)) > MAX_DIGITS:
                raise ValueError(f"result has more than {MAX_DIGITS} digits")
        result = _OPS[type(node.op)](left, right)
        if isinstance(result, int) and abs(result) >= 10**MAX_DIGITS:
            raise ValueError(f"result has more than {MAX_DIGITS} digits")
        return result
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {ast.dump(node)[:40]}")


def _depth(node: ast.AST) -> int:
    """How deep the tree under `node` goes, walked without recursion."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def calculator(expression: str) -> ToolResult:
    """The value of an arithmetic expression (× and ^ read as * and **), exact for integers."""
    text = expression.replace("×", "*").replace("^", "**").replace(",", "").strip()
    try:
        tree = ast.parse(text, mode="eval").body
        if _depth(tree) > MAX_DEPTH:
            raise ValueError(f"the expression nests more than {MAX_DEPTH} levels deep")
        value = _value(tree)
    # Any: besides a SyntaxError or a ZeroDivisionError, ast.parse raises RecursionError on
    # 100,000 terms, and the rest of the run must not hear of it.
    except Exception as err:
        return ToolResult(f"Error: {type(err).__name__}: {err}", error=True)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return ToolResult(str(value) if not isinstance(value, float) else repr(value))


# --- search -----------------------------------------------------------------------------------


class Search:
    """BM25 over a .jsonl corpus of {"text", optional "title"}: the best documents for a query."""

    def __init__(self, corpus: str, top_k: int):
        bm25s = _bm25s()
        self.bm25s, self.top_k = bm25s, top_k
        self.docs = [json.loads(line) for line in Path(corpus).read_text().splitlines() if line]
        texts = [f"{d.get('title', '')} {d['text']}" for d in self.docs]
        self.index = bm25s.BM25(backend="numpy")
        self.index.index(self._tokens(texts), show_progress=False)

    def _tokens(self, texts: list[str]):
        return self.bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def __call__(self, query: str) -> ToolResult:
        tokens = self._tokens([query])
        if not tokens.vocab:  # nothing but stop words
            return ToolResult("No results.")
        k = min(self.top_k, len(self.docs))
        found, scores = self.index.retrieve(tokens, k=k, show_progress=False)
        hits = [self.docs[i] for i, s in zip(found[0], scores[0], strict=True) if s > 0]
        lines = [f"[{n}] {d.get('title', '')}: {d['text']}" for n, d in enumerate(hits, 1)]
        return ToolResult("\n".join(lines) or "No results.")


def _bm25s():
    """bm25s, imported without numba: it loads numba when it can, and numba's llvmlite leaves
    objects in the process's modules that make vLLM's kernel registration fail the next time
    an engine starts in this process (a sweep's next job, the tests). Its numpy backend is
    what a local corpus needs."""
    if "bm25s" in sys.modules or "numba" in sys.modules:
        import bm25s

        return bm25s
    sys.modules["numba"] = None  # `import numba` raises ImportError while this stands
    try:
        import bm25s
    finally:
        del sys.modules["numba"]
    return bm25s


# How a model may write its calls (env.tool_format).
TOOL_FORMATS = ("rlcli", "chat_template")

# --- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    what: str  # what the tool does, as the model is told
    argument: str  # the name of its one argument, in a chat template's JSON call
    example: str  # an argument it takes
    make: Callable[[EnvConfig], Callable[[str], ToolResult]]


def unboxed_warning(env: EnvConfig) -> str | None:
    """The line a run that gives the model the python tool outside the box prints as it
    starts (console and train.log: not only in the docs); None otherwise."""
    if env.name == "none" or env.sandbox != "none" or "python" not in env.tools:
        return None
    return (
        "rlcli: warning: env.sandbox=none: the python tool runs model-written code in a plain "
        "process, unsafe: it can read, write and signal whatever your user can (the escapes "
        "that the bubblewrap box stops go through). Use env.sandbox=bwrap (the default) unless "
        "you trust the code."
    )


def _python(env: EnvConfig):
    return lambda code: run_python(
        code, env.tool_timeout_s, env.python_memory_mb, env.python_disk_mb, env.sandbox
    )


TOOLS: dict[str, ToolSpec] = {
    "calculator": ToolSpec(
        "evaluates arithmetic exactly", "expression", "12345 * 678", lambda env: calculator
    ),
    "python": ToolSpec(
        "runs Python code and returns what it prints", "code", "print(sum(range(10)))", _python
    ),
    "search": ToolSpec(
        "finds documents about a query",
        "query",
        "Velmora lighthouse",
        lambda env: Search(env.corpus, env.search_top_k),
    ),
}


def _user_tool(spec: str, env: EnvConfig):
    return lambda argument: run_function(spec, argument, env.tool_timeout_s)


def tool_name(entry: str) -> str:
    """The name a model calls an `env.tools` entry by: a built-in's, or a function's own."""
    return entry.rsplit(":", 1)[1] if ":" in entry else entry


def describe_tools(entries: list[str]) -> str:
    """A line per tool for the system message (env.tool_format=rlcli)."""
    lines = []
    for entry in entries:
        name = tool_name(entry)
        if entry in TOOLS:
            spec = TOOLS[entry]
            what = f"{spec.what}, e.g. <tool>{name}</tool><args>{spec.example}</args>"
        else:
            what = "your function; see its documentation"
        lines.append(f"- {name}: {what}")
    return "\n".join(lines)


def argument_name(entry: str) -> str:
    """The name of an `env.tools` entry's argument in a JSON call."""
    return TOOLS[entry].argument if entry in TOOLS else user_function_summary(entry)[1]


@functools.cache
def user_function_summary(entry: str) -> tuple[str, str]:
    """(first line of the docstring, first parameter's name) of a user's `file.py:fn`, read
    with `ast` (the user's code runs only in its own process); a generic pair when the file
    cannot be read or the function is not defined at its top level."""
    target, _, name = entry.rpartition(":")
    fallback = (f"the function {name}", "input")
    if not target.endswith(".py"):
        return fallback
    try:
        tree = ast.parse(Path(target).read_text())
    except (OSError, SyntaxError, ValueError):
        return fallback
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            doc = (ast.get_docstring(node) or "").strip().splitlines()
            args = node.args.posonlyargs + node.args.args
            return (doc[0] if doc else fallback[0]), (args[0].arg if args else "input")
    return fallback


class Toolbox:
    """The tools of `env.tools`, called for a batch of turns at once (each in a thread: the
    python tool and user functions wait on processes of their own); `calls` is how the model
    writes a call (rlcli's tags, or its chat template's JSON)."""

    def __init__(self, env: EnvConfig, calls: CallFormat = RLCLI_CALLS):
        self.limit, self.calls = env.tool_output_chars, calls
        self.tools = {
            tool_name(e): (TOOLS[e].make(env) if e in TOOLS else _user_tool(e, env))
            for e in env.tools
        }
        self.arguments = {tool_name(e): argument_name(e) for e in env.tools}

    def call(self, turn: str) -> ToolCall:
        """Run the call that ends `turn`; the output is cut to env.tool_output_chars. What
        reading the call or running its tool raises on the model's text (a RecursionError, a
        MemoryError, a tool's bug) is the call's error output, a failed call the model reads:
        a model-written turn must never end a training step."""
        try:
            parsed = self.calls.parse(turn)
        except Exception as err:  # whatever it is: the call's error, not the run's
            return ToolCall(None, None, self._cut(_failed(err)))
        if isinstance(parsed, str):
            return ToolCall(None, None, ToolResult(parsed, error=True))
        name, arguments = parsed
        argument = arguments if isinstance(arguments, str) else None
        try:
            argument = self._argument(name, arguments)
            return self._run(name, arguments, argument)
        except Exception as err:  # whatever it is: the call's error, not the run's
            return ToolCall(name, argument, self._cut(_failed(err)))

    def _run(self, name: str, arguments: str | dict, argument: str | None) -> ToolCall:
        if name not in self.tools:
            known = ", ".join(self.tools)
            why = f"Error: no tool named {name!r}; the tools are {known}."
            return ToolCall(name, argument, ToolResult(why, error=True))
        if isinstance(arguments, dict) and argument is None:
            key = self.arguments[name]
            why = f"Error: {name} takes one argument, {key!r}; the call gave {sorted(arguments)}."
            return ToolCall(name, json.dumps(arguments), ToolResult(why, error=True))
        return ToolCall(name, argument, self._cut(self.tools[name](argument)))

    def _cut(self, result: ToolResult) -> ToolResult:
        if len(result.text) <= self.limit:
            return result
        return ToolResult(result.text[: self.limit] + " [cut]", result.error, result.timeout)

    def _argument(self, name: str, arguments: str | dict) -> str | None:
        """The argument text of a call: rlcli's is the text itself; a JSON call's is the value
        of the tool's argument (or of its only key), a non-string value as JSON."""
        if isinstance(arguments, str):
            return arguments
        key = self.arguments.get(name)
        if key in arguments:
            value = arguments[key]
        elif len(arguments) == 1:
            (value,) = arguments.values()
        else:
            return None
        return value if isinstance(value, str) else json.dumps(value)

    def run(self, turns: list[str]) -> list[ToolCall]:
        if len(turns) <= 1:
            return [self.call(t) for t in turns]
        with ThreadPoolExecutor(max_workers=min(len(turns), 8)) as pool:
            return list(pool.map(self.call, turns))


def _failed(err: Exception) -> ToolResult:
    """An exception raised on a call, as the error output the model reads."""
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return ToolResult(f"Error: the call failed: {what}", error=True)


def check_env(env: EnvConfig) -> None:
    """A `ConfigError` naming the bad env.* value and the valid choices, before any model loads."""
    if env.name == "none":
        return
    if not env.tools:
        raise ConfigError(f"env={env.name} needs at least one tool in env.tools: {_valid()}.")
    for entry in env.tools:
        target, _, name = entry.rpartition(":")
        if entry not in TOOLS and not (target and name.isidentifier()):
            raise ConfigError(f"env.tools entry {entry!r} is not a tool: {_valid()}.")
    if "search" in env.tools:
        _check_corpus(env.corpus)
    limits = ("max_turns", "max_tokens", "tool_output_chars", "search_top_k", "python_memory_mb")
    for key in (*limits, "python_disk_mb"):
        if getattr(env, key) < 1:
            raise ConfigError(f"env.{key}={getattr(env, key)} must be at least 1.")
    if not (env.tool_timeout_s > 0 and math.isfinite(env.tool_timeout_s)):
        raise ConfigError(f"env.tool_timeout_s={env.tool_timeout_s} must be a positive number.")
    if env.sandbox not in SANDBOXES:
        raise ConfigError(
            f"env.sandbox={env.sandbox!r} is not a sandbox: bwrap (bubblewrap, the default) or "
            "none (no isolation, unsafe)."
        )
    if "python" in env.tools:
        problem = sandbox_problem(env.sandbox)
        if problem:
            raise ConfigError(f"env.sandbox={env.sandbox}: {problem}")
    for entry in env.tools:
        if entry not in TOOLS:
            problem = check_function(entry, max(30.0, env.tool_timeout_s))
            if problem:
                problem = " ".join(problem.split())  # one paragraph, the user's frames kept
                raise ConfigError(f"env.tools entry {entry!r} cannot be used: {problem}")
    if env.tool_format not in TOOL_FORMATS:
        raise ConfigError(
            f"env.tool_format={env.tool_format!r} is not a tool format: rlcli (rlcli's own "
            "<tool>NAME</tool><args>INPUT</args>, taught in the system message; any model) or "
            "chat_template (the tools declared through the model's chat template and calls in "
            "its own format, e.g. Qwen2.5's <tool_call>{json}</tool_call>)."
        )


def _check_corpus(corpus: str | None) -> None:
    """The search tool's documents: a .jsonl file of objects with a "text" string."""
    need = 'a .jsonl file of documents, each a JSON object with a "text" field'
    if not (corpus and Path(corpus).is_file()):
        raise ConfigError(
            f"The search tool needs env.corpus, {need}; env.corpus={corpus!r} is not a file."
        )
    count = 0
    with open(corpus, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as err:
                why = f"is not valid JSON ({err.msg} at column {err.colno})"
                raise ConfigError(
                    f"env.corpus={corpus}: line {number} {why}; use {need}."
                ) from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                why = 'has no "text" string'
                raise ConfigError(f"env.corpus={corpus}: line {number} {why}; use {need}.")
            count += 1
    if count == 0:
        raise ConfigError(f"env.corpus={corpus} holds no documents; use {need}.")


def _valid() -> str:
    return f"{', '.join(TOOLS)}, or a function as 'file.py:name' or 'package.module:name'"
