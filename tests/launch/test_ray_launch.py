"""`rlcli train launcher=ray` on a real Ray cluster of two nodes on this machine (two raylets
with resources of their own, `ray.cluster_utils.Cluster`): a run, and how each way of
stopping ends. The learner's ranks are gloo processes on the tiny model with transformers'
sampler (the runs with a vLLM rollout worker are in test_ray_workers.py, `pytest -m slow`)."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, tiny
from tests.launch.clusters import left_on, rows, start, two_nodes


@pytest.fixture
def cluster():
    """Two nodes of one CPU each, so that two ranks of one CPU land one on each."""
    made = two_nodes()
    yield made
    made.shutdown()


def test_two_ranks_on_two_nodes_train_and_leave_nothing_behind(cluster, tmp_path):
    run = start(cluster, tmp_path, "launcher.learner_ranks=2", "trainer.max_steps=2")
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert [r["step"] for r in rows(tmp_path)] == [1, 2]
    assert "in 2 processes" in out  # rank 0's console is the launcher's
    # Ray's own log lines stay off the console: every line is rlcli's.
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert all(line.startswith("rlcli") for line in lines), lines
    # One rank on each node: each node has room for one.
    placed = json.loads((tmp_path / "launch" / "placement.json").read_text())
    assert [p["process"] for p in placed] == ["rank 0", "rank 1"]
    assert len({p["node"] for p in placed}) == 2
    assert (tmp_path / "launch" / "rank_1.log").exists()
    # The run directory's history names the launcher's command, not a rank's.
    assert "launcher=ray" in (tmp_path / "config.yaml").read_text()
    assert left_on(cluster) == ([], [])


def test_a_run_larger_than_the_cluster_is_refused_before_anything_starts(cluster, tmp_path):
    run = start(cluster, tmp_path, "launcher.learner_ranks=3")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2
    assert "3 learner ranks × 1 CPU need 3 CPUs; the cluster has 2 (2 nodes)" in err
    assert "Traceback" not in err
    assert left_on(cluster) == ([], [])


def test_ctrl_c_saves_the_step_and_leaves_nothing_behind(cluster, tmp_path):
    run = start(cluster, tmp_path, "launcher.learner_ranks=2", "trainer.max_steps=200")
    while not rows(tmp_path):  # a step done: the ranks are in the loop
        assert run.poll() is None, run.communicate()
        time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 130, err
    saved = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert saved, err  # the step in progress finished and was saved
    assert f"hydra.run.dir={tmp_path}" in err and "launcher=ray" in err  # the resume command
    assert "Traceback" not in err
    assert left_on(cluster) == ([], [])


def test_a_node_lost_ends_the_run_with_the_resume_command(cluster, tmp_path):
    run = start(cluster, tmp_path, "launcher.learner_ranks=2", "trainer.max_steps=200",
                "trainer.save_every=1")  # fmt: skip
    while len(rows(tmp_path)) < 2:
        assert run.poll() is None, run.communicate()
        time.sleep(0.5)
    (second,) = [n for n in cluster.list_all_nodes() if not n.head]
    second.kill_raylet()  # SIGKILL: the node is gone, and the rank it held with it
    out, err = run.communicate(timeout=300)
    assert run.returncode == 1, err
    assert "were lost" in err and "trainer.resume=auto" in err
    assert "Traceback" not in err
    assert sorted((tmp_path / "checkpoints").glob("step_*"))  # the steps saved before it
    assert left_on(cluster) == ([], [])


def test_an_unreachable_head_is_named_at_once(tmp_path):
    # Nothing listens on port 9 here (discard); Ray itself would retry for minutes.
    argv = [sys.executable, "-m", "rlcli", "train", "launcher=ray", "launcher.address=127.0.0.1:9",
            f"hydra.run.dir={tmp_path}", *tiny()]  # fmt: skip
    began = time.monotonic()
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "launcher.address=127.0.0.1:9: no Ray cluster could be joined" in run.stderr
    assert "Traceback" not in run.stderr and time.monotonic() - began < 60


def test_colocated_engines_sample_with_the_weights_their_rank_just_learned(cluster, tmp_path):
    # launcher=ray with no rollout workers: each rank, on its own node, samples from a vLLM
    # engine in its own process (verl's colocated shape). In float32 the engines' log-probs
    # match the learner's to rounding at every step while a high learning rate moves the
    # policy far from where it began, so an engine left with older weights fails.
    run = start(cluster, tmp_path, "launcher.learner_ranks=2", "trainer.max_steps=3",
                "trainer.lr=5e-2", "trainer.bf16_autocast=false", "trainer.dtype=float32",
                sampler="vllm", new_tokens=16)  # fmt: skip
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    metrics = rows(tmp_path)
    assert [r["step"] for r in metrics] == [1, 2, 3]
    assert all(r["rollout/logp_abs_diff"] < 1e-3 for r in metrics), metrics
    assert metrics[-1]["loss/kl"] > 1e-2
