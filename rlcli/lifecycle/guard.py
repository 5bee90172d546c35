"""What stops a training loop early without losing it: Ctrl-C / SIGTERM and non-finite steps.

Both loops (RL in trainer.py, DPO in dpo.py) use `LoopGuard`: a signal only sets a flag, the
loop finishes the step it is in, saves a checkpoint and raises `RunStopped`, which the CLI
prints as a message (how to resume) with a non-zero exit and no traceback. A second Ctrl-C
stops at once; the last checkpoint written is then the one to resume from.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

# Exit codes of a run stopped by a signal follow the shell's 128 + signal number.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
# A run stopped by non-finite steps exits with this code.
EXIT_BAD_STEPS = 3
EXIT_WORKER_LOST = 4


# Whether a Ctrl-C reached this process before the loop's own handler was up.
_ctrl_c_pressed = False


def _on_ctrl_c(signum, frame) -> None:
    global _ctrl_c_pressed
    _ctrl_c_pressed = True
    raise KeyboardInterrupt


def ctrl_c_stops() -> None:
    """Make SIGINT raise KeyboardInterrupt in this process, whatever it inherited. A job that a
    script starts in the background (`rlcli train ... &`) inherits SIGINT ignored, and Python
    then leaves it so: a Ctrl-C or `kill -INT` during model loading or a worker's start did
    nothing, while one in the loop (whose guard sets its own handler) stopped the run. The
    handler also notes the Ctrl-C, for `ctrl_c_unwrapped`; a new command starts un-noted."""
    global _ctrl_c_pressed
    _ctrl_c_pressed = False
    try:
        signal.signal(signal.SIGINT, _on_ctrl_c)
    except ValueError:  # not the main thread (an embedding program's): its signals, its call
        pass


def stop_if_a_ctrl_c_was_lost() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C reached this process but no exception came of it: a
    library swallowed it. Compiled code that cannot pass an exception on prints "Exception
    ignored in ..." and carries on (CI saw vLLM's engine start do so, and the run then trained
    all its steps). Called where setup ends: the loop's guard, and `rlcli eval`, `filter` and
    `pairs` once their sampler is up."""
    if _ctrl_c_pressed:
        raise KeyboardInterrupt


@contextmanager
def ctrl_c_unwrapped():
    """An error raised after a Ctrl-C is that Ctrl-C: some libraries turn the KeyboardInterrupt
    into an error of their own (pydantic, building vLLM's config in compiled code, raises a
    SchemaError), which would otherwise end the run with a traceback and exit 1."""
    try:
        yield
    except Exception as err:
        if _ctrl_c_pressed:
            raise KeyboardInterrupt from err
        raise


def interruptible(command, argv: list[str]) -> None:
    """`command(argv)`, with a Ctrl-C before the job's own handler is up (Hydra composing the
    config, writing the run directory) ending as one line and exit 130, not a traceback."""
    try:
        command(argv)
    except KeyboardInterrupt:
        print("\nrlcli: interrupted before the run started; nothing was saved.", file=sys.stderr)
        sys.exit(EXIT_CODES[signal.SIGINT])


class RunStopped(Exception):
    """A run ended early on purpose; `str(self)` says why and how to go on."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# Set by `launcher=ray` in each rank's environment: the launcher's own resume command.
RESUME_COMMAND_VARIABLE = "RLCLI_RESUME_COMMAND"


def resume_command(run_dir: Path) -> str:
    """The command that continues this run: the same overrides, the same run directory. A
    rank that `launcher=ray` started names the launcher's command, which it was given."""
    if given := os.environ.get(RESUME_COMMAND_VARIABLE):
        return given
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
        name, overrides = hydra.job.name, list(hydra.overrides.task)
    except ValueError:  # not started by the CLI (tests, notebooks)
        name, overrides = "train", []
    kept = [o for o in overrides if not o.startswith(("hydra.run.dir=", "trainer.resume="))]
    args = [*kept, f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    return f"rlcli {name} " + " ".join(shlex.quote(a) for a in args)


class LoopGuard:
    """Catches SIGINT/SIGTERM while open, and counts non-finite steps in a row.

    `write` prints a line without breaking the progress bar.
    """

    def __init__(self, max_bad_steps: int, write=print, suspects: tuple[str, ...] = ()):
        self.max_bad_steps, self.write = max_bad_steps, write
        # The user's own code in the objective ("algo.loss=f.py:fn"), named first when steps
        # go non-finite: more often the cause than the learning rate.
        self.suspects = suspects
        self.signal: int | None = None  # the first stop signal received
        self.bad_in_a_row = 0
        self._previous: dict = {}

    def __enter__(self) -> LoopGuard:
        # A Ctrl-C during setup that a library swallowed still stops the run, before its first
        # step, as it would have had it reached us.
        stop_if_a_ctrl_c_was_lost()
        for sig in EXIT_CODES:
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: signals stay with whoever owns them
                break
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt  # asked twice: stop now, without a checkpoint
        self.signal = signum
        name = signal.Signals(signum).name
        print(
            f"\nrlcli: {name} received: stopping after this step and saving a checkpoint "
            "(Ctrl-C again to stop at once, without one).",
            file=sys.stderr,
            flush=True,
        )

    def observe(self, step: int, metrics: dict) -> None:
        """Count a step whose loss or gradient was not finite (its update was skipped)."""
        skipped = metrics.get("nonfinite/skipped_updates", 0)
        if skipped:
            self.bad_in_a_row += 1
            loss, norm = (
                metrics.get("loss/policy", math.nan),
                metrics.get("actor/grad_norm", math.nan),
            )
            self.write(
                f"rlcli: warning: step {step} had a non-finite loss ({loss}) or gradient norm "
                f"({norm}); skipped {int(skipped)} optimiser update(s), the weights are "
                f"unchanged ({self.bad_in_a_row} such step(s) in a row, trainer.max_bad_steps="
                f"{self.max_bad_steps})." + self._suspect_hint()
            )
        else:
            self.bad_in_a_row = 0

    def _suspect_hint(self) -> str:
        if not self.suspects:
            return ""
        return f" Check your own {' and '.join(self.suspects)} first: what does it return here?"

    @property
    def stopping(self) -> bool:
        return self.signal is not None or (
            self.max_bad_steps > 0 and self.bad_in_a_row >= self.max_bad_steps
        )

    def stop(self, step: int, checkpoint: Path, run_dir: Path) -> RunStopped:
        """The exception that ends the loop, with the message for the user."""
        again = f"Resume with:\n  {resume_command(run_dir)}"
        if self.signal is not None:
            name = signal.Signals(self.signal).name
            return RunStopped(
                f"stopped by {name} after step {step}; checkpoint saved in {checkpoint}. " + again,
                EXIT_CODES[self.signal],
            )
        first = (
            f"First suspect your own {' and '.join(self.suspects)}: check what it returns for "
            "NaN or inf (a log of 0, a division by a count that can be 0). Other causes: "
            if self.suspects
            else "Usual causes: "
        )
        return RunStopped(
            f"stopped after step {step}: the last {self.bad_in_a_row} steps all had a "
            "non-finite loss or gradient (NaN or inf), so their updates were skipped. The "
            f"weights in {checkpoint} are from before them. {first}a learning rate too "
            "high for this model, rewards of extreme size, or float16 overflow (use "
            "trainer.dtype=bfloat16 or float32). Fix the cause, then resume. " + again,
            EXIT_BAD_STEPS,
        )
