"""The python tool's process, and a user tool function's: started per call, stopped at its
time limit or when its output passes `OUTPUT_BYTES`, its whole process group killed.

`run_python` runs model-written code in the sandbox `sandbox_child.py` sets up (its docstring
lists the layers); `run_function` runs a user's `file.py:name` tool, limited in time and output
only. Both run in a fresh temporary directory that is deleted afterwards, with an environment
holding only PATH, HOME (that directory) and single-threaded math libraries: no tokens, no
proxies.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlcli.env.calls import ToolResult

CHILD = Path(__file__).with_name("sandbox_child.py")
# Output read from a call; past it the process is stopped (a print loop fills no memory).
OUTPUT_BYTES = 64 * 1024


def run_python(code: str, timeout_s: float, memory_mb: int) -> ToolResult:
    # CPU seconds a little above the wall-clock limit, which stops the process first; the CPU
    # limit only backs it up (SIGXCPU is reported as a time-out too).
    limits = json.dumps({"cpu_s": math.ceil(timeout_s) + 1, "memory_mb": memory_mb})
    return _run(["code", limits], code, timeout_s)


def run_function(spec: str, argument: str, timeout_s: float) -> ToolResult:
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        target = str(Path(target).resolve())
    path = json.dumps([os.getcwd(), *sys.path])
    return _run(["function", f"{target}:{name}", path], argument, timeout_s)


def _run(args: list[str], given: str, timeout_s: float) -> ToolResult:
    with tempfile.TemporaryDirectory(prefix="rlcli-tool-") as workdir:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        proc = subprocess.Popen(
            [sys.executable, "-I", "-u", str(CHILD), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,  # its own process group, killed whole
        )
        try:
            proc.stdin.write(given.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        output, why = _read(proc, timeout_s)
        if why is None:  # its output closed: let it finish exiting before the group is killed
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = proc.wait()
    text = output.decode(errors="replace").strip()
    if why == "timeout" or code == -signal.SIGXCPU:
        return ToolResult(f"{text}\nError: stopped after {timeout_s:g} s".strip(), timeout=True)
    if why == "too long":
        cut = (
            f"{text[:200]}\nError: output over {OUTPUT_BYTES // 1024} KiB; the process was stopped"
        )
        return ToolResult(cut, error=True)
    if code != 0:
        if not text or code < 0:
            name = signal.Signals(-code).name if code < 0 else f"status {code}"
            text = f"{text}\nError: the process ended with {name}".strip()
        return ToolResult(text, error=True)
    return ToolResult(text)


def _read(proc: subprocess.Popen, timeout_s: float) -> tuple[bytes, str | None]:
    """The process's output until it ends (None), passes its deadline ("timeout") or
    OUTPUT_BYTES ("too long")."""
    deadline = time.monotonic() + timeout_s
    chunks, size = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), "timeout"
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return b"".join(chunks), None
            chunks.append(chunk)
            size += len(chunk)
            if size > OUTPUT_BYTES:
                return b"".join(chunks)[:OUTPUT_BYTES], "too long"
