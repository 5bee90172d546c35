"""A sweep's jobs after the first log no vLLM WARNING either: the jobs of a Hydra multirun share
one process, and a second engine there raises notices the first does not (VLLM_DIST_IDENT, left
in the environment by the first engine's worker; the CPU kernels registered again), which are
as routine as the first engine's and stay in train.log at INFO."""

import logging
import os
import subprocess
import sys

from rlcli.rollout.vllm_shared import quiet_routine_notices
from tests.conftest import REPO


def test_every_job_of_a_sweep_on_vllm_logs_no_warning(tmp_path):
    sweep = tmp_path / "sweep"
    # As a shell starts it: without the variable an engine of this process may have set.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_DIST_IDENT"}
    # Each seed's tiny model is another model, so each job starts an engine of its own.
    command = [sys.executable, "-m", "rlcli", "train", "-m", "trainer.seed=0,1", "model=tiny",
               "reward=space_rate", "sampler=vllm", "sampler.max_new_tokens=8",
               "trainer.max_steps=1", "trainer.save_every=0", "logger.progress=false",
               f"hydra.sweep.dir={sweep}"]  # fmt: skip
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]

    second = (sweep / "1_seed=1" / "train.log").read_text()
    for log in ((sweep / "0_seed=0" / "train.log").read_text(), second):
        assert [line for line in log.splitlines() if "[WARNING]" in line] == []
    # Lowered, not dropped (before: 12 WARNING lines in each job after the first).
    assert "[INFO] Unknown vLLM environment variable detected: VLLM_DIST_IDENT" in second
    assert "is already registered. Overwriting." in second


def test_a_second_engines_notices_are_lowered_and_other_ones_kept(caplog):
    quiet_routine_notices()
    with caplog.at_level(logging.INFO, logger="vllm"):
        logging.getLogger("vllm.platforms.interface").warning(
            "Unknown vLLM environment variable detected: %s", "VLLM_DIST_IDENT"
        )
        logging.getLogger("vllm.triton_utils.dispatcher").warning(
            "Kernel %s is already registered. Overwriting.",
            "vllm.v1.sample.rejection_sampler.expand_kernel",
        )
        # A variable of the user's that vLLM does not know is still worth a warning.
        logging.getLogger("vllm.platforms.interface").warning(
            "Unknown vLLM environment variable detected: %s", "VLLM_ATTENTON_BACKEND"
        )
    levels = [(r.levelname, r.getMessage().split(":")[-1].split()[-1]) for r in caplog.records]
    assert levels == [("INFO", "VLLM_DIST_IDENT"), ("INFO", "Overwriting."),
                      ("WARNING", "VLLM_ATTENTON_BACKEND")]  # fmt: skip
