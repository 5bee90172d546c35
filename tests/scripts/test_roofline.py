"""scripts/roofline.py, the model of the learner's GPU step (issue 56): its arithmetic by hand,
and its count of a 2-layer model of Qwen2.5-1.5B's widths, which fails if the step's bytes per
trained token, kernels or host reads regress."""

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import roofline  # noqa: E402
from roofline import CARDS, LADDER, Op, Setup, fuse, op_seconds, predicted  # noqa: E402


def test_each_operator_takes_the_longest_of_its_flops_its_bytes_and_a_launch():
    h200 = CARDS["H200"]
    matmul = Op("mm", "matmul", flops=762e9, bytes=1e6)  # 1 ms of FLOPs, 0.25 us of bytes
    copy = Op("add", "memory", flops=0.0, bytes=4.08e9)  # 1 ms of bytes at 85% of 4.8 TB/s
    tiny = Op("add", "memory", flops=0.0, bytes=8)
    assert op_seconds(matmul, h200, "sdpa") == pytest.approx(1e-3)
    assert op_seconds(copy, h200, "sdpa") == pytest.approx(1e-3)
    assert op_seconds(tiny, h200, "sdpa") == h200.kernel_s
    # Attention at the reference layer's FLOPs takes the measured layer's time, by kernel.
    layer = Op("sdpa", "attention", flops=roofline.REFERENCE_ATTENTION, bytes=0)
    assert op_seconds(layer, h200, "sdpa") == pytest.approx(1.59e-3)
    assert op_seconds(layer, h200, "flex") == pytest.approx(0.88e-3)
    # The H100 moves the same bytes more slowly and multiplies as fast.
    assert op_seconds(copy, CARDS["H100"], "sdpa") > op_seconds(copy, h200, "sdpa")
    assert op_seconds(matmul, CARDS["H100"], "sdpa") == op_seconds(matmul, h200, "sdpa")


def test_a_fused_chain_reads_its_outside_inputs_and_writes_its_last_output():
    # x (storage 1) -> a (2) -> b (3), each 100 bytes; then a matmul reads b.
    ops = [
        Op("mul", "memory", 0.0, 300, reads=[1, 9], writes=[2]),  # x * w, w (9) outside
        Op("add", "memory", 0.0, 200, reads=[2], writes=[3]),
        Op("mm", "matmul", 1e6, 300, reads=[3, 8], writes=[4]),
        Op("neg", "memory", 0.0, 200, reads=[4], writes=[5]),
    ]
    fused = fuse(ops)
    assert [op.kind for op in fused] == ["memory", "matmul", "memory"]
    assert fused[0].bytes == 300  # reads x and w, writes b: the a in between never leaves
    assert fused[1] is ops[2] and fused[2].bytes == 200
    # The head's chain is fused only when the head is (trainer.compile's two halves), and a
    # chain never crosses from the body into the head.
    head = [
        Op("exp", "memory", 0.0, 200, [5], [6], "head"),
        Op("neg", "memory", 0.0, 200, [6], [7], "head"),
    ]
    assert len(fuse(ops + head, regions=("body",))) == 3 + 2
    assert len(fuse(ops + head)) == 3 + 1


@pytest.fixture(scope="module")
def ladder_ends():
    """The 2-layer model before issue 56's levers and with the built ones (no fusion)."""
    built = Setup("device", "selective", "sdpa", host_layout=True)
    return {
        name: predicted("2-layer", 16384, 2, setup)
        for name, setup in (("before", LADDER["before"]), ("built", built))
    }


def test_the_built_levers_move_fewer_bytes_in_fewer_kernels(ladder_ends):
    before, built = ladder_ends["before"], ladder_ends["built"]
    # The head's chunks sized for the GPU: 12 chunks a pass instead of 112, each adding a
    # [151936 x 1536] product into the float32 gradient.
    assert built["bytes_per_trained_token"] < 0.45 * before["bytes_per_trained_token"]
    assert built["kernels"] < 0.5 * before["kernels"]
    # Selective recompute: no matrix product is made twice.
    assert built["matmul_tflop"] < before["matmul_tflop"]
    for card in CARDS:
        assert built[card]["seconds"] < 0.6 * before[card]["seconds"]
        assert built[card]["mfu"] > before[card]["mfu"]


def test_the_step_does_not_regress(ladder_ends):
    # The counts of the code as issue 56 left it (2 layers, two 16,384-token passes): a change
    # that moves more bytes per trained token, issues more kernels or reads the device more
    # often fails here. Lower is better; lower them when a change earns it.
    built = ladder_ends["built"]
    assert built["bytes_per_trained_token"] <= 23.5e6
    assert built["kernels"] <= 3800
    assert built["syncs"] <= 10  # once per optimiser step, not once per pass
    assert built["fits_80gb"] and built["peak_gib"] < 10
