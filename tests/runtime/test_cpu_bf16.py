"""bfloat16 or float32 on a CPU with AVX512-BF16 and no AMX: one timed matmul per machine decides,
kept in the cache so that every process on the machine decides the same."""

import json
import subprocess
import sys

import torch

from rlcli.runtime import cpu_bf16
from rlcli.runtime.models import cache_dir, has_fast_bf16
from tests.conftest import REPO


def test_the_cached_figures_decide(tmp_path):
    cache = tmp_path / "cpu.json"
    key = cpu_bf16._cpu_key()
    cache.write_text(json.dumps({key: {"bfloat16_gflops": 200.0, "float32_gflops": 300.0}}))
    assert not cpu_bf16.cpu_bf16_not_slower(cache)
    faster = tmp_path / "other" / "cpu.json"
    faster.parent.mkdir()
    faster.write_text(json.dumps({key: {"bfloat16_gflops": 400.0, "float32_gflops": 300.0}}))
    assert cpu_bf16.cpu_bf16_not_slower(faster)


def test_figures_are_measured_once_and_kept_beside_other_machines(tmp_path):
    cache = tmp_path / "cpu.json"
    cache.write_text(json.dumps({"another CPU": {"bfloat16_gflops": 1.0, "float32_gflops": 2.0}}))
    measured = cpu_bf16.speeds(cache)
    assert measured["bfloat16_gflops"] > 0 and measured["float32_gflops"] > 0
    kept = json.loads(cache.read_text())
    assert kept[cpu_bf16._cpu_key()] == measured and "another CPU" in kept
    assert cpu_bf16.speeds(cache) == measured  # read back, not timed again


def test_a_damaged_cache_is_measured_around(tmp_path):
    cache = tmp_path / "cpu.json"
    cache.write_text("{not json")
    measured = cpu_bf16.speeds(cache)
    assert measured["float32_gflops"] > 0


SPEEDS = """
import pathlib, sys
from rlcli.runtime import cpu_bf16
print(cpu_bf16.speeds(pathlib.Path(sys.argv[1])))
"""


def test_processes_starting_together_measure_once(tmp_path):
    # Without the lock each would time its own matmuls and they would differ (and so could
    # their choice); with it the second reads what the first measured.
    cache = tmp_path / "cpu.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SPEEDS, str(cache)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    printed = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert printed[0] == printed[1] and "float32_gflops" in printed[0]


def test_this_machine_decides_as_its_cache_says():
    cpu = torch.device("cpu")
    if not torch.cpu._is_avx512_bf16_supported():  # AVX2 only: bfloat16 is emulated
        assert not has_fast_bf16(cpu)
    elif torch.cpu._is_amx_tile_supported():
        assert has_fast_bf16(cpu)
    else:
        found = cpu_bf16.speeds(cache_dir() / "cpu.json")
        assert has_fast_bf16(cpu) == (found["bfloat16_gflops"] >= found["float32_gflops"])
