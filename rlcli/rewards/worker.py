"""The user's reward function (`reward=python`) in a process of its own.

A function that hangs in C code, calls `sys.exit` or `os._exit`, raises KeyboardInterrupt,
segfaults or prints cannot be stopped or contained from inside the process that runs it, so
the scorer runs it here: `python -P -m rlcli.rewards.worker SPEC [PATH ...]`, one worker per
scorer, started when the scorer is built. The two speak JSON lines over the worker's stdin
and stdout. The worker first imports the function and replies `{"ready": true}` or
`{"bad_spec": why}`; then each request is one call's keyword lists (prompts, responses,
answers, record fields) and each reply is `{"scores": [...], "invalid": [[i, why], ...]}` or
`{"error": why}`. The parent's end, `FunctionWorker`, waits for a reply with a deadline; past
it, or when the worker dies, it kills the worker's process group, and the next call starts a
fresh worker.

`-P` keeps the current directory from shadowing installed packages (a `yaml.py` there does
not replace PyYAML); the worker appends the current directory, then the parent's own
sys.path, at the end, so `package.module:function` still finds a module there. The
function's prints go to stderr: the real stdout carries only the protocol. The worker
ignores SIGINT and runs in a session of its own: Ctrl-C belongs to the parent, whose training
loop saves a checkpoint. Only the standard library is imported here (no torch), so a worker
starts in tens of milliseconds.

This isolates failures, not permissions: the function runs as the user, with the user's
files and network. It is not a sandbox.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# How long the worker may take to import the user's module (which may load a model).
START_TIMEOUT_S = 300.0


class BadSpec(Exception):
    """reward.function names no function that can be loaded; the message says why."""


class WorkerLost(Exception):
    """The worker died, or could not start; the message says how."""


class CallTimeout(Exception):
    """The worker did not reply in time (it has been killed)."""


def describe(err: BaseException) -> str:
    """'Type: first line of the message', for one-line reports."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_score(value) -> float:
    """A finite float, or NaN for None (a function's way of saying 'no score').

    bool, int, float and numpy scalars are numbers; a string is not, even "1.0"."""
    if value is None:
        return math.nan
    not_a_number = f"returned {_short(value)}, a {type(value).__name__}, not a number"
    if isinstance(value, (str, bytes)):
        raise ValueError(not_a_number)
    try:
        score = float(value)
    except Exception:
        raise ValueError(not_a_number) from None
    if not math.isfinite(score):
        raise ValueError(f"returned {_short(value)}, not a finite number")
    return score


# ---- the worker's end ----


def load_function(spec: str) -> Callable:
    """The function named by 'package.module:function' or 'path/to/file.py:function'."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise BadSpec(
            f"reward.function={spec!r} is not of the form 'package.module:function' or "
            "'path/to/file.py:function'."
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise BadSpec(f"reward.function={spec!r}: no such file {path}.")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except BadSpec:
        raise
    except BaseException as err:  # the user's module failed to import (sys.exit too)
        raise BadSpec(
            f"reward.function={spec!r}: importing {module_name} failed ({describe(err)})."
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise BadSpec(f"reward.function={spec!r}: {module_name} has no function {attr!r}.")
    return fn


def call(fn: Callable, kwargs: dict) -> dict:
    """One call of the user's function, as the reply to send; every failure is caught."""
    n = len(kwargs["responses"])
    try:
        out = fn(**kwargs)
        if isinstance(out, (str, bytes, dict)):
            return {"error": f"returned a {type(out).__name__}, not a list of scores"}
        out = list(out)
        if len(out) != n:
            return {"error": f"returned {len(out)} scores for {n} responses"}
        scores, invalid = [], []
        for i, value in enumerate(out):
            try:
                score = as_score(value)
            except ValueError as err:
                score = math.nan
                invalid.append([i, str(err)])
            scores.append(None if math.isnan(score) else score)
        return {"scores": scores, "invalid": invalid}
    except BaseException as err:  # SystemExit and KeyboardInterrupt too: this sample's error
        return {"error": describe(err)}
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass


def serve(spec: str, path: list[str]) -> None:
    """Import the function, then answer requests until the parent closes our stdin."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")  # os.dup's copies are not inherited by children
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # input() in the function cannot eat a request
    os.close(null)
    os.dup2(2, 1)  # the function's prints, Python's and C's, go to stderr
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":  # die with the parent, even a parent killed by SIGKILL
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    for entry in [os.getcwd(), *path]:
        if entry and entry not in sys.path:
            sys.path.append(entry)

    def send(reply: dict) -> None:
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()

    try:
        fn = load_function(spec)
    except BadSpec as err:
        send({"bad_spec": str(err)})
        return
    send({"ready": True})
    for line in requests:
        send(call(fn, json.loads(line)))


# ---- the parent's end ----


def worker_command() -> list[str]:
    """The command that starts a worker, without the current directory on its sys.path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "rlcli.rewards.worker"]
    run = "import runpy; runpy.run_module('rlcli.rewards.worker', run_name='__main__')"
    return [sys.executable, "-c", f"import sys; del sys.path[0]; {run}"]  # no -P before 3.11


def _stop(proc: subprocess.Popen, owner: int) -> None:
    """Kill the worker and what it started (its process group), and reap it."""
    if os.getpid() != owner:  # a forked copy of the parent exiting: not its worker
        return
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        try:
            pipe.close()
        except OSError:
            pass


def exit_text(code: int | None) -> str:
    if code is None:
        return "the reward worker closed its output"
    if code < 0:
        try:
            return f"the reward worker was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the reward worker was killed by signal {-code}"
    return f"the reward worker exited with code {code}"


@dataclass
class Outcome:
    """One call's result: a score per sample (NaN: None or `invalid`), or `error` for the
    whole call (an exception, the worker's death or, with `timed_out`, the deadline)."""

    scores: list[float] = field(default_factory=list)
    invalid: dict[int, str] = field(default_factory=dict)  # sample -> why its value is no score
    error: str | None = None
    timed_out: bool = False
    seconds: float = 0.0  # the call's time, and its worker's restart if it needed one


class FunctionWorker:
    """The parent's end of a worker: one process at a time, replaced after a death or a kill.

    Building one starts the worker and imports the function (BadSpec if it cannot be loaded,
    WorkerLost if the import kills or hangs the worker). The worker is killed by `close`,
    when this object is garbage collected, and when the interpreter exits."""

    def __init__(self, spec: str):
        self.spec = spec
        self._proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None
        self._buffer = b""
        self._start()

    def call(self, kwargs: dict, limit: float) -> Outcome:
        """fn(**kwargs) in the worker, killed past `limit` seconds. A worker killed or dead
        is replaced at once, and its restart counts in the outcome's seconds."""
        began = time.monotonic()
        if self._proc is None:  # the last restart failed: try again
            try:
                self._start()
            except (BadSpec, WorkerLost) as err:
                why = f"could not restart the reward worker: {err}"
                return Outcome(error=why, seconds=time.monotonic() - began)
        request = json.dumps(kwargs, default=str).encode() + b"\n"
        try:
            reply = self._exchange(request, time.monotonic() + limit)
        except CallTimeout:
            outcome = Outcome(error=f"RewardTimeout: took longer than {limit:g} s", timed_out=True)
        except WorkerLost as err:
            outcome = Outcome(error=str(err))
        else:
            if "error" in reply:
                outcome = Outcome(error=reply["error"])
            else:
                scores = [math.nan if s is None else float(s) for s in reply["scores"]]
                outcome = Outcome(scores, {int(i): why for i, why in reply["invalid"]})
        if self._proc is None:  # killed or dead: a fresh worker for the next call
            try:
                self._start()
            except (BadSpec, WorkerLost):
                pass  # the next call tries again, and says why
        outcome.seconds = time.monotonic() - began
        return outcome

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills the worker, once
        self._proc, self._finalizer, self._buffer = None, None, b""

    def _start(self) -> None:
        path = [entry for entry in sys.path if entry]
        proc = subprocess.Popen(
            [*worker_command(), self.spec, *path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # its own process group, away from the terminal's Ctrl-C
        )
        self._proc, self._buffer = proc, b""
        self._finalizer = weakref.finalize(self, _stop, proc, os.getpid())  # also at exit
        os.set_blocking(proc.stdin.fileno(), False)
        try:
            reply = self._exchange(b"", time.monotonic() + START_TIMEOUT_S)
        except CallTimeout:
            raise WorkerLost(f"importing it took longer than {START_TIMEOUT_S:g} s") from None
        if "bad_spec" in reply:
            self.close()
            raise BadSpec(reply["bad_spec"])

    def _exchange(self, request: bytes, deadline: float) -> dict:
        """Send `request`, then read one reply line by `deadline`. On a timeout, the
        worker's death, or anything else (Ctrl-C), the worker is gone after this."""
        proc = self._proc
        try:
            line = self._transfer(proc, memoryview(request), deadline)
        except BaseException:
            self.close()
            raise
        if line is None:  # the worker died
            try:
                code = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            raise WorkerLost(exit_text(code))
        return json.loads(line)

    def _transfer(self, proc: subprocess.Popen, pending: memoryview, deadline: float):
        """The reply line; None at the worker's end of file; CallTimeout past `deadline`."""
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            if pending:
                selector.register(proc.stdin, selectors.EVENT_WRITE)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                events = selector.select(left) if left > 0 else []
                if not events:
                    raise CallTimeout
                for key, _ in events:
                    if key.fileobj is proc.stdin:
                        try:
                            pending = pending[os.write(proc.stdin.fileno(), pending) :]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            return None
                        if not pending:
                            selector.unregister(proc.stdin)
                    else:
                        chunk = os.read(proc.stdout.fileno(), 1 << 16)
                        if not chunk:
                            return None
                        self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
    sys.stdout.flush()
    os._exit(0)  # at once: a thread the function started must not keep the worker alive
