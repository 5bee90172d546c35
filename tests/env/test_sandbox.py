"""The python tool's sandbox, attacked: code a model writes tries to read, write, reach, signal,
outlive or exhaust what lies outside its box, and each attempt is checked from outside.

Things are planted around a stand-in trainer (a real process that calls
`rlcli.env.sandbox.run_python`, as the episode loop does): a secret file in the host's /tmp, a
run directory with a checkpoint, a token in the trainer's environment, its console, a TCP and a
UDP listener on 127.0.0.1, a Unix socket in /tmp and an abstract one, a file in /dev/shm, the
Python installation the trainer imports from. Most attacks first switch off the audit hook that
used to be the whole sandbox (it still runs, for clearer messages), because nothing may depend
on it: the operating system's isolation (bubblewrap's namespaces, an unprivileged user, rlimits,
a bounded tmpfs) must hold on its own. Each test failed against the hook-based sandbox.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (scripts/setup.sh does it)"
)

# Switches the audit hook off from inside (its refusal lists and its path check), as the
# first escapes did: what follows must be stopped by the operating system.
HOOK_OFF = textwrap.dedent("""
    import os, sys
    _m = sys.modules["__main__"]
    for _name in ("REFUSED", "REFUSED_IN_BOX", "MODULES", "WRITES", "READS"):
        setattr(_m, _name, ())
    os.path.realpath = lambda p, *a, **k: "/dev/null"
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
""")

# RLCLI_ESCAPE_SANDBOX=none runs the attacks against the unsandboxed process (the old
# hook-based sandbox, kept as env.sandbox=none): every test but the first then fails, as it
# should (measured: 22 failed, 1 passed).
TRAINER = textwrap.dedent("""
    import json, os, sys
    from rlcli.env.sandbox import run_python
    sandbox = os.environ.get("RLCLI_ESCAPE_SANDBOX", "bwrap")
    for line in sys.stdin:
        result = run_python(json.loads(line), 5.0, 512, sandbox=sandbox)
        print("RESULT " + json.dumps([result.text, result.error, result.timeout]), flush=True)
""")


class Trainer:
    """A process that runs tool calls as the trainer does, with a token in its environment;
    its stdout is its console, read line by line (a line that is not a RESULT was written
    there by someone else)."""

    def __init__(self, token: str):
        env = {**os.environ, "RLCLI_ESCAPE_TOKEN": token, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TRAINER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # a process group of its own, as a signal's target
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.foreign: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def run(self, code: str, timeout: float = 60) -> tuple[str, bool, bool]:
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line.startswith("RESULT "):
                return tuple(json.loads(line[len("RESULT ") :]))
            self.foreign.append(line)

    def alive(self) -> bool:
        return self.proc.poll() is None


class Listener:
    """A socket that records whoever reaches it."""

    def __init__(self, family, kind, address):
        self.sock = socket.socket(family, kind)
        self.sock.bind(address)
        self.reached: list[bytes] = []
        if kind == socket.SOCK_STREAM:
            self.sock.listen()
        self.sock.settimeout(0.2)
        self.address = self.sock.getsockname()
        self.kind = kind
        self.stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop:
            try:
                if self.kind == socket.SOCK_STREAM:
                    conn, _ = self.sock.accept()
                    self.reached.append(b"connect")
                    conn.close()
                else:
                    self.reached.append(self.sock.recv(100))
            except (TimeoutError, OSError):
                continue


@pytest.fixture
def world(tmp_path_factory):
    """Everything planted outside the box, and the trainer: new for each test, so that one
    attack that succeeds cannot hide what the next does."""
    token = "tok-" + secrets.token_hex(8)
    host_tmp = Path(tempfile.mkdtemp(prefix="rlcli-escape-", dir="/tmp"))
    secret = host_tmp / "secret.txt"
    secret.write_text(token)
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "checkpoint.pt").write_text("weights")
    shm = Path("/dev/shm") / f"rlcli-escape-{token}"
    shm.write_text(token)
    unix_path = str(host_tmp / "zmq.sock")
    abstract = "\0rlcli-escape-" + token
    listeners = {
        "tcp": Listener(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)),
        "udp": Listener(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)),
        "unix": Listener(socket.AF_UNIX, socket.SOCK_STREAM, unix_path),
        "abstract": Listener(socket.AF_UNIX, socket.SOCK_STREAM, abstract),
    }
    trainer = Trainer(token)
    yield {
        "token": token,
        "tmp": host_tmp,
        "secret": secret,
        "run_dir": run_dir,
        "shm": shm,
        "unix": unix_path,
        "abstract": abstract,
        "listeners": listeners,
        "trainer": trainer,
    }
    trainer.proc.kill()
    for listener in listeners.values():
        listener.stop = True
        listener.sock.close()
    shm.unlink(missing_ok=True)
    shutil.rmtree(host_tmp, ignore_errors=True)


def attack(world, body: str) -> str:
    """Run HOOK_OFF + body in the sandbox through the trainer; the text the model reads."""
    text, _, _ = world["trainer"].run(HOOK_OFF + textwrap.dedent(body))
    return text


def assert_untouched(world):
    """Nothing planted was reached, changed or signalled."""
    trainer = world["trainer"]
    assert trainer.alive(), "the trainer was killed"
    assert trainer.foreign == [], f"lines written into the trainer's console: {trainer.foreign}"
    for name, listener in world["listeners"].items():
        assert listener.reached == [], f"the {name} listener was reached"
    assert world["secret"].read_text() == world["token"]
    assert (world["run_dir"] / "checkpoint.pt").read_text() == "weights"
    assert sorted(p.name for p in world["run_dir"].iterdir()) == ["checkpoint.pt"]


# --- the escapes that were found in the hook-based sandbox -------------------------------------


def test_the_hook_is_really_off_in_these_attacks(world):
    """Otherwise the tests below would show the hook holding, not the box."""
    probe = "import socket\nsocket.socket()\nprint('sockets')\n"
    text, error, _ = world["trainer"].run(probe)
    assert error and "sandbox refuses socket" in text
    assert attack(world, probe) == "sockets"


def test_hook_state_rewritten_then_a_shell_reads_the_secret(world):
    out = attack(
        world,
        f"""
        import subprocess
        print(subprocess.run(["cat", {str(world["secret"])!r}], capture_output=True, text=True))
    """,
    )
    assert world["token"] not in out
    assert_untouched(world)


def test_hook_globals_through_a_frame_and_closure_cells_through_gc(world):
    out = attack(
        world,
        f"""
        import gc
        for obj in gc.get_objects():
            if callable(obj) and getattr(obj, "__name__", "") == "hook":
                for cell in obj.__closure__ or ():
                    try:
                        if isinstance(cell.cell_contents, str):
                            cell.cell_contents = "/"
                    except ValueError:
                        pass
        try:
            print(sys._getframe(1).f_globals.keys())
        except ValueError:
            pass
        import builtins
        builtins.any = lambda *args: True  # the path check's own helper, made to agree
        print(open({str(world["secret"])!r}).read())
    """,
    )
    assert world["token"] not in out
    assert_untouched(world)


def test_dir_fd_opens_reach_the_trainers_environment_and_console(world):
    pid = world["trainer"].pid
    out = attack(
        world,
        f"""
        os.makedirs("a/b", exist_ok=True)
        os.chdir("a/b")
        up = os.open("/", os.O_RDONLY)
        for rel in ("proc/{pid}/environ", "proc/1/environ", "proc/self/../{pid}/environ"):
            try:
                fd = os.open(rel, os.O_RDONLY, dir_fd=up)
                print(os.read(fd, 100000))
            except OSError as err:
                print("no", err)
        try:
            fd = os.open("proc/{pid}/fd/1", os.O_WRONLY, dir_fd=up)
            os.write(fd, ("IN" + "JECTED line\\n").encode())
        except OSError as err:
            print("no", err)
    """,
    )
    assert world["token"] not in out
    assert_untouched(world)


def test_rename_link_symlink_and_mknod_outside(world):
    tmp = world["tmp"]
    out = attack(
        world,
        f"""
        for fn, args in (
            (os.link, ({str(world["secret"])!r}, "stolen")),
            (os.symlink, ("/etc/passwd", {str(tmp / "planted_link")!r})),
            (os.mkfifo, ({str(tmp / "planted_fifo")!r},)),
            (os.mknod, ({str(tmp / "planted_node")!r},)),
            (os.rename, ({str(world["run_dir"] / "checkpoint.pt")!r}, "mine.pt")),
            (os.replace, ("x" if open("x", "w") else "", {str(tmp / "planted_replace")!r})),
        ):
            try:
                fn(*args)
                print("did", fn.__name__)
            except OSError as err:
                print("no", fn.__name__, err.errno)
        try:
            print(open("stolen").read())
        except OSError:
            pass
    """,
    )
    assert world["token"] not in out
    assert not any(
        (tmp / n).exists() or (tmp / n).is_symlink()
        for n in ("planted_link", "planted_fifo", "planted_node", "planted_replace")
    )
    assert_untouched(world)


def test_stat_leaks_no_metadata_of_host_files(world):
    out = attack(
        world,
        f"""
        for path in ({str(world["secret"])!r}, {str(world["run_dir"])!r}, "/etc/passwd",
                     {str(REPO / "README.md")!r}):
            try:
                print("LEAK", path, os.stat(path).st_size)
            except OSError:
                pass
    """,
    )
    assert "LEAK" not in out
    assert_untouched(world)


def test_native_fork_exec_through_cffi(world):
    out = attack(
        world,
        f"""
        import cffi
        ffi = cffi.FFI()
        ffi.cdef("int fork(void); int execv(const char *, char *const []); int getpid(void);")
        lib = ffi.dlopen(None)
        pid = lib.fork()
        if pid == 0:
            argv = [ffi.new("char[]", b"/bin/sh"), ffi.new("char[]", b"-c"),
                    ffi.new("char[]", b"cat {str(world["secret"])}"), ffi.NULL]
            lib.execv(b"/bin/sh", ffi.new("char *[]", argv))
            os._exit(1)
        print("fork returned", pid)
        if pid > 0:
            os.waitpid(pid, 0)
    """,
    )
    assert world["token"] not in out
    assert "fork returned -1" in out
    assert_untouched(world)


def test_setns_back_into_the_hosts_network(world):
    port = world["listeners"]["tcp"].address[1]
    pid = world["trainer"].pid
    out = attack(
        world,
        f"""
        import socket
        SYS_pidfd_open, CLONE_NEWNET = 434, 0x40000000
        for target in (os.getppid(), {pid}, 1):
            fd = libc.syscall(SYS_pidfd_open, target, 0)
            print("pidfd", target, fd, libc.setns(fd, CLONE_NEWNET) if fd >= 0 else None)
        for path in ("/proc/{pid}/ns/net", "/proc/1/ns/net"):
            try:
                fd = os.open(path, os.O_RDONLY)
                print("setns", path, libc.setns(fd, CLONE_NEWNET))
            except OSError as err:
                print("no", path)
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=1)
            print("connected")
        except OSError as err:
            print("unreachable", err)
    """,
    )
    assert "connected" not in out.replace("unreachable", "")
    assert_untouched(world)


def test_unix_socket_in_the_hosts_tmp_zeromq_ipc(world):
    out = attack(
        world,
        f"""
        import zmq
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect("ipc://{world["unix"]}")
        s.send(b"hello", flags=zmq.NOBLOCK) if s.poll(500, zmq.POLLOUT) else None
        import socket
        c = socket.socket(socket.AF_UNIX)
        try:
            c.connect({world["unix"]!r})
            print("connected")
        except OSError as err:
            print("no", err)
    """,
    )
    time.sleep(0.5)
    assert "connected" not in out
    assert_untouched(world)


def test_the_trainer_cannot_be_signalled_or_its_limits_changed(world):
    pid = world["trainer"].pid
    limits = Path(f"/proc/{pid}/limits").read_text()
    out = attack(
        world,
        f"""
        import signal, resource
        for fn in (lambda: signal.pidfd_send_signal(os.pidfd_open({pid}), signal.SIGKILL),
                   lambda: os.kill({pid}, signal.SIGKILL),
                   lambda: os.killpg(os.getpgid({pid}), signal.SIGKILL),
                   lambda: os.kill(os.getppid(), signal.SIGKILL),
                   lambda: resource.prlimit({pid}, resource.RLIMIT_NOFILE, (3, 3)),
                   lambda: __import__("psutil").Process({pid}).rlimit(
                       __import__("psutil").RLIMIT_NOFILE, (3, 3)),
                   lambda: __import__("psutil").Process(os.getppid()).kill()):
            try:
                fn()
                print("done")
            except (OSError, ValueError) as err:
                print("no", err)
    """,
    )
    time.sleep(0.3)
    assert world["trainer"].alive() and Path(f"/proc/{pid}/limits").read_text() == limits, out
    assert_untouched(world)


def test_no_process_outlives_the_call(world):
    marker = "rlcli-outlive-" + secrets.token_hex(4)
    attack(
        world,
        f"""
        import subprocess
        for _ in range(3):
            try:
                subprocess.Popen(["/bin/sh", "-c", "sleep 30; : {marker}"], start_new_session=True)
            except OSError as err:
                print("no", err)
            try:
                if os.fork() == 0:
                    os.setsid()
                    os.execv("/bin/sh", ["sh", "-c", "sleep 30; : {marker}"])
            except OSError as err:
                print("no", err)
    """,
    )
    time.sleep(0.5)
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_text():
                alive.append(proc.name)
        except OSError:
            continue
    assert alive == []
    assert_untouched(world)


def test_the_process_limit_binds(world):
    out = attack(
        world,
        """
        import threading
        forks = 0
        for _ in range(20):
            try:
                if os.fork() == 0:
                    os._exit(0)
                forks += 1
            except OSError:
                pass
        threads = 0
        for _ in range(20):
            try:
                threading.Thread(target=lambda: None).start()
                threads += 1
            except RuntimeError:
                pass
        print("forks", forks, "threads", threads)
    """,
    )
    assert "forks 0 threads 0" in out, out
    assert_untouched(world)


def test_the_writable_space_is_bounded_and_leaves_nothing_behind(world):
    before = shutil.disk_usage("/tmp").used
    start = time.monotonic()
    out = attack(
        world,
        """
        written = 0
        try:
            for i in range(80):
                with open(f"f{i}", "wb") as f:
                    for _ in range(8):
                        f.write(b"x" * 2**20)
                        written += 2**20
        except OSError as err:
            print("stopped", err.errno)
        print("MiB", written >> 20)
    """,
    )
    mib = int(out.split("MiB")[1].split()[0])
    assert "stopped" in out and 32 <= mib <= 64, out  # filled up to the 64 MiB tmpfs
    assert time.monotonic() - start < 10
    assert shutil.disk_usage("/tmp").used - before < 100 * 2**20
    assert_untouched(world)


def test_an_immutable_file_inside_stops_nothing(world):
    leftovers = set(Path(tempfile.gettempdir()).glob("rlcli-tool-*"))
    out = attack(
        world,
        """
        import fcntl, struct
        open("stuck", "w").write("x")
        fd = os.open("stuck", os.O_RDONLY)
        FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x40086602, 0x10
        try:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", FS_IMMUTABLE_FL))
            print("immutable")
        except OSError as err:
            print("no", err)
    """,
    )
    assert "immutable" not in out.replace("no", "")
    assert set(Path(tempfile.gettempdir()).glob("rlcli-tool-*")) == leftovers
    assert world["trainer"].run("print(6 * 7)")[0] == "42"  # the next call still works
    assert_untouched(world)


# --- more: files, sockets and the machine ------------------------------------------------------


def test_files_planted_in_tmp_dev_shm_and_the_run_directory_are_not_there(world):
    out = attack(
        world,
        f"""
        for path in ({str(world["secret"])!r}, {str(world["shm"])!r},
                     {str(world["run_dir"] / "checkpoint.pt")!r}):
            try:
                print(open(path).read())
                open(path, "w").write("overwritten")
            except OSError as err:
                print("no", err.errno)
        try:
            os.remove({str(world["run_dir"] / "checkpoint.pt")!r})
        except OSError:
            pass
        print(os.listdir("/tmp"), os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else "")
    """,
    )
    assert world["token"] not in out and "rlcli-escape" not in out
    assert world["shm"].read_text() == world["token"]
    assert_untouched(world)


def test_the_trainers_environment_is_not_in_any_process_of_the_box(world):
    out = attack(
        world,
        """
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    print(pid, open(f"/proc/{pid}/environ").read())
                except OSError as err:
                    print(pid, "no", err.errno)
        print(dict(os.environ))
    """,
    )
    assert world["token"] not in out
    assert_untouched(world)


def test_the_hosts_processes_are_not_visible(world):
    pid = world["trainer"].pid
    out = attack(
        world,
        f"""
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        print("PIDS", len(pids))
        for path in ("/proc/{pid}/cmdline", "/proc/{pid}/root/etc/hostname"):
            try:
                print("READ", open(path, "rb").read()[:50])
            except OSError:
                pass
    """,
    )
    assert "READ" not in out and int(out.split("PIDS")[1].split()[0]) <= 3, out
    assert_untouched(world)


def test_udp_ipv6_and_abstract_sockets_reach_nothing(world):
    udp = world["listeners"]["udp"].address[1]
    tcp = world["listeners"]["tcp"].address[1]
    out = attack(
        world,
        f"""
        import socket
        fd = libc.syscall(434, os.getppid(), 0)  # pidfd_open: the parent's network, if seen
        if fd >= 0:
            libc.setns(fd, 0x40000000)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.sendto(b"hello", ("127.0.0.1", {udp}))
        except OSError as err:
            print("no", err)
        for family, host in ((socket.AF_INET6, "::ffff:127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                socket.create_connection((host, {tcp}), timeout=1)
                print("connected")
            except OSError:
                pass
        a = socket.socket(socket.AF_UNIX)
        try:
            a.connect({world["abstract"]!r})
            print("connected")
        except OSError as err:
            print("no", err)
    """,
    )
    time.sleep(0.3)
    assert "connected" not in out
    assert_untouched(world)


def test_the_python_installation_cannot_be_changed(world):
    """A .pth file in site-packages would run code in the trainer's next start."""
    site = Path(sysconfig.get_paths()["purelib"])
    planted = site / "rlcli_escape_planted.pth"
    out = attack(
        world,
        f"""
        try:
            open({str(planted)!r}, "w").write("import os; os.system('id')\\n")
            print("written")
        except OSError as err:
            print("no", err.errno)
        try:
            open(os.path.join(os.path.dirname(os.__file__), "rlcli_planted.py"), "w")
            print("written")
        except OSError as err:
            print("no", err.errno)
    """,
    )
    stdlib = Path(os.__file__).parent / "rlcli_planted.py"
    exists = planted.exists() or stdlib.exists()
    planted.unlink(missing_ok=True)
    stdlib.unlink(missing_ok=True)
    assert not exists and "written" not in out, out
    assert_untouched(world)


def test_ptrace_and_process_memory_of_the_trainer(world):
    pid = world["trainer"].pid
    out = attack(
        world,
        f"""
        PTRACE_ATTACH = 16
        print("ptrace", libc.ptrace(PTRACE_ATTACH, {pid}, 0, 0), ctypes.get_errno())
        try:
            with open("/proc/{pid}/mem", "rb") as f:
                print("MEM", len(f.read(10)))
        except OSError as err:
            print("no", err.errno)
    """,
    )
    assert "MEM" not in out and "ptrace 0 " not in out, out
    assert_untouched(world)


def test_new_namespaces_and_mounts_are_refused(world):
    """An unprivileged user namespace gives the code a root of its own to attack the kernel
    with; the box allows none."""
    out = attack(
        world,
        """
        CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000
        print("unshare", libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
        print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
    """,
    )
    assert "unshare -1" in out and "mount -1" in out, out
    assert_untouched(world)


def test_memory_through_shared_memory_is_bounded_and_the_run_goes_on(world):
    """RLIMIT_AS does not count tmpfs pages: a file in /dev/shm is memory nobody frees."""
    marker = "rlcli-hog-" + secrets.token_hex(4)
    start = time.monotonic()
    out = attack(
        world,
        f"""
        written = 0
        try:
            for i in range(64):
                with open(f"/dev/shm/{marker}-{{i}}", "wb") as f:
                    for _ in range(15):
                        f.write(b"x" * 2**20)
                        written += 2**20
        except OSError as err:
            print("stopped", err.errno)
        print("MiB", written >> 20)
        x = bytearray(4 * 1024**3)
    """,
    )
    leaked = list(Path("/dev/shm").glob(marker + "*"))
    for path in leaked:
        path.unlink()
    assert leaked == [] and 32 <= int(out.split("MiB")[1].split()[0]) <= 64, out
    assert "MemoryError" in out
    text, _, timeout = world["trainer"].run(HOOK_OFF + "import time; time.sleep(600)")
    assert timeout and time.monotonic() - start < 30
    assert world["trainer"].run("print(6 * 7)")[0] == "42"
    assert_untouched(world)


def test_the_user_in_the_box_is_not_root_and_has_no_capabilities(world):
    out = attack(
        world,
        """
        status = open("/proc/self/status").read()
        caps = [line.split()[1] for line in status.splitlines() if line.startswith("Cap")]
        print("UID", os.getuid(), "CAPS", " ".join(caps))
        try:
            os.setuid(0)
            print("became root")
        except OSError:
            pass
    """,
    )
    assert "became root" not in out and "UID 0 " not in out
    caps = out.split("CAPS")[1].split()
    assert all(int(c, 16) == 0 for c in caps), out
    assert_untouched(world)


# --- issue 42: a network across the namespace, memory outside the limits, processes ------------

x86_64_only = pytest.mark.skipif(
    __import__("platform").machine() != "x86_64", reason="the seccomp filter is x86-64's"
)


@x86_64_only
def test_vsock_and_families_that_cross_the_network_namespace_are_refused(world):
    """AF_VSOCK reaches the hypervisor's host whatever the network namespace; the filter lets
    a socket be made only in the families the namespace contains (Unix, IP, netlink)."""
    out = attack(
        world,
        """
        import socket
        AF_VSOCK, AF_BLUETOOTH, AF_ALG, AF_TIPC = 40, 31, 38, 30
        for family in (AF_VSOCK, AF_BLUETOOTH, AF_ALG, AF_TIPC):
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
                try:
                    s = socket.socket(family, kind)
                    print("made", family, kind, s)
                except OSError as err:
                    print("no", family, err.errno)
            try:
                socket.socketpair(family, socket.SOCK_STREAM)
                print("made pair", family)
            except OSError as err:
                print("no", family, err.errno)
        for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):  # still made
            socket.socket(family, socket.SOCK_STREAM).close()
        print("DONE")
    """,
    )
    assert "made" not in out and "DONE" in out, out
    assert {line.split()[2] for line in out.splitlines() if line.startswith("no ")} == {"1"}, out
    assert_untouched(world)


# Holds HOLD MiB, twice the box's memory limit (BOX_MB), in ways that RLIMIT_AS does not count:
# memfds, System V shared memory (attached a MiB at a time, then detached), extended
# attributes of tmpfs files (64 KiB each, the largest value) and data queued on Unix sockets.
BOX_MB, HOLD = 64, 128
HOG = textwrap.dedent(f"""
    import socket
    chunk = b"x" * 2**20

    def hold(name, fill):
        held = 0
        try:
            while held < {HOLD} * 2**20:
                held += fill()
        except OSError as err:
            print(name, "refused", err.errno)
        print(name, "MiB", held >> 20)

    kept = []
    def in_memfd():  # a memfd per MiB: RLIMIT_FSIZE bounds each
        kept.append(os.memfd_create("hog"))
        return os.write(kept[-1], chunk)

    libc.shmat.restype = ctypes.c_void_p
    def in_shm():
        sid = libc.shmget(0, 2**20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        if sid < 0:
            raise OSError(ctypes.get_errno(), "shmget")
        addr = libc.shmat(sid, None, 0)
        if addr is None or addr == 2**64 - 1:
            raise OSError(ctypes.get_errno(), "shmat")
        ctypes.memmove(addr, chunk, 2**20)
        libc.shmdt(ctypes.c_void_p(addr))
        return 2**20

    def in_xattrs():
        path = f"/tmp/x{{len(kept)}}"
        kept.append(open(path, "w").close())
        for j in range(16):
            os.setxattr(path, f"user.{{j}}", chunk[: 2**16])
        return 2**20

    def in_sockets():  # a socket pair filled until it would block
        a, b = socket.socketpair()
        kept.append((a, b))
        a.setblocking(False)
        sent = 0
        try:
            while True:
                sent += a.send(chunk[: 2**16])
        except BlockingIOError:
            return sent

    hold("memfd", in_memfd)
    hold("shm", in_shm)
    hold("xattr", in_xattrs)
    hold("sockets", in_sockets)
""")


@x86_64_only
def test_memory_outside_the_address_space_is_refused():
    """memfd_create, shmget and setxattr held host memory beyond the box's limit (3.2, 2.4 and
    2.1 GiB from a 1 GiB box): the filter refuses them, and nothing is held. Queued socket
    data is bounded by the open-file limit, far below the box's."""
    from rlcli.env.sandbox import run_python

    out = run_python(HOOK_OFF + HOG, 30, BOX_MB).text
    lines = set(out.splitlines())
    for name in ("memfd", "shm", "xattr"):
        assert {f"{name} refused 1", f"{name} MiB 0"} <= lines, out
    assert "sockets refused 24" in lines, out  # EMFILE
    held = [int(line.split()[2]) for line in lines if line.startswith("sockets MiB")]
    assert held and held[0] < BOX_MB // 2, out


# A user that is not root, for the box's other branch (bubblewrap's user namespace): root
# becomes it through setpriv and runs the system's Python (a venv's interpreter may lie under
# /root, which that user cannot reach), importing sandbox.py without rlcli's package
# __init__s, which need the venv.
OTHER_UID = 4242
AS_USER = textwrap.dedent("""
    import json, sys, types
    for name in ("rlcli", "rlcli.env"):
        module = types.ModuleType(name)
        module.__path__ = [sys.argv[1] + "/" + name.replace(".", "/")]
        sys.modules[name] = module
    from rlcli.env.sandbox import run_python
    print(json.dumps(run_python(sys.stdin.read(), 20, 512).text))
""")


def as_another_user(code: str) -> str:
    """What `code` prints in a box started by a user that is not root; skips where that
    cannot be arranged here."""
    if os.geteuid() != 0:
        from rlcli.env.sandbox import run_python

        return run_python(code, 20, 512).text
    python = "/usr/bin/python3"
    if shutil.which("setpriv") is None or not os.access(python, os.X_OK):
        pytest.skip("root needs setpriv and /usr/bin/python3 to start a box as another user")
    user = [f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]
    command = ["setpriv", *user, python, "-c", AS_USER, str(REPO)]
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        command, input=code, capture_output=True, text=True, cwd="/", env=env, timeout=120
    )
    if done.returncode != 0 or not done.stdout.strip():
        pytest.skip(f"a box as uid {OTHER_UID} could not start here: {done.stderr[-300:]}")
    return json.loads(done.stdout.splitlines()[-1])


@x86_64_only
def test_a_non_root_users_box_makes_no_process_or_thread():
    """RLIMIT_NPROC counts processes per real user: in a box started by another user that is
    the caller's own count, shared with everything the caller runs (152 processes got
    through). The filter refuses the calls themselves, EPERM, whatever any count says."""
    out = as_another_user(
        HOOK_OFF
        + textwrap.dedent("""
        import threading
        SIGCHLD = 17
        for name, make in (("fork", os.fork),
                           ("clone", lambda: libc.syscall(56, SIGCHLD, 0, 0, 0, 0)),
                           ("thread", lambda: threading.Thread(target=lambda: None).start())):
            try:
                if make() in (0, None) and name != "thread":
                    os._exit(0)
                print(name, "made", ctypes.get_errno())
            except (OSError, RuntimeError) as err:
                print(name, "refused", getattr(err, "errno", None))
        print("uid", os.getuid())
    """)
    )
    said = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert said["fork"] == ["refused", "1"] and said["thread"][0] == "refused", out
    assert said["clone"] == ["made", "1"], out  # libc.syscall's -1, errno EPERM
    assert said["uid"] != ["0"], out


def test_a_non_root_users_box_has_no_unbounded_writable_place():
    """Started by another user, bubblewrap's root and /dev are tmpfs owned by that user:
    writable and sized at half the machine's memory. Every writable place must be bounded."""
    out = as_another_user(
        HOOK_OFF
        + textwrap.dedent("""
        chunk = b"x" * 2**20
        for place in ("/", "/dev", "/rlcli", "/usr", "/tmp", "/dev/shm"):
            mib = 0
            try:
                for i in range(96):  # a file per MiB: RLIMIT_FSIZE bounds each
                    with open(os.path.join(place, f"fill{i}"), "wb") as f:
                        f.write(chunk)
                    mib += 1
            except OSError:
                pass
            print(place, "MiB", mib)
    """)
    )
    held = {line.split()[0]: int(line.split()[2]) for line in out.splitlines() if " MiB " in line}
    assert len(held) == 6 and max(held.values()) <= 64, out
    assert held["/"] == held["/dev"] == held["/rlcli"] == held["/usr"] == 0, out


def test_kernel_memory_of_many_files_counts_against_the_box():
    """Empty files cost no tmpfs space but ~1 KiB of kernel memory each, bounded by no rlimit
    and no size (310,000 made in 8 s; a tmpfs allows 3 million). Where a memory cgroup can be
    made, as root here, it counts them with the rest: a box of 64 MiB (plus 2 MiB of tmpfs and
    64 MiB for the kernel) is stopped long before 400,000 (~400 MiB)."""
    from rlcli.env import box_cgroup, sandbox

    if not box_cgroup.cgroup_places():
        pytest.skip("no memory cgroup can be made here (cgroup v2 without delegation)")
    code = """
        n = 0
        try:
            while n < 400_000:
                os.close(os.open(f"/tmp/{n}", os.O_CREAT | os.O_WRONLY, 0o600))
                n += 1
                if n % 10_000 == 0:
                    print("files", n, flush=True)
        except OSError as err:
            print("stopped", err.errno)
        print("files", n)
    """
    done = sandbox.run_python(HOOK_OFF + textwrap.dedent(code), 60, 64, disk_mb=1)
    made = [int(line.split()[1]) for line in done.text.splitlines() if line.startswith("files")]
    assert not done.timeout and made and made[-1] < 200_000, done.text[-300:]
