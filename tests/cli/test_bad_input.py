"""Bad input and faults, tried on the real `rlcli train` through scripts/bad_input.py (which
also writes the table and its tally of docs/reliability.md): each bad input exits with code 2
and one message naming the bad value and what would be valid, with no Python traceback; each
fault leaves no run silently wrong."""

import importlib.util
import sys

import pytest
import torch

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("bad_input", REPO / "scripts" / "bad_input.py")
bad_input = importlib.util.module_from_spec(_spec)
sys.modules["bad_input"] = bad_input
_spec.loader.exec_module(bad_input)


@pytest.mark.parametrize("case", bad_input.BAD_INPUTS, ids=lambda c: c.name)
def test_bad_input_exits_2_with_a_message_and_no_traceback(tmp_path, case):
    if case.name.startswith("CUDA") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so asking for it is not an error here")
    assert bad_input.try_bad_input(case, tmp_path) is None


# A worker killed in a synchronous run's weight push (80 s: two worker starts) runs with
# `pytest -m slow`; the suite kills one mid-stream (tests/rollout/test_workers.py), with the
# same exit, checkpoint and resume.
SLOW_FAULTS = {"worker_killed_in_the_weight_push"}


@pytest.mark.parametrize(
    "fault",
    [pytest.param(f, marks=pytest.mark.slow) if f.__name__ in SLOW_FAULTS else f
     for f in bad_input.FAULTS],
    ids=lambda f: f.__name__,
)  # fmt: skip
def test_fault_leaves_no_run_silently_wrong(tmp_path, fault):
    assert fault(tmp_path) is None


def test_the_tally_counts_failures(tmp_path, capsys):
    # A case whose expected words are wrong must count as unclear, and make the script fail.
    wrong = bad_input.BadInput("wrong words", ["algo=nope"], "words rlcli never prints")
    assert bad_input.try_bad_input(wrong, tmp_path) is not None
    bad_input.BAD_INPUTS.append(wrong)
    try:
        assert bad_input.main_(["--only", "wrong words"]) == 1
    finally:
        bad_input.BAD_INPUTS.remove(wrong)
    assert "1 bad inputs, 0 clean errors, 0 tracebacks; 0 faults" in capsys.readouterr().out
