"""What a default run shows: on the console rlcli's own lines and its progress bar only; in
train.log no WARNING from the libraries' routine chatter (vLLM's start-up notices, its weight
reloads, W&B's banner), which stays there at INFO. Through the real CLI, in a process of its
own, since vLLM logs its start-up notices once per process."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO

# Where wandb keeps its settings, caches and staged files: the test's own directory.
WANDB_HOME_VARS = ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")


def test_a_default_run_with_every_tracker_prints_rlcli_lines_and_logs_no_warning(tmp_path):
    run_dir = tmp_path / "run"
    # Not VLLM_DIST_IDENT, which an engine started earlier in this process sets (vLLM warns
    # about it as unknown in a process that inherits it; a shell does not have it).
    env = {k: v for k, v in os.environ.items() if k != "VLLM_DIST_IDENT"}
    env["WANDB_MODE"] = "offline"
    env.update({k: str(tmp_path / "wandb_home") for k in WANDB_HOME_VARS})
    command = [sys.executable, "-m", "rlcli", "train", "model=tiny", "reward=space_rate",
               "sampler=vllm", "trainer.max_steps=2", f"hydra.run.dir={run_dir}",
               "logger.backends=[jsonl,wandb,tensorboard,mlflow]"]  # fmt: skip
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]

    log = (run_dir / "train.log").read_text()
    warnings = [line for line in log.splitlines() if "[WARNING]" in line]
    assert warnings == []  # before: 62 (vLLM's start-up notices; 4 per weight push and more)
    assert "[INFO] ParallelLMHead: Failed to load weights" in log  # lowered, not dropped
    assert "Use W&B Weave" in log and "Weave" not in out.stdout + out.stderr

    lines = out.stdout.splitlines()
    assert [line for line in lines if not line.startswith("rlcli: ")] == []
    assert "gpu_memory_utilization" not in out.stdout  # left at its default
    wandb_dir = next(run_dir.glob("wandb/offline-run-*"))
    tensorboard, mlflow = run_dir / "tensorboard", f"sqlite:///{run_dir / 'mlflow.db'}"
    for where in (
        f"rlcli: W&B run kept offline in {wandb_dir} (upload it: wandb sync {wandb_dir})",
        f"rlcli: TensorBoard logs in {tensorboard} (tensorboard --logdir {tensorboard})",
        f"rlcli: MLflow runs in {mlflow} (mlflow ui --backend-store-uri {mlflow})",
    ):
        assert where in lines
    # stderr: the progress bar's frames and nothing else.
    frames = [f for f in re.split(r"[\r\n]", out.stderr) if f.strip()]
    assert frames and [f for f in frames if not f.startswith("train: ")] == []
