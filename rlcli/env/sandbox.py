"""The python tool's process, and a user tool function's: started per call, stopped at its
time limit or when its output passes `OUTPUT_BYTES`, everything it started killed with it.

`run_python` runs model-written code: with `env.sandbox=bwrap` (the default) in a bubblewrap box
(its own namespaces, a read-only root, a user of its own, the seccomp filter of `seccomp.py`, a
memory cgroup of `box_cgroup.py` where one can be made, and the rlimits of `sandbox_child.py`);
with `env.sandbox=none` in a plain process with the rlimits and the audit hook only, uncontained.
docs/tools.md, "The python tool's sandbox", says what each layer holds. `run_function` runs a
user's `file.py:name` tool, limited in time and output only (the user's own code).
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from rlcli.env.box_cgroup import CGROUP_SLACK_MB, ENTER_CGROUP, make_cgroup, remove_cgroup
from rlcli.env.calls import ToolResult
from rlcli.env.seccomp import filter_program

CHILD = Path(__file__).with_name("sandbox_child.py")
# Output read from a call; past it the process is stopped (a print loop fills no memory).
OUTPUT_BYTES = 64 * 1024
SANDBOXES = ("bwrap", "none")
# Where the box's writable tmpfs is mounted, and the child script inside the box.
BOX_HOME, BOX_CHILD = "/tmp", "/rlcli/sandbox_child.py"
# Started by root, each box becomes a user drawn from this range, which no host account uses:
# the kernel's per-user counts (processes, inotify instances, pipe pages, descriptors in
# flight) are then each box's own, shared with no other box and no host daemon (`nobody`'s
# were). Two boxes at once draw the same one about once in a billion.
BOX_UIDS = (2**31, 2**31 + 2**30)
# The one environment bubblewrap itself sees, and the one the box's code sees.
BWRAP_ENV = {"PATH": "/usr/bin:/bin"}
CODE_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": BOX_HOME,
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def run_python(
    code: str, timeout_s: float, memory_mb: int, disk_mb: int = 64, sandbox: str = "bwrap"
) -> ToolResult:
    """What model-written `code` prints. With `sandbox="bwrap"` the operating system contains
    it, through bubblewrap (`bwrap`, a tool made for unprivileged containers):
    - its own pid, network, ipc, uts, mount and cgroup namespaces: no other process, no network
      (a loopback of its own), no host socket, Unix or abstract;
    - a root of its own holding only /usr, the Python installation (at its own paths, under /tmp
      too) and the child script, all read-only; its own /proc and a minimal /dev, read-only too;
      a tmpfs of `disk_mb` MiB as /tmp, its working directory and only writable place (another
      bounded one on /dev/shm), gone when it ends (`box_options`);
    - an unprivileged user with no capabilities: started by root, bubblewrap makes the
      namespaces and `setpriv` then becomes a user of the box's own (`box_user`); started by
      another user, bubblewrap's user namespace maps the box's user to that user, nested user
      namespaces are disabled, and the code is pid 1 itself (`--as-pid-1`);
    - the seccomp filter of `seccomp.py`; a new session; killed with its parent;
    - where this user can make one (root under cgroup v1's memory hierarchy, or a v2 cgroup with
      the memory controller open), a memory cgroup of the code's limit, its two tmpfs and
      `CGROUP_SLACK_MB`: the one limit that counts the kernel's memory too (files' inodes);
    - bubblewrap itself started with a minimal environment (`BWRAP_ENV`), so no process of the
      box can read the trainer's tokens (the box's pid 1 keeps the environment it was started
      with), and given its options in a file (`--args`), so its command line names no host path;
    - the rlimits and the audit hook that `sandbox_child.py` adds inside (the hook only gives
      clearer messages).
    With `sandbox="none"` the code runs in a plain process with the rlimits and the hook only, in
    a temporary directory: not contained (docs/tools.md), and the run says so as it starts."""
    # CPU seconds a little above the wall-clock limit, which stops the process first; the CPU
    # limit only backs it up (`_run` says why no exit status is read as a time-out).
    limits = {"cpu_s": math.ceil(timeout_s) + 1, "memory_mb": memory_mb, "boxed": False}
    if sandbox == "none":
        command = [sys.executable, "-I", "-u", str(CHILD), "code", json.dumps(limits)]
        return _in_temporary_directory(command, code, timeout_s)
    limits["boxed"] = True
    program = filter_program()
    fds = [_memfd(program)] if program else []
    cgroup = make_cgroup(memory_mb + 2 * disk_mb + CGROUP_SLACK_MB)
    try:
        # bubblewrap reads its options from a file, so that its command line, which its init
        # in the box keeps, names none of the host's paths.
        fds.append(_memfd(b"".join(o.encode() + b"\0" for o in box_options(disk_mb, *fds[:1]))))
        command = [bwrap_path(), "--args", str(fds[-1]), "--", *box_user()]
        command += [sys.executable, "-I", "-u", BOX_CHILD, "code", json.dumps(limits)]
        if cgroup is not None:
            command = ["sh", "-c", ENTER_CGROUP, str(cgroup / "cgroup.procs"), *command]
        return _run(command, code, timeout_s, cwd="/", env=BWRAP_ENV, pass_fds=fds)  # cwd / = box
    finally:
        for fd in fds:
            os.close(fd)
        if cgroup is not None:
            remove_cgroup(cgroup)


def box_options(disk_mb: int, seccomp_fd: int | None = None) -> list[str]:
    """bubblewrap's options for a new box (`bwrap OPTIONS -- COMMAND`)."""
    root = os.geteuid() == 0
    cmd = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if not root:
        # The code is the box's pid 1: bubblewrap's init would be the code's own user without
        # its rlimits, whose memory the code could write through /proc/1/mem. Root's init is
        # out of the box's user's reach, and stays: it passes --die-with-parent's signal on,
        # which the box's user could not receive from root.
        cmd += ["--as-pid-1", "--unshare-user"]
        cmd += ["--disable-userns"] if _bwrap_has("--disable-userns") else []
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    size = str(disk_mb * 2**20)
    # The writable tmpfs first: a Python installed under /tmp is then bound inside it, not
    # hidden by it.
    cmd += ["--perms", "1777", "--size", size, "--tmpfs", BOX_HOME]
    cmd += _python_mounts()
    cmd += ["--perms", "0755", "--dir", os.path.dirname(BOX_CHILD)]
    cmd += ["--ro-bind", str(CHILD), BOX_CHILD, "--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]  # sticky, as usual
    # bubblewrap's root and /dev are tmpfs of no size (half the machine's memory), owned by
    # the box's user when it is not root: read-only, they leave the two above the only
    # writable places (the mounts on them stay writable, and a device node still opens).
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/"]
    cmd += ["--chdir", BOX_HOME, "--clearenv"]
    for key, value in CODE_ENV.items():
        cmd += ["--setenv", key, value]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    return cmd


def box_user() -> list[str]:
    """Started by root, the `setpriv` prefix that makes the box's command a user of its own
    (`box_uid`) with no groups, no capabilities and none to be gained; otherwise nothing."""
    if os.geteuid() != 0:
        return []
    uid = box_uid()
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return cmd + ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def _python_mounts() -> list[str]:
    """The Python installation's folders, read-only at their own paths (a venv names its base
    installation by path), their parents made traversable: /root is 0700 outside, and the
    box's user must reach a pyenv."""
    cmd = []
    for path in _python_paths():
        for parent in reversed(Path(path).parents[:-1]):
            if not str(parent).startswith("/usr") and str(parent) != BOX_HOME:
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", path, path]
    return cmd


def box_uid() -> int:
    """A user for a box started by root: one of `BOX_UIDS`, drawn anew per box."""
    low, high = BOX_UIDS
    return low + secrets.randbelow(high - low)


def bwrap_path() -> str:
    """bubblewrap as the user's PATH finds it (/usr/local/bin too), run by that path: the box's
    command itself runs with `BWRAP_ENV`'s PATH."""
    return shutil.which("bwrap") or "bwrap"


def sandbox_problem(sandbox: str) -> str | None:
    """Why the python tool's sandbox cannot run here (a sentence for the user), or None."""
    if sandbox == "none":
        return None
    if shutil.which("bwrap") is None:
        return (
            "the python tool runs model-written code inside bubblewrap, and the `bwrap` command "
            "is not installed here: install the package `bubblewrap` (apt-get install "
            "bubblewrap, dnf install bubblewrap; scripts/setup.sh does it on Debian), or set "
            "env.sandbox=none to run that code without isolation (unsafe: it can then read, "
            "write and signal whatever your user can)."
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "started by root, the python tool's box needs `setpriv` (package util-linux)."
    probe = run_python("print(6 * 7)", 20, 256)
    if probe.text == "42":
        return None
    said = " ".join(probe.text.split())[:300]
    if said.startswith("bwrap:") and "execvp" not in said:  # bubblewrap's own complaint
        return (
            "bubblewrap is installed but could not make the python tool's box here (it needs "
            f"user namespaces, or root); it said: {said}. Set env.sandbox=none to run the code "
            "without isolation (unsafe)."
        )
    held = "".join(f", {path}" for path in _python_paths())
    return (
        f"bubblewrap made the python tool's box, but this Python ({sys.executable}) did not "
        f"run in it (the box holds /usr, /bin, /lib{held}); it said: {said}"
    )


def run_function(spec: str, argument: str, timeout_s: float) -> ToolResult:
    """What the user's tool `spec` (`file.py:name`) returns for `argument`, run in a fresh
    temporary directory with an environment of PATH, HOME and `CODE_ENV`'s thread counts,
    limited in time and output only: the user's own code."""
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        target = str(Path(target).resolve())
    path = json.dumps([os.getcwd(), *sys.path])
    command = [sys.executable, "-I", "-u", str(CHILD), "function", f"{target}:{name}", path]
    return _in_temporary_directory(command, argument, timeout_s)


def check_function(spec: str, timeout_s: float) -> str | None:
    """Why the user's tool `spec` cannot be imported and called (its own words), or None.
    Imported in a process of its own, as it will run: not in the trainer's."""
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        target = str(Path(target).resolve())
    path = json.dumps([os.getcwd(), *sys.path])
    command = [sys.executable, "-I", "-u", str(CHILD), "check", f"{target}:{name}", path]
    done = _in_temporary_directory(command, "", timeout_s)
    return (done.text or "it failed") if (done.error or done.timeout) else None


def _bwrap_has(flag: str) -> bool:
    return flag in _bwrap_help(bwrap_path())


@functools.cache
def _bwrap_help(bwrap: str) -> str:
    shown = subprocess.run([bwrap, "--help"], capture_output=True, text=True)
    return shown.stdout + shown.stderr


def _python_paths() -> list[str]:
    """The interpreter's installation and its environment (a venv), each once."""
    paths = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
    paths |= {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    kept = sorted(p for p in paths if p != "/usr" and not p.startswith("/usr/"))  # bound whole
    return [p for p in kept if not any(p.startswith(q + os.sep) for q in kept)]


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("rlcli-seccomp", 0)  # inherited by bwrap through pass_fds
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _in_temporary_directory(command: list[str], given: str, timeout_s: float) -> ToolResult:
    with tempfile.TemporaryDirectory(prefix="rlcli-tool-") as workdir:
        env = {**CODE_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir}
        return _run(command, given, timeout_s, cwd=workdir, env=env)


def _run(
    command: list[str], given: str, timeout_s: float, cwd: str, env: dict, pass_fds=()
) -> ToolResult:
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        pass_fds=pass_fds,
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
    if cwd == "/" and code > 128 and code - 128 in signal.valid_signals():
        code = 128 - code  # bubblewrap exits 128 + N for a box killed by signal N
    text = output.decode(errors="replace").strip()
    # A time-out is the wall clock's only: no exit status can tell that the CPU limit struck.
    # Code can exit with any status (152 from the box reads as SIGXCPU), and the CPU limit,
    # soft = hard, kills with SIGKILL, as a memory limit does. It is set above the wall-clock
    # limit, which a process of one thread reaches first (the box allows no other; outside it,
    # root's threads can reach it sooner, and read as SIGKILL).
    if why == "timeout":
        return ToolResult(f"{text}\nError: stopped after {timeout_s:g} s".strip(), timeout=True)
    if why == "too long":
        cut = (
            f"{text[:200]}\nError: output over {OUTPUT_BYTES // 1024} KiB; the process was stopped"
        )
        return ToolResult(cut, error=True)
    if code != 0:
        if not text or code < 0:
            how = f"exited with status {code}"
            if code < 0:
                how = f"ended with {signal.Signals(-code).name}"
            text = f"{text}\nError: the process {how}".strip()
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
