"""A real Ray cluster of two nodes on this machine for the launcher's tests, and what a run
leaves on it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from tests.conftest import REPO, tiny


def two_nodes(head_cpus: int = 1, other_cpus: int = 1) -> Cluster:
    """Two raylets with resources of their own: the head and one more node."""
    made = Cluster(initialize_head=True,
                   head_node_args={"num_cpus": head_cpus, "include_dashboard": False})  # fmt: skip
    made.add_node(num_cpus=other_cpus)
    made.wait_for_nodes()
    return made


def start(cluster, run_dir: Path, *overrides: str, sampler="hf", new_tokens=8) -> subprocess.Popen:
    """`rlcli train launcher=ray` joining `cluster`, as a user types it: a short run on the tiny
    model (`conftest.tiny`), then `overrides`."""
    run = tiny("trainer.prompts_per_step=2", *overrides, sampler=sampler, new_tokens=new_tokens)
    argv = [sys.executable, "-m", "rlcli", "train", "launcher=ray", f"hydra.run.dir={run_dir}",
            *run]  # fmt: skip
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "PYTHONPATH": path}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def left_on(cluster) -> tuple[list, list]:
    """The run's actors still alive and its placement groups not removed."""
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        from ray._private.state import state

        actors = [a for a in state.actor_table(None).values() if a["State"] != "DEAD"]
        groups = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
        return actors, groups
    finally:
        ray.shutdown()


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
