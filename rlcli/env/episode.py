"""Multi-turn episodes: the model writes, a call in its text is run, the tool's output is
appended as a tool turn, the model goes on; every episode of a batch advances together.

`run_episodes` holds the rules and no engine: it is handed `generate` (continue a list of token
contexts, each with its own token budget, stopping at EOS or the call format's stop string),
`tool_tokens` (a tool's output as the tokens of a tool turn), `decode` and the `Toolbox`. Each
episode keeps its tokens after the prompt and a mask that is 1 on the model's own tokens only:
tool turns are context for the model, never trained on (`Rollout.response_mask`). It also keeps
its transcript (`Episode.transcript`), the turns in order as samples.jsonl shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rlcli.env.calls import ToolCall, ToolResult
from rlcli.env.tools import Toolbox


@dataclass(frozen=True)
class Turn:
    """What one generation call returned for one episode."""

    tokens: list[int]
    logprobs: list[float] | None  # the sampler's, per token (None: the sampler has none)
    end: str  # "eos" (the model finished), "call" (it stopped at a call's end), "length"
    versions: list[int] | None = None  # the weight version of each token (rollout workers)


@dataclass
class Episode:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # after the prompt: model and tool turns
    mask: list[int] = field(default_factory=list)  # 1 on the model's tokens, 0 on tool turns
    logprobs: list[float] = field(default_factory=list)  # the sampler's; 0 on tool turns
    # The weight version of each token (-1 on tool turns); None once a turn came without them
    versions: list[int] | None = field(default_factory=list)
    said: list[str] = field(default_factory=list)  # the model's turns, as text
    log: list[dict] = field(default_factory=list)  # every turn, model's and tools', in order
    turns: int = 0
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    done: bool = False
    truncated: bool = False  # cut by a token or turn limit, not finished by the model
    # Why it ended: "answer" (a turn without a call), "length" (a turn hit its token budget),
    # "max_turns" (a call in the last turn, not run), "max_tokens" (no room left after a call
    # or for its output)
    stopped: str = ""

    @property
    def text(self) -> str:
        """What the model wrote: its turns (calls included) without the tools' outputs."""
        return "".join(self.said)

    def add(
        self,
        tokens: list[int],
        own: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        self.tokens += tokens
        self.mask += [int(own)] * len(tokens)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)
        if not own:
            versions = [-1] * len(tokens)
        self.versions = (
            None if self.versions is None or versions is None else self.versions + versions
        )

    def stop(self, why: str) -> None:
        self.done, self.truncated, self.stopped = True, why != "answer", why

    def transcript(self) -> dict:
        """The whole episode for samples.jsonl: its turns in order (the model's text; each
        call's tool, input and output), which trained, and its token counts."""
        trained = sum(self.mask)
        return {
            "turns": self.log,
            "model_turns": self.turns,
            "calls": self.calls,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "trained_tokens": trained,  # the model's own: in the loss
            "context_tokens": len(self.mask) - trained,  # tool turns: read, never trained
            "stopped": self.stopped,
        }


def run_episodes(
    prompts: list[list[int]],
    generate: Callable[[list[list[int]], list[int]], list[Turn]],
    toolbox: Toolbox,
    tool_tokens: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    max_turns: int,
    max_tokens: int,
    turn_tokens: int,
) -> list[Episode]:
    """One episode per prompt (token ids), run to the end: until the model finishes without a
    call, or a turn hits its budget (`turn_tokens`, and what is left of `max_tokens`), or
    `max_turns` model turns are used, or a tool turn would leave no room for a reply."""
    episodes = [Episode(p) for p in prompts]
    for turn in range(max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        budgets = [min(turn_tokens, max_tokens - len(e.tokens)) for e in active]
        outs = generate([e.prompt + e.tokens for e in active], budgets)
        calling = []
        for e, out in zip(active, outs, strict=True):
            e.add(out.tokens, True, out.logprobs, out.versions)
            e.said.append(decode(out.tokens))
            e.log.append(_model_turn(e.said[-1], out))
            e.turns += 1
            if out.end != "call":
                e.stop("length" if out.end == "length" else "answer")
            elif turn == max_turns - 1:
                e.stop("max_turns")  # no turn left to read the result in: the call is not run
            elif len(e.tokens) >= max_tokens:
                e.stop("max_tokens")
            else:
                calling.append(e)
        calls = toolbox.run([e.said[-1] for e in calling])
        for e, call in zip(calling, calls, strict=True):
            _count(e, call.result)
            reply = tool_tokens(call.result.text)
            fits = len(e.tokens) + len(reply) < max_tokens
            e.log.append(_tool_turn(call, len(reply) if fits else 0))
            if fits:
                e.add(reply, False)
            else:
                e.stop("max_tokens")  # the output would leave no room to answer
    return episodes


def _model_turn(text: str, out: Turn) -> dict:
    n = len(out.tokens)
    return {"role": "assistant", "text": text, "end": out.end, "tokens": n, "trained": True}


def _tool_turn(call: ToolCall, tokens: int) -> dict:
    """A tool turn as the transcript shows it; `tokens` 0: its output did not fit, so the
    model never read it."""
    r = call.result
    return {
        "role": "tool",
        "tool": call.tool,
        "input": call.input,
        "output": r.text,
        "error": r.error,
        "timeout": r.timeout,
        "tokens": tokens,
        "trained": False,
    }


def _count(e: Episode, result: ToolResult) -> None:
    e.calls += 1
    e.errors += result.error
    e.timeouts += result.timeout


def episode_metrics(transcripts: list[dict]) -> dict[str, float]:
    """env/* metrics of a batch's episodes, from their transcripts (`Episode.transcript`):
    turns per episode, calls, failed calls, time-outs, the share of episodes with at least one
    call, and the tool tokens (which the loss does not see)."""
    n = max(len(transcripts), 1)
    return {
        "env/turns_mean": sum(t["model_turns"] for t in transcripts) / n,
        "env/tool_calls": float(sum(t["calls"] for t in transcripts)),
        "env/tool_errors": float(sum(t["errors"] for t in transcripts)),
        "env/timeouts": float(sum(t["timeouts"] for t in transcripts)),
        "env/tool_call_rate": sum(t["calls"] > 0 for t in transcripts) / n,
        "env/tool_tokens_mean": sum(t["context_tokens"] for t in transcripts) / n,
    }
