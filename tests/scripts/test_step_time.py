"""scripts/step_time.py: the step-time model of docs/scaling.md, by hand."""

import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from step_time import Cluster, cluster_step, step_seconds, table  # noqa: E402


def test_synchronous_phases_add_up_and_streamed_ones_overlap():
    assert step_seconds(5.0, 7.0, 1.5, 0) == 13.5  # one after another
    assert step_seconds(5.0, 7.0, 1.5, 2) == 8.5  # the slower side, and the push stops both
    assert step_seconds(9.0, 7.0, 1.5, 1) == 10.5
    assert step_seconds(9.0, 7.0, 1.5, 4) == step_seconds(9.0, 7.0, 1.5, 1)
    # gloo's workers generate while the tensors arrive: only the pause stops generation.
    assert step_seconds(9.0, 7.0, 1.5, 2, paused=0.5) == 9.5  # generation the slower side
    assert step_seconds(5.0, 7.0, 1.5, 2, paused=0.5) == 8.5  # the learner sends it all


def test_a_node_split_between_workers_and_learner():
    node = Cluster(gpus=8, generate_tokens_per_s=1000.0, learn_tokens_per_s=2000.0, push_s=1.0)
    # 2 worker GPUs: 8,000 generated tokens / 2,000 tokens/s = 4 s; 6 learner GPUs: 24,000
    # tokens / 12,000 tokens/s = 2 s.
    assert cluster_step(node, 2, 8000.0, 24000.0, 0) == (4.0, 2.0, 7.0)
    assert cluster_step(node, 2, 8000.0, 24000.0, 2) == (4.0, 2.0, 5.0)
    # Colocated: all 8 generate (1 s), then all 8 learn (1.5 s).
    assert cluster_step(node, 0, 8000.0, 24000.0, 2) == (1.0, 1.5, 3.5)
    rows = table(node, 8000.0, 24000.0, 2)
    assert len(rows) == 2 + 8 and rows[2].startswith("| colocated on 8 | 1.0 | 1.5 | 3.5 | - |")
    assert rows[4] == "| 2 worker GPUs, 6 learner | 4.0 | 2.0 | 7.0 | 5.0 |"
