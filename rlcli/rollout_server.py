"""`rlcli rollout-server`: one rollout worker, a `vllm serve` that a learner elsewhere samples
from (`sampler.urls=[http://this-node:PORT]`) and pushes weights to.

It takes the same overrides as `rlcli train` (model, sampler, trainer.dtype), prints the
`vllm serve` command it runs, and replaces itself with it, so the worker is plain vLLM.
"""

from __future__ import annotations

import os
import shlex

from rlcli.config import Config


def serve(cfg: Config, run_dir) -> None:
    from rlcli.rollout.servers import server_command
    from rlcli.runtime.models import resolve_model_path

    model_path = resolve_model_path(cfg.model, cfg.trainer.seed)  # a GGUF is converted once
    dtype = cfg.trainer.dtype
    argv, env = server_command(model_path, dtype, cfg.sampler, cfg.sampler.serve_port, "0.0.0.0")
    print(
        "rlcli: starting a rollout worker:\n  VLLM_SERVER_DEV_MODE=1 python " + shlex.join(argv[1:])
    )
    print(
        f"rlcli: learners reach it with sampler.urls=[http://<this host>:{cfg.sampler.serve_port}]"
    )
    os.execvpe(argv[0], argv, env)
