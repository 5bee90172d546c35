"""`runtime.memory.return_freed_tensors`: on the CPU, the memory of freed tensors goes back to
the system rather than staying resident (docs/performance.md, "Peak memory")."""

import json
import subprocess
import sys

import pytest
import torch

from rlcli.runtime.memory import return_freed_tensors
from tests.conftest import REPO

# In a fresh process: one large tensor freed (glibc then raises the size below which it keeps
# freed memory in its heap), 100 tensors of 4 MiB made and freed but the last (which holds the
# heap's top, so that glibc cannot trim below it), and the resident memory before and after.
SCRIPT = """
import json, os, sys
import torch
from rlcli.runtime.memory import return_freed_tensors
if sys.argv[1] == "on":
    return_freed_tensors(torch.device("cpu"), "bfloat16")
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
big = torch.ones(6 * 2**20)  # 24 MiB: under glibc's cap of 32 on that size
del big
before = resident()
tensors = [torch.ones(2**20) for _ in range(100)]  # 4 MiB each, touched
last = tensors[-1]
del tensors
print(json.dumps((resident() - before) / 2**20))
"""


def kept_mib(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_tensors_leave_the_resident_memory():
    # Without it, glibc keeps the 99 freed tensors' 396 MiB resident; with it, they are gone.
    assert kept_mib("off") > 300
    assert kept_mib("on") < 40


@pytest.mark.parametrize("device, compute", [("cuda", "bfloat16"), ("cpu", "float32")])
def test_it_leaves_gpu_and_float32_runs_alone(monkeypatch, device, compute):
    # On a GPU the tensors that matter are the GPU's; in float32 on the CPU it cost more time
    # than it was worth (docs/performance.md, "Peak memory").
    calls = []
    monkeypatch.setattr("rlcli.runtime.memory.ctypes.CDLL", lambda *a, **k: calls.append(a))
    return_freed_tensors(torch.device(device), compute)
    assert calls == []
