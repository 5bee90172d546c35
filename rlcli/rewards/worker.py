"""The user's reward function (`reward=python`) in a process of its own.

A function that hangs in C code, calls `sys.exit` or `os._exit`, raises KeyboardInterrupt,
segfaults or prints cannot be stopped or contained from inside the process that runs it, so
the scorer runs it here, one worker per function of reward.function: `serve` is the worker's
end, `FunctionWorker` the parent's, and they speak JSON lines over the worker's stdin and
stdout. Only the standard library is imported here (no torch), so that a worker starts quickly
(docs/performance.md, "Start-up: what is imported late"). This isolates failures, not
permissions: the function runs as the user, with the user's files and network.
"""

from __future__ import annotations

import codecs
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from rlcli.rewards.conventions import BadSignature, CallPlan, call_plan, read_scores

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


def call(fn: Callable, n: int, kwargs: dict) -> dict:
    """One call of the user's function over `n` responses, as the reply to send; every failure
    is caught."""
    if "trainer_state" in kwargs:  # read as TRL's is: state.global_step, state.max_steps
        kwargs["trainer_state"] = SimpleNamespace(**kwargs["trainer_state"])
    try:
        return read_scores(fn(**kwargs), n)
    except BaseException as err:  # SystemExit and KeyboardInterrupt too: this sample's error
        return {"error": describe(err)}
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass


def serve(spec: str, path: list[str]) -> None:
    """Import the function, then answer requests until the parent closes our stdin.

    It first imports the function and reads its signature (`conventions.call_plan`), then
    replies `{"ready": true, "plan": {...}}` or `{"bad_spec": why}`; then each request is one
    call, `{"n": responses, "kwargs": {keyword: list}}`, and each reply is `{"scores": [...],
    "invalid": [[i, why], ...]}` or `{"error": why}`. The function's prints go to stderr (the
    real stdout carries only the protocol), which the parent copies to its own. The worker
    ignores SIGINT (and runs in a session of its own): Ctrl-C belongs to the parent, whose
    training loop saves a checkpoint. `path` (the parent's sys.path) is appended after the
    current directory, at the end, so `package.module:function` still finds a module there."""
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
        plan = call_plan(fn, f"reward.function={spec!r}")
    except (BadSpec, BadSignature) as err:
        send({"bad_spec": str(err)})
        return
    send({"ready": True, "plan": asdict(plan)})
    for line in requests:
        request = json.loads(line)
        send(call(fn, request["n"], request["kwargs"]))


# ---- the parent's end ----


def worker_command() -> list[str]:
    """The command that starts a worker (`python -P -m rlcli.rewards.worker SPEC [PATH ...]`),
    without the current directory on its sys.path: a `yaml.py` there does not replace PyYAML
    (`serve` appends the directory at the end)."""
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
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
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
    # It returned, but not one score per sample: no sample is retried alone (see read_scores).
    miscounted: bool = False
    seconds: float = 0.0  # the call's time, and its worker's restart if it needed one


class FunctionWorker:
    """The parent's end of a worker: one process at a time, replaced after a death or a kill.

    Building one starts the worker and imports the function (BadSpec if it cannot be loaded
    or its signature fits no convention, WorkerLost if the import kills or hangs the worker);
    `plan` is then how it is called. The worker is killed by `close`, when this object is
    garbage collected, and when the interpreter exits."""

    def __init__(self, spec: str):
        self.spec = spec
        self.plan: CallPlan | None = None
        self._proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None
        self._buffer = b""
        self._start()

    def call(self, kwargs: dict, limit: float) -> Outcome:
        """fn(**kwargs) in the worker (each keyword a list, one entry per response), killed
        with its process group past `limit` seconds (inf: never). A worker killed or dead is
        replaced at once, and its restart counts in the outcome's seconds."""
        began = time.monotonic()
        if self._proc is None:  # the last restart failed: try again
            try:
                self._start()
            except (BadSpec, WorkerLost) as err:
                why = f"could not restart the reward worker: {err}"
                return Outcome(error=why, seconds=time.monotonic() - began)
        n = len(next(iter(kwargs.values()), []))
        request = json.dumps({"n": n, "kwargs": kwargs}, default=str).encode() + b"\n"
        try:
            reply = self._exchange(request, time.monotonic() + limit)
        except CallTimeout:
            outcome = Outcome(error=f"RewardTimeout: took longer than {limit:g} s", timed_out=True)
        except WorkerLost as err:
            outcome = Outcome(error=str(err))
        else:
            if "error" in reply:
                outcome = Outcome(error=reply["error"], miscounted=reply.get("miscounted", False))
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
            stderr=subprocess.PIPE,  # copied to sys.stderr by `_copy_prints`
            start_new_session=True,  # its own process group, away from the terminal's Ctrl-C
        )
        self._proc, self._buffer = proc, b""
        self._prints, self._printed = codecs.getincrementaldecoder("utf-8")("replace"), ""
        self._finalizer = weakref.finalize(self, _stop, proc, os.getpid())  # also at exit
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stderr.fileno(), False)
        try:
            reply = self._exchange(b"", time.monotonic() + START_TIMEOUT_S)
        except CallTimeout:
            raise WorkerLost(f"importing it took longer than {START_TIMEOUT_S:g} s") from None
        if "bad_spec" in reply:
            self.close()
            raise BadSpec(reply["bad_spec"])
        self.plan = CallPlan(**{k: tuple(v) if isinstance(v, list) else v
                                for k, v in reply["plan"].items()})  # fmt: skip

    def _exchange(self, request: bytes, deadline: float) -> dict:
        """Send `request`, then read one reply line by `deadline`. On a timeout, the
        worker's death, or anything else (Ctrl-C), the worker is gone after this."""
        proc = self._proc
        try:
            line = self._transfer(proc, memoryview(request), deadline)
        except BaseException:
            self._copy_prints(proc)
            self.close()
            raise
        # The worker flushes what the function printed before it replies: all of it is in
        # the pipe now (all of a dead worker's last words too).
        self._copy_prints(proc)
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
            selector.register(proc.stderr, selectors.EVENT_READ)
            if pending:
                selector.register(proc.stdin, selectors.EVENT_WRITE)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()  # inf: reward.timeout_s=0, no limit
                events = selector.select(None if left == math.inf else left) if left > 0 else []
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
                    elif key.fileobj is proc.stderr:
                        if not self._copy_prints(proc):  # closed: the worker is exiting
                            selector.unregister(proc.stderr)
                    else:
                        chunk = os.read(proc.stdout.fileno(), 1 << 16)
                        if not chunk:
                            return None
                        self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _copy_prints(self, proc: subprocess.Popen) -> bool:
        """Copy the lines the worker has printed so far to sys.stderr (during a run, the job's
        console and log), through tqdm, so that a progress bar is redrawn below them instead
        of being cut; False once its stderr is closed (an unfinished last line is copied)."""
        data, open_ = b"", True
        while open_ and len(data) < 1 << 22:  # a function printing without end: 4 MiB a time
            try:
                chunk = os.read(proc.stderr.fileno(), 1 << 16)
            except BlockingIOError:
                break
            except (OSError, ValueError):  # the pipe is already closed on our side
                return False
            data, open_ = data + chunk, bool(chunk)
        *lines, self._printed = (self._printed + self._prints.decode(data)).split("\n")
        if not open_ and self._printed:
            lines, self._printed = [*lines, self._printed], ""
        if lines:
            from tqdm import tqdm  # here: the worker's end imports the standard library only

            tqdm.write("\n".join(lines), file=sys.stderr)
            sys.stderr.flush()
        return open_


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
    sys.stdout.flush()
    os._exit(0)  # at once: a thread the function started must not keep the worker alive
