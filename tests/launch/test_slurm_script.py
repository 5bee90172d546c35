"""scripts/slurm_ray.sbatch as far as a machine without Slurm allows: Slurm's two commands it
calls are stand-ins here (`scontrol` names this machine as the one node of the allocation,
`srun` runs its command on it), and everything else is real: `ray start`, the run on the
cluster it made, `ray stop`."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.tracking.metrics import read_metrics
from tests.conftest import REPO, tiny

SCONTROL = """#!/bin/sh
# scontrol show hostnames LIST: this machine is the allocation's one node.
hostname
"""
SRUN = """#!/bin/sh
# srun [--nodes=N] [--ntasks=N] [-w NODE] COMMAND...: COMMAND, here.
while [ $# -gt 0 ]; do
  case "$1" in
    -w) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
exec "$@"
"""


# Slow (half a minute: a Ray head started and stopped by the script itself).
@pytest.mark.slow
def test_the_sbatch_script_starts_ray_and_trains_on_it(tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (shims / name).write_text(text)
        (shims / name).chmod(stat.S_IRWXU)
    run_dir = tmp_path / "run"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "node-a", "RLCLI_VENV": sys.prefix, "RAY_PORT": "6391",
           "PYTHONPATH": path}  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    job = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm_ray.sbatch"), f"hydra.run.dir={run_dir}",
         *tiny("trainer.max_steps=1", "trainer.prompts_per_step=2")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    assert "Ray head on" in job.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == [1]
    assert Path(run_dir / "launch" / "placement.json").exists()  # placed on the job's cluster
