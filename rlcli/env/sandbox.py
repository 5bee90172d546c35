"""The python tool's process, and a user tool function's: started per call, stopped at its
time limit or when its output passes `OUTPUT_BYTES`, everything it started killed with it.

`run_python` runs model-written code. With `env.sandbox=bwrap` (the default) the operating
system contains it, through bubblewrap (`bwrap`, a tool made for unprivileged containers):
- its own pid, network, ipc, uts, mount and cgroup namespaces: no other process, no network
  (a loopback of its own), no host socket, Unix or abstract;
- a root of its own holding only /usr, the Python installation and the child script, all
  read-only; its own /proc and a minimal /dev, read-only too; a tmpfs of `disk_mb` MiB as
  /tmp, its working directory and only writable place (another bounded one on /dev/shm), gone
  when it ends;
- an unprivileged user with no capabilities: started by root, bubblewrap makes the namespaces
  and `setpriv` then becomes `nobody` (65534) inside, so rlimits bind (started by another
  user, bubblewrap's user namespace maps the box's user to that user, and nested user
  namespaces are disabled);
- the seccomp filter of `seccomp.py` (no new process or thread, no memory the address-space
  limit misses: memfd, System V shared memory, extended attributes; sockets only of the
  families the network namespace contains, so no AF_VSOCK); a new session; killed with its
  parent;
- where this user can make one (root under cgroup v1's memory hierarchy, or a v2 cgroup with
  the memory controller open), a memory cgroup of the code's limit, its two tmpfs and
  `CGROUP_SLACK_MB`: the one limit that counts the kernel's memory too (files' inodes);
- bubblewrap itself started with a minimal environment, so no process of the box can read the
  trainer's tokens (the box's pid 1 keeps the environment it was started with);
- rlimits and the audit hook that `sandbox_child.py` adds inside: CPU, address space, file
  size, no new process or thread, 256 open files, no core; the hook only gives clearer
  messages.
With `env.sandbox=none` the code runs in a plain process with the rlimits and the hook only,
in a temporary directory: not contained (docs/tools.md), and the run says so as it starts.

`run_function` runs a user's `file.py:name` tool, limited in time and output only (the user's
own code), in a fresh temporary directory with an environment of PATH and HOME.
"""

from __future__ import annotations

import functools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from rlcli.env.calls import ToolResult
from rlcli.env.seccomp import filter_program

CHILD = Path(__file__).with_name("sandbox_child.py")
# Output read from a call; past it the process is stopped (a print loop fills no memory).
OUTPUT_BYTES = 64 * 1024
SANDBOXES = ("bwrap", "none")
# Where the box's writable tmpfs is mounted, and the child script inside the box.
BOX_HOME, BOX_CHILD = "/tmp", "/rlcli/sandbox_child.py"
NOBODY = 65534
# The one environment bubblewrap itself sees, and the one the box's code sees.
BWRAP_ENV = {"PATH": "/usr/bin:/bin"}
# Where a memory cgroup can be made, the box runs in one of its code's limit, its two tmpfs and
# this much for what the kernel keeps for it (page tables, files' inodes, sockets' queues):
# the one limit that counts everything, which the rlimits and the filter cannot.
CGROUP_SLACK_MB = 64
# The files that set a cgroup's memory limit and its swap (cgroup v1, v2).
V1 = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
V2 = ("memory.max", "memory.swap.max")
# Run by sh as `sh -c ENTER_CGROUP PROCS COMMAND...`: moves itself into the cgroup, then becomes
# bubblewrap, so that every process of the box starts inside it.
ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'
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
    # CPU seconds a little above the wall-clock limit, which stops the process first; the CPU
    # limit only backs it up (SIGXCPU is reported as a time-out too).
    limits = {"cpu_s": math.ceil(timeout_s) + 1, "memory_mb": memory_mb, "boxed": False}
    if sandbox == "none":
        command = [sys.executable, "-I", "-u", str(CHILD), "code", json.dumps(limits)]
        return _in_temporary_directory(command, code, timeout_s)
    limits["boxed"] = True
    program = filter_program()
    seccomp = _memfd(program) if program else None
    cgroup = _make_cgroup(memory_mb + 2 * disk_mb + CGROUP_SLACK_MB)
    try:
        command = [*box_command(disk_mb, seccomp), sys.executable, "-I", "-u", BOX_CHILD]
        command += ["code", json.dumps(limits)]
        if cgroup is not None:
            command = ["sh", "-c", ENTER_CGROUP, str(cgroup / "cgroup.procs"), *command]
        fds = (seccomp,) if seccomp is not None else ()
        return _run(command, code, timeout_s, cwd="/", env=BWRAP_ENV, pass_fds=fds)  # cwd / = box
    finally:
        if seccomp is not None:
            os.close(seccomp)
        if cgroup is not None:
            _remove_cgroup(cgroup)


def box_command(disk_mb: int, seccomp_fd: int | None = None) -> list[str]:
    """The `bwrap ... [setpriv ...]` prefix of a command that runs in a new box."""
    root = os.geteuid() == 0
    cmd = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if not root:
        cmd += ["--unshare-user", *(["--disable-userns"] if _bwrap_has("--disable-userns") else [])]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for path in _python_paths():
        # Parents made traversable: /root is 0700 outside, and `nobody` must reach a pyenv.
        for parent in reversed(Path(path).parents[:-1]):
            if not str(parent).startswith("/usr"):
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", path, path]
    cmd += ["--perms", "0755", "--dir", os.path.dirname(BOX_CHILD)]
    cmd += ["--ro-bind", str(CHILD), BOX_CHILD, "--proc", "/proc", "--dev", "/dev"]
    size = str(disk_mb * 2**20)
    for place in (BOX_HOME, "/dev/shm"):  # writable by the box's user, sticky as usual
        cmd += ["--perms", "1777", "--size", size, "--tmpfs", place]
    # bubblewrap's root and /dev are tmpfs of no size (half the machine's memory), owned by
    # the box's user when it is not root: read-only, they leave the two above the only
    # writable places (the mounts on them stay writable, and a device node still opens).
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/"]
    cmd += ["--chdir", BOX_HOME, "--clearenv"]
    for key, value in CODE_ENV.items():
        cmd += ["--setenv", key, value]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd.append("--")
    if root:  # nobody, no groups, no capabilities, and none to be gained
        cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        cmd += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    return cmd


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
    if probe.text != "42":
        return (
            "bubblewrap is installed but could not start the python tool's box here (it needs "
            "user namespaces, or root); it said: "
            + " ".join(probe.text.split())[:300]
            + ". Set env.sandbox=none to run the code without isolation (unsafe)."
        )
    return None


def run_function(spec: str, argument: str, timeout_s: float) -> ToolResult:
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


def _make_cgroup(limit_mb: int) -> Path | None:
    """A new memory cgroup holding at most `limit_mb` MiB, where this user can make one and
    enter it (`_cgroup_places`); None elsewhere."""
    for base, files in _cgroup_places():
        try:
            path = Path(tempfile.mkdtemp(prefix="rlcli-box-", dir=base))
        except OSError:
            continue
        try:
            (path / files[0]).write_text(str(limit_mb * 2**20))
            if (path / files[1]).exists():  # no swap either (v1: memory and swap together)
                (path / files[1]).write_text(str(limit_mb * 2**20) if files == V1 else "0")
            return path
        except OSError:
            _remove_cgroup(path)
    return None


@functools.cache
def _cgroup_places() -> tuple[tuple[Path, tuple[str, str]], ...]:
    """Where a box's memory cgroup can go: under this process's own cgroup, in v1's memory
    hierarchy, or in v2's where the memory controller is open to children (a v2 cgroup with
    processes cannot open it: in practice only root's top). Each kept once a cgroup made there
    could be entered."""
    places = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        if "memory" in controllers.split(","):
            places.append((Path("/sys/fs/cgroup/memory" + own), V1))
        elif not controllers:
            for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                control = Path(mount + own) / "cgroup.subtree_control"
                if control.is_file() and "memory" in control.read_text().split():
                    places.append((control.parent, V2))
    return tuple(place for place in places if _can_enter(place))


def _can_enter(place: tuple[Path, tuple[str, str]]) -> bool:
    path = None
    try:
        path = Path(tempfile.mkdtemp(prefix="rlcli-box-", dir=place[0]))
        enter = ["sh", "-c", ENTER_CGROUP, str(path / "cgroup.procs"), "true"]
        return subprocess.run(enter, capture_output=True, env=BWRAP_ENV).returncode == 0
    except OSError:
        return False
    finally:
        if path is not None:
            _remove_cgroup(path)


def _remove_cgroup(path: Path) -> None:
    """Removed once the box's last process has gone (it dies with bubblewrap, a moment
    later); left behind empty after 2 s."""
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


@functools.cache
def _bwrap_has(flag: str) -> bool:
    shown = subprocess.run(["bwrap", "--help"], capture_output=True, text=True)
    return flag in shown.stdout + shown.stderr


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
