"""`rlcli rollout-server`: one rollout worker, a `vllm serve` that a learner elsewhere samples
from (`sampler.urls=[http://this-node:PORT]`) and pushes weights to.

It takes the same overrides as `rlcli train` (model, sampler, trainer.dtype), prints the
`vllm serve` command it runs, and replaces itself with it (`serve`), so the worker is plain
vLLM. A port it cannot listen on is a ConfigError before then (`check_port`): vLLM would find
out only after loading the model, with a traceback.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket

from rlcli.config import Config, ConfigError

HOST = "0.0.0.0"  # every interface: the learners are on other nodes


def check_port(port: int) -> None:
    """ConfigError unless this process could listen on `port` (as uvicorn does, with
    SO_REUSEADDR, so a port left in TIME_WAIT by a stopped worker counts as free)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as err:
            why = {
                errno.EADDRINUSE: "is in use on this machine (another rollout worker or server "
                "listens there)",
                errno.EACCES: "needs root (ports below 1024 are privileged)",
            }.get(err.errno, f"cannot be listened on ({err.strerror})")
            raise ConfigError(
                f"sampler.serve_port={port} {why}; choose a free port with "
                "sampler.serve_port=PORT (1024-65535) and name it in the learner's sampler.urls."
            ) from None


def serve(cfg: Config, run_dir) -> None:
    """Replace this process with the worker's `vllm serve`. It holds the weights in the dtype a
    worker the learner starts would (bfloat16 where this device computes in it natively, as
    the learner does; `compute_dtype`), and the learner asks it which before it pushes, so the
    push sends no more bytes than the worker keeps."""
    from rlcli.rollout.workers.processes import server_command
    from rlcli.runtime.init_kwargs import trusts_remote_code
    from rlcli.runtime.models import compute_dtype, pick_device, resolve_model_path

    check_port(cfg.sampler.serve_port)  # before minutes of model conversion
    model_path = resolve_model_path(cfg.model, cfg.trainer.seed)  # a GGUF is converted once
    dtype = compute_dtype(cfg.trainer, pick_device(cfg.trainer.device))
    remote = trusts_remote_code(cfg.model.init_kwargs)  # model.init_kwargs.trust_remote_code
    argv, env = server_command(model_path, dtype, cfg.sampler, cfg.sampler.serve_port, HOST, remote)
    print(
        "rlcli: starting a rollout worker:\n  VLLM_SERVER_DEV_MODE=1 python " + shlex.join(argv[1:])
    )
    print(
        f"rlcli: learners reach it with sampler.urls=[http://<this host>:{cfg.sampler.serve_port}]"
    )
    os.execvpe(argv[0], argv, env)
