"""`ProcessHost`: one of a run's processes on a node of a Ray cluster. The launcher makes it a
Ray actor placed in the run's bundle for that process (`launch.ray_run`); the actor holds the
node's CPUs and GPUs for it, starts the command (`rlcli train` for a learner rank, `rlcli
rollout-server` for a rollout worker), keeps its output in a log file on the run directory and
hands it to the launcher to print, passes signals on, and ends it.

The command is a process of its own rather than code in the actor, so that a rank is exactly
what torchrun would start: the same entry, the same output, the same exit codes, and its own
handling of Ctrl-C (finish the step, save).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

STDOUT, STDERR = 1, 2


def _as_launched() -> None:
    """In the command's process, before it runs: the signals Ray's worker thread blocks
    unblocked (a blocked mask is inherited, and a rank would never see the Ctrl-C passed on to
    it), and SIGTERM when the actor's process dies (a node lost, the launcher gone), so that no
    rank outlives its placement (Linux)."""
    import ctypes

    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ProcessHost:
    """A command run on the node this actor was placed on."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.relayed: list[tuple[int, bytes]] = []  # (STDOUT or STDERR, bytes) not yet handed on
        self.lock = threading.Lock()
        self.readers: list[threading.Thread] = []

    def node(self) -> tuple[str, str]:
        """(this node's IP address, its Ray node id)."""
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        """A port free on this node now, for the command to listen on."""
        with socket.socket() as probe:
            probe.bind(("0.0.0.0", 0))
            return probe.getsockname()[1]

    def start(self, argv: list[str], env: dict[str, str], cwd: str, log: str, relay: bool) -> int:
        """Start `argv` with `env` added to this node's environment; its output goes to the file
        `log` and, with `relay`, is kept for `output`. Returns its PID."""
        os.makedirs(os.path.dirname(log), exist_ok=True)
        self.process = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its signals are the launcher's to send, not the terminal's
            preexec_fn=_as_launched,
        )
        out = open(log, "ab", buffering=0)  # noqa: SIM115 - closed by the last reader
        streams = ((STDOUT, self.process.stdout), (STDERR, self.process.stderr))
        for stream, pipe in streams:
            reader = threading.Thread(
                target=self._read, args=(stream, pipe, out, relay), daemon=True
            )
            reader.start()
            self.readers.append(reader)
        return self.process.pid

    def _read(self, stream: int, pipe, log, relay: bool) -> None:
        fd = pipe.fileno()
        while chunk := os.read(fd, 65536):
            log.write(chunk)
            if relay:
                with self.lock:
                    self.relayed.append((stream, chunk))

    def output(self) -> list[tuple[int, bytes]]:
        """What the command wrote since the last call (with `relay`), in order per stream."""
        with self.lock:
            chunks, self.relayed = self.relayed, []
        return chunks

    def poll(self) -> int | None:
        """The command's exit code once it has ended and its output is all read, else None."""
        if self.process is None or self.process.poll() is None:
            return None
        for reader in self.readers:
            reader.join(timeout=5)
        return self.process.returncode

    def send(self, sig: int) -> None:
        """Send `sig` to the command's process group."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def end(self, grace: float) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit code."""
        if self.process is None:
            return None
        self.send(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        return self.process.returncode
