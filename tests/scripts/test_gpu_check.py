"""scripts/gpu_check.py, the learner's check for a CUDA GPU, run here on the CPU with tiny
shapes (--small) so that it keeps working between the sessions that have a GPU: the
throughput configurations --small runs (default, autocast, padded) through FSDP2 on one rank
with the default's top operators, two GRPO steps with sampler=hf and a LoRA step."""

import json
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"


def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--passes", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("GPU CHECK PASSED")
    report = json.loads(done.stdout[: done.stdout.rindex("}") + 1])
    passes = report["throughput"]
    assert passes["card"] == "cpu" and passes["mfu"] is None
    assert passes["tokens_per_s"] > 0 and passes["model_tflop_per_s"] > 0
    assert len(passes["step_seconds"]) == 3 and passes["loss_finite"]
    # Two passes of full shared-prompt rows: no padding at all.
    assert passes["passes_per_step"] == 2 and passes["padding_frac"] == 0.0
    levers = report["levers"]
    assert list(levers) == ["default", "autocast", "padded"] and levers["default"] == passes
    for lever in levers.values():
        assert lever["loss_finite"] and lever["tokens_per_s"] > 0 and lever["padding_frac"] == 0
    # One profiled step: its ten costliest operators, costliest first, parts of the whole.
    top = passes["top_kernels"]
    assert len(top) == 10 and all(k["name"] and k["ms"] > 0 for k in top)
    assert [k["ms"] for k in top] == sorted((k["ms"] for k in top), reverse=True)
    assert 0 < sum(k["share"] for k in top) <= 1.01
    steps = report["tiny_steps"]
    assert len(steps["grpo"]) == 2 and steps["finite"]
    # A dense reward (reward=space_rate): every step has a gradient.
    assert all(m["actor/grad_norm"] > 0 for m in [*steps["grpo"], steps["lora"]])
    assert "cuda_against_cpu" not in report  # only on a GPU
