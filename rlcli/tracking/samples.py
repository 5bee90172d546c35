"""What a run sampled: `samples.jsonl` in the run directory, and a short table on the console.

Every `logger.samples_every` steps (default 1) each response scored in the step is a line of
samples.jsonl (`sample_rows`); every `logger.print_samples_every` steps (0 = never) the first
few of them are printed as a table above the progress bar (`samples_table`), as TRL's
`log_completions` does.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Sequence
from pathlib import Path

SAMPLES_FILE = "samples.jsonl"
TABLE_ROWS = 4  # responses the console table shows
TEXT_WIDTH = 60  # characters of prompt and response shown


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN: a failed reward is null


def sample_rows(step: int, samples: Sequence, advantages: dict) -> list[dict]:
    """One JSON-ready row per scored response (`samples`: `rewards.scored.ScoredSample`): the
    step, the prompt and its problem id, the response, the ground truth, the reward and each
    reward component, the response's length in tokens, and its advantage (null for a response
    the step did not train on, such as a group DAPO's dynamic sampling dropped). With tools
    (env=...) the response is the model's own words and `episode` holds the whole episode: its
    turns in order (the model's text; each call's tool, input, output and errors), whether each
    turn trained, and the counts of trained and context (tool turn) tokens. With rollout
    workers `policy_versions` lists the weight versions that sampled the response's tokens
    (more than one when new weights arrived mid-response, sampler.max_staleness >= 1). For
    conversational data `conversation` holds the prompt's chat messages (system and earlier
    turns; `prompt` is its last user message)."""
    rows = []
    for s in samples:
        advantage = advantages.get((s.problem_id, s.response))
        rows.append({
            "step": step,
            "problem_id": s.problem_id,
            "prompt": s.prompt,
            "response": s.response,
            "answer": s.answer,
            "reward": _number(s.reward),
            "components": {k: _number(v) for k, v in s.components.items()},
            "length": s.length,
            "advantage": None if advantage is None else _number(advantage),
        })  # fmt: skip
        if s.episode is not None:
            rows[-1]["episode"] = s.episode
        if s.versions is not None:  # the policy versions it spans (rollout workers)
            rows[-1]["policy_versions"] = s.versions
        if s.conversation is not None:  # conversational data: the prompt's messages
            rows[-1]["conversation"] = s.conversation
    return rows


def _printable(char: str) -> str:
    # Model text reaches the terminal: an escape sequence (ESC, CSI) would move the cursor,
    # recolour or retitle it, and a format character (U+202E) reorder the line. Shown as
    # escapes instead, as repr would.
    if unicodedata.category(char) in ("Cc", "Cf"):
        return char.encode("unicode_escape").decode("ascii")
    return char


def _cell(text: str, width: int) -> str:
    flat = "".join(map(_printable, " ".join(str(text).split())))
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def samples_table(rows: list[dict]) -> str:
    """The first TABLE_ROWS rows as a fixed-width text table; episodes (env=...) add the
    number of tool calls each made."""
    calls = any("episode" in r for r in rows[:TABLE_ROWS])
    head = f"{'reward':>7} {'adv':>6} {'len':>4}" + (f" {'calls':>5}" if calls else "")
    lines = [f"{head}  {'prompt':<{TEXT_WIDTH}}  response"]
    for r in rows[:TABLE_ROWS]:
        reward = "nan" if r["reward"] is None else f"{r['reward']:.3f}"
        adv = "-" if r["advantage"] is None else f"{r['advantage']:+.2f}"
        cells = f"{reward:>7} {adv:>6} {r['length']:>4}"
        if calls:
            cells += f" {r['episode']['calls'] if 'episode' in r else '-':>5}"
        prompt = _cell(r["prompt"], TEXT_WIDTH)
        lines.append(f"{cells}  {prompt:<{TEXT_WIDTH}}  {_cell(r['response'], TEXT_WIDTH)}")
    return "\n".join(lines)


class SamplesLog:
    """samples.jsonl, appended to step by step; a resumed run first drops the rows of the steps
    it redoes (those after its checkpoint)."""

    def __init__(self, run_dir: Path, every: int, print_every: int, first_step: int = 1):
        self.path, self.every, self.print_every = Path(run_dir) / SAMPLES_FILE, every, print_every
        if self.path.exists() and first_step > 1:
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] < first_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif self.path.exists():
            self.path.unlink()  # a fresh start in a directory that held samples

    def log(self, step: int, samples: Sequence, advantages: dict, write) -> None:
        """Record a step's scored `samples`; `write` prints the table above the progress bar."""
        due = self.every and step % self.every == 0
        show = self.print_every and step % self.print_every == 0
        if not samples or not (due or show):
            return
        rows = sample_rows(step, samples, advantages)
        if due:
            with self.path.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
        if show:
            columns = "reward, advantage, length" + (", tool calls" if "episode" in rows[0] else "")
            write(f"[step {step}] samples ({len(rows)} scored; {columns})\n" + samples_table(rows))
