"""The process a python tool call (or a user's tool function) runs in; the standard library
only, started by `sandbox.py` as `python -I -u sandbox_child.py MODE ...` with the call's
input on stdin, in a fresh temporary directory.

`code` mode sets resource limits and an audit hook, then runs the model's code (`run_code`).
`function` mode imports the user's tool (`file.py:name` or `module:name`) and prints what it
returns for the argument: the user's own code, limited only in time and output by the parent.
`check` mode only imports it, before the run starts (`sandbox.check_function`).
"""

import json
import os
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
OPEN_FILES = 256
# Audit events refused outright: the network, new processes, signals, native calls.
REFUSED = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "pty.",
    "ctypes.",
    "_posixsubprocess",
)
# In the box the kernel already holds files and native calls; refusing ctypes there would
# only break `import numpy`.
REFUSED_IN_BOX = tuple(e for e in REFUSED if e != "ctypes.")
# Events whose first argument is a path that must lie in the work directory.
WRITES = (
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.symlink",
    "os.link",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.utime",
    "os.chdir",
    "shutil.",
)
READS = ("os.listdir", "os.scandir")
# Modules whose import is refused: process creation without an audit event of its own.
MODULES = ("_posixsubprocess",)


def isolate_network() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    libc.unshare(flags)  # refused in some containers: the audit hook still refuses sockets


def set_limits(cpu_s: int, memory_mb: int) -> None:
    import resource

    for limit, value in (
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, memory_mb * 2**20),
        (resource.RLIMIT_FSIZE, 16 * 2**20),
        (resource.RLIMIT_NPROC, 0),
        (resource.RLIMIT_CORE, 0),
        # A socket queues ~220 KiB of kernel memory that RLIMIT_AS does not count: 200 Unix
        # socket pairs held 44 MiB, so the 20,000 descriptors allowed before held 2.2 GiB.
        # 256 hold at most ~28 MiB.
        (resource.RLIMIT_NOFILE, OPEN_FILES),
    ):
        resource.setrlimit(limit, (value, value))


def install_guard(workdir: str, boxed: bool) -> None:
    import sysconfig

    paths = sysconfig.get_paths()
    readable = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    readable |= {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    devices = {"/dev/null", "/dev/urandom", "/dev/zero"}

    def inside(path, roots) -> bool:
        if isinstance(path, int):  # an open file descriptor: stdin, stdout, stderr
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real in devices or any(real == r or real.startswith(r + os.sep) for r in roots)

    def hook(event: str, args) -> None:
        if event.startswith(REFUSED_IN_BOX if boxed else REFUSED):
            raise PermissionError(f"the python tool's sandbox refuses {event}")
        if boxed:
            return
        if event == "import" and args[0] in MODULES:
            raise PermissionError(f"the python tool's sandbox refuses to import {args[0]}")
        if event == "open":
            path, mode, flags = args
            writing = any(c in (mode or "") for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)
            roots = (workdir,) if writing else (workdir, *readable)
            if path is not None and not inside(path, roots):
                raise PermissionError(f"the python tool's sandbox refuses to open {path!r}")
        elif event.startswith(WRITES) or event.startswith(READS):
            roots = (workdir,) if event.startswith(WRITES) else (workdir, *readable)
            if (
                args
                and isinstance(args[0], (str, bytes, os.PathLike))
                and not inside(args[0], roots)
            ):
                raise PermissionError(f"the python tool's sandbox refuses {event} {args[0]!r}")

    sys.addaudithook(hook)


def run_code(code: str, limits: dict) -> None:
    """Run the model's `code`. Inside bubblewrap's box (`boxed`, the default; `sandbox.run_python`
    says what the box is), which is what contains the code, it first sets:
    1. resource limits (`set_limits`): CPU seconds, address space, file size, no child processes
       or threads, 256 open files, no core file. They bind: the box's user is not root; the
       seccomp filter refuses new processes whatever a per-user count says;
    2. an audit hook (PEP 578, `install_guard`) refusing sockets and new processes with a
       message the model can read ("the sandbox refuses socket.connect") instead of the kernel's
       bare errno. It is not a containment: code can switch it off (tests/env/test_sandbox.py does),
       and nothing depends on it.
    Outside a box (`env.sandbox=none`, unsafe): the same limits and a stricter hook (files
    outside the temporary directory, ctypes), plus a network namespace where the kernel allows
    one (`isolate_network`): obstacles for a well-meaning model, not a sandbox."""
    workdir = os.path.realpath(os.getcwd())
    if not limits["boxed"]:
        isolate_network()
    set_limits(limits["cpu_s"], limits["memory_mb"])
    install_guard(workdir, limits["boxed"])
    import traceback

    try:
        exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
    except SystemExit as done:
        _exit_as_written(done)
    except BaseException as err:  # the model reads the error, as a person would in a REPL
        print("".join(traceback.format_exception_only(type(err), err)).strip(), file=sys.stderr)
        sys.exit(1)


def _exit_as_written(done: SystemExit) -> None:
    """Exit as the code's SystemExit asks, but say a status above 128 (or below 0) and exit 1:
    bubblewrap exits 128 + N for a box killed by signal N, so `sys.exit(152)` would read as
    SIGXCPU."""
    status = done.code
    if isinstance(status, int) and not 0 <= status <= 128:
        print(f"Error: the process exited with status {status}", file=sys.stderr)
        sys.exit(1)
    raise done


def load_function(spec: str, path: list):
    """The user's tool function; SystemExit with one line saying why it cannot be had."""
    import importlib
    import importlib.util

    target, name = spec.rsplit(":", 1)
    sys.path.extend(path)
    if target.endswith(".py") and not os.path.isfile(target):
        sys.exit(f"no such file {target}")
    try:
        if target.endswith(".py"):
            loader = importlib.util.spec_from_file_location("user_tool", target)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except BaseException as err:  # noqa: BLE001 - the user's module failed to import
        sys.exit(f"importing {target} failed: {_users_error(err)}")
    fn = getattr(module, name, None)
    if not callable(fn):
        sys.exit(f"{target} has no function {name!r}")
    return fn


def run_function(spec: str, path: list, argument: str) -> None:
    fn = load_function(spec, path)
    try:
        print(fn(argument))
    except BaseException as err:  # noqa: BLE001 - the user's error, without rlcli's frames
        sys.exit(_users_error(err))


def _users_error(err: BaseException) -> str:
    """The error with the frames of the user's own code only (none of this script's)."""
    import traceback

    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename != __file__]
    lines = traceback.format_list(frames[-3:]) + traceback.format_exception_only(type(err), err)
    return "".join(lines).strip()


if __name__ == "__main__":
    mode, given = sys.argv[1], sys.stdin.read()
    if mode == "code":
        run_code(given, json.loads(sys.argv[2]))
    elif mode == "check":  # the tool can be imported and called: exit 0, or why not
        load_function(sys.argv[2], json.loads(sys.argv[3]))
    else:
        run_function(sys.argv[2], json.loads(sys.argv[3]), given)
