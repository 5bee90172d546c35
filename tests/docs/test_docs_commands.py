"""Every command the docs show in a ```bash block runs: the `rlcli ...` lines of README.md and
docs/**/*.md, each made short (the tiny model, one step, a few held-out problems; see
`on_the_tiny_model` for the two settings that model cannot run as written) and run in
this process, in the order the pages give them, in one working directory, so that a command
finds the files an earlier one wrote (`rlcli pairs ... pairs.out=p.jsonl`, then training on
p.jsonl). The sampler a command names is kept (none named: vLLM, the default).

The pages' convention: ```bash blocks hold what runs on a CPU in minutes; ```console blocks (a
GPU, several nodes, a hub push, long runs, other programs) are shown only and not run here.
"""

from __future__ import annotations

import itertools
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlcli.cli import main
from rlcli.commands.recipes import compose as compose_recipe
from rlcli.train.loop import train
from rlcli.validate import compose
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
HYDRA_COMMANDS = ("train", "filter", "pairs", "eval", "rollout-server")
# Flags after which Hydra prints and runs nothing.
PRINT_ONLY = ("--help", "-h", "--cfg", "-c", "--info", "--hydra-help")
# What makes a command short; each replaces the command's own value of its key.
SHORT = [
    "trainer.max_steps=1",
    "logger.progress=false",
    "eval.max_problems=4",
    "eval.k=2",
]
# rlcli filter and pairs sample every training prompt: a few of them.
FEW_PROMPTS = ["data.num_train=8", "data.limit=8"]


@dataclass(frozen=True)
class DocCommand:
    argv: tuple[str, ...]  # the words after `rlcli`
    where: str  # page:line of its first appearance
    also: tuple[str, ...] = ()  # where else the pages show it


def block_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of each ```bash block of a page: a trailing `\\` joins the
    next line; the line number is where the logical line starts."""
    found, fence, pending, start = [], None, "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence != "bash":
            continue
        start = start if pending else number
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        found.append((start, pending))
        pending = ""
    return found


def without_comment(line: str) -> str:
    """The line up to its `# comment`, as the shell reads it: a `#` starting a word, outside
    quotes (a comment may hold an apostrophe: `# GRPO's loss`)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def rlcli_argvs(line: str) -> list[list[str]]:
    """The rlcli commands of one shell line: its `&&`-joined parts that start with `rlcli`
    (or `.venv/bin/rlcli`)."""
    parts, part = [], []
    for word in [*shlex.split(without_comment(line)), "&&"]:
        if word == "&&":
            parts.append(part)
            part = []
        else:
            part.append(word)
    return [p[1:] for p in parts if p and (p[0] == "rlcli" or p[0].endswith("/bin/rlcli"))]


def doc_commands() -> list[DocCommand]:
    """Every rlcli command of the pages' ```bash blocks, in page order, once: commands the
    same once shortened (`rlcli train` and `rlcli train trainer.max_steps=2`) run once."""
    seen: dict[tuple[str, ...], DocCommand] = {}
    for page in PAGES:
        for number, line in block_lines(page):
            for argv in rlcli_argvs(line):
                where = f"{page.relative_to(REPO)}:{number}"
                key = (argv[0], *sorted(shortened(argv[0], argv[1:])))
                first = seen.get(key)
                seen[key] = (
                    DocCommand(tuple(argv), where)
                    if first is None
                    else DocCommand(first.argv, first.where, (*first.also, where))
                )
    return list(seen.values())


def key_of(word: str) -> str:
    return word.split("=", 1)[0].lstrip("+~")


def with_overrides(argv: list[str], overrides: list[str]) -> list[str]:
    """`argv` with each override in place of the command's own value for its key."""
    keys = {key_of(o) for o in overrides}
    return [w for w in argv if "=" not in w or key_of(w) not in keys] + overrides


def checkpoint_for(value: str, fallback: Path) -> str:
    """A run or checkpoint path a page leaves to the reader (`runs/<run>/checkpoints/step_80`),
    or names from a longer run than this test's (step_80 of a run made here in one step): the
    newest checkpoint of that run when it was made here, else `fallback` (a checkpoint) or its
    run. Other values (a hub id, a file) are kept."""
    path = Path(value)
    placeholder = "<" in value
    if path.exists() or not (placeholder or path.parts[0] in ("runs", "multirun")):
        return value
    if "checkpoints" not in path.parts:
        return str(fallback.parent.parent)  # a run directory
    run = Path(*path.parts[: path.parts.index("checkpoints")])
    made = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    return str(made[-1] if made and not placeholder else fallback)


def runnable(argv: tuple[str, ...], index: int, checkpoint: Path) -> list[str]:
    """The command as this test runs it: short, writing under runs/ of the working directory,
    paths to checkpoints a page leaves to the reader filled in."""
    command, args = argv[0], list(argv[1:])
    if command == "export" and args:
        args[0] = checkpoint_for(args[0], checkpoint)
    if command == "plot":  # run directories, then --out FILE
        args = [a if a.startswith("-") or (i and args[i - 1] == "--out")
                else checkpoint_for(a, checkpoint) for i, a in enumerate(args)]  # fmt: skip
    if command not in HYDRA_COMMANDS or any(a in PRINT_ONLY for a in args):
        return [command, *args]
    args = [
        f"{key}={checkpoint_for(value, checkpoint)}" if key in ("model.path", "trainer.resume")
        else word
        for word in args
        for key, _, value in [word.partition("=")]
    ]  # fmt: skip
    sweep = "-m" in args or "--multirun" in args
    out = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    extra = [] if any(key_of(a) == out for a in args) else [f"{out}=runs/doc_{index}"]
    tiny = on_the_tiny_model(command, args)
    return [command, *with_overrides(shortened(command, args), tiny), *extra]


def shortened(command: str, args: list[str]) -> list[str]:
    """A Hydra command's arguments with SHORT's overrides (and FEW_PROMPTS') in place."""
    if command not in HYDRA_COMMANDS or any(a in PRINT_ONLY for a in args):
        return args
    few = FEW_PROMPTS if command in ("filter", "pairs") else []
    return with_overrides(args, [*SHORT, *few])


def on_the_tiny_model(command: str, args: list[str]) -> list[str]:
    """The overrides that run the command on the tiny random model. That model never answers
    right, so where a command needs groups whose rewards differ it cannot do its work as the
    page wrote it: `rlcli pairs` then keeps ties as pairs (pairs.min_margin=-1), and DAPO's
    dynamic sampling, which would find no informative group, is off
    (tests/collect/test_shaping.py and the DAPO run of tests/docs/test_docs_generated.py run it).
    A page naming model=tiny is kept."""
    if command not in HYDRA_COMMANDS or "model=tiny" in args:
        return []
    if command == "pairs":
        return ["model=tiny", "pairs.min_margin=-1"]
    # Each job of a sweep (`algo=grpo,dapo`); a list value (`[a,b]`) is one value.
    overrides = [a for a in args if "=" in a and not a.startswith("hydra.")]
    jobs = itertools.product(*(
        [o] if value.startswith("[") else [f"{key}={v}" for v in value.split(",")]
        for o in overrides
        for key, _, value in [o.partition("=")]
    ))  # fmt: skip
    try:
        dynamic = any(compose_recipe(list(job)).algo.dynamic_sampling for job in jobs)
    except Exception:  # the command's own error, which running it shows
        dynamic = False
    return ["model=tiny", *(["algo.dynamic_sampling=false"] if dynamic else [])]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The commands' working directory: the repository's files (linked), nothing it wrote."""
    work = tmp_path_factory.mktemp("docs_commands")
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("runs", "multirun", "outputs"):
            (work / entry.name).symlink_to(entry)
    return work


@pytest.fixture(scope="module")
def checkpoint(workdir) -> Path:
    """A checkpoint for the commands that continue from one (`rlcli eval model.path=...`,
    `rlcli export`), from a one-step run of the tiny model."""
    run_dir = workdir / "runs" / "checkpoint_run"
    cfg = compose(["model=tiny", "sampler=hf", "trainer.max_steps=1", "logger.progress=false"])
    train(cfg, run_dir)
    return run_dir / "checkpoints" / "step_1"


COMMANDS = doc_commands()


@pytest.mark.parametrize(
    "doc", COMMANDS, ids=[f"{c.where} rlcli {' '.join(c.argv)}"[:120] for c in COMMANDS]
)
def test_command_in_the_docs_runs(doc, workdir, checkpoint, monkeypatch, capfd):
    if doc.argv[0] == "rollout-server":
        pytest.fail(f"{doc.where}: rlcli rollout-server serves until it is killed; show it in "
                    "a ```console block")  # fmt: skip
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the Hydra commands set it
    argv = runnable(doc.argv, COMMANDS.index(doc), checkpoint)
    try:
        main(argv)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    out, err = capfd.readouterr()
    shown = f"{doc.where}" + (f" (also {', '.join(doc.also)})" if doc.also else "")
    assert code == 0, (
        f"{shown}: `rlcli {' '.join(doc.argv)}`, run as `rlcli {shlex.join(argv)}`, exited "
        f"{code}:\n{(out + err)[-3000:]}"
    )


def test_the_pages_show_commands_and_the_reader_finds_them(tmp_path):
    # The extraction itself: continuation lines, comments, `&&`, fences of other languages.
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        "rlcli train algo=dapo \\\n"
        "    trainer.lr=2e-6 x=a#b   # GRPO's loss\n"
        "rlcli pairs pairs.out=p.jsonl && rlcli train data.path=p.jsonl\n"
        ".venv/bin/python -m pytest -q\n"
        "```\n"
        "```console\n"
        "rlcli train model.path=Qwen/Qwen2.5-7B\n"
        "```\n"
        "    ```bash\n"
        "    rlcli recipes\n"
        "    ```\n"
    )
    argvs = [argv for _, line in block_lines(page) for argv in rlcli_argvs(line)]
    assert argvs == [
        ["train", "algo=dapo", "trainer.lr=2e-6", "x=a#b"],
        ["pairs", "pairs.out=p.jsonl"],
        ["train", "data.path=p.jsonl"],
        ["recipes"],
    ]
    assert [n for n, _ in block_lines(page)] == [2, 4, 5, 11]
    assert any(c.argv[0] == "train" for c in COMMANDS), "no rlcli command found in the pages"
