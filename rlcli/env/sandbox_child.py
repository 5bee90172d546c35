"""The process a python tool call (or a user's tool function) runs in; the standard library
only, started by `sandbox.py` as `python -I -u sandbox_child.py MODE ...` with the call's
input on stdin, in a fresh temporary directory.

`code` mode, before the model's code runs, in this order:
1. network: a network namespace of its own (`unshare`: no interfaces but a loopback that is
   down), where the kernel allows one;
2. resource limits: CPU seconds, address space, file size, no child processes (the kernel
   does not hold root to this one), no core file;
3. an audit hook (PEP 578) refusing sockets, processes, ctypes, and opening, listing or
   changing files outside the temporary directory and the Python installation (read-only).
It keeps the user's identity: an interpreter installed under a private home (pyenv under
/root) could not import its own standard library as `nobody`.
Each layer is checked by the tests; the README says what they do not stop.

`function` mode imports the user's tool (`file.py:name` or `module:name`) and prints what it
returns for the argument: the user's own code, limited only in time and output by the parent.
"""

import json
import os
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
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
    ):
        resource.setrlimit(limit, (value, value))


def install_guard(workdir: str) -> None:
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
        if event.startswith(REFUSED):
            raise PermissionError(f"the python tool's sandbox refuses {event}")
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
    workdir = os.path.realpath(os.getcwd())
    isolate_network()
    set_limits(limits["cpu_s"], limits["memory_mb"])
    install_guard(workdir)
    import traceback

    try:
        exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
    except SystemExit:
        raise
    except BaseException as err:  # the model reads the error, as a person would in a REPL
        print("".join(traceback.format_exception_only(type(err), err)).strip(), file=sys.stderr)
        sys.exit(1)


def run_function(spec: str, path: list, argument: str) -> None:
    import importlib
    import importlib.util

    target, name = spec.rsplit(":", 1)
    sys.path.extend(path)
    if target.endswith(".py"):
        loader = importlib.util.spec_from_file_location("user_tool", target)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    print(getattr(module, name)(argument))


if __name__ == "__main__":
    mode, given = sys.argv[1], sys.stdin.read()
    if mode == "code":
        run_code(given, json.loads(sys.argv[2]))
    else:
        run_function(sys.argv[2], json.loads(sys.argv[3]), given)
