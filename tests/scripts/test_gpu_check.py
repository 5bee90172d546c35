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
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--small",
            "--passes",
            "2",
            "--out",
            str(tmp_path / "report.json"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("GPU CHECK PASSED")
    # A line as each section ends, then the report, which --out also holds.
    sections = ["levers.default", "levers.autocast", "levers.padded", "tiny_steps"]
    assert [line.split()[1] for line in done.stdout.splitlines()[:4]] == sections
    report = json.loads(done.stdout[done.stdout.index("\n{") : done.stdout.rindex("}") + 1])
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["levers"] == report["levers"] and report["shape"] == "small"
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


def test_a_deadline_skips_what_it_cuts_and_says_the_check_is_incomplete(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--deadline", "0",
         "--out", str(tmp_path / "report.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1
    assert "GPU CHECK INCOMPLETE: the deadline cut levers.default" in done.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert all("deadline" in lever["skipped"] for lever in report["levers"].values())
