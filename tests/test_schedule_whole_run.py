"""The learning-rate schedule is checked over the whole run before any model loads: at every
optimiser update (trainer.mini_batches x trainer.epochs per step) and at the scheduler's step
after the last, where polynomial with a negative power or a warm-up as long as the run divides
by zero. Each bad setting is one paragraph naming it and what keeps the rate sound."""

import subprocess
import sys

import pytest

from rlcli.config import ConfigError
from rlcli.validate import compose

POLY = "trainer.lr_scheduler=polynomial"
MIN_LR = "trainer.lr_scheduler=cosine_with_min_lr"


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ([POLY, "+trainer.lr_scheduler_kwargs.power=-1"],
         "cannot be computed at the scheduler's step after the run's last update (update 6): "
         "ZeroDivisionError"),
        ([POLY, "trainer.warmup_steps=3"], "trainer.warmup_steps below trainer.max_steps"),
        ([POLY, "+trainer.lr_scheduler_kwargs.lr_end=-5e-4"],  # before: trained at -2.5e-4
         "gives a learning rate of -0.00025 at optimiser update 6 of the run's 6: a negative"),
        (["trainer.lr_scheduler=inverse_sqrt", "+trainer.lr_scheduler_kwargs.timescale=0"],
         "cannot be built: ZeroDivisionError: division by zero. Valid: timescale > 0."),
        ([MIN_LR, "+trainer.lr_scheduler_kwargs.min_lr_rate=-0.5"],
         "trainer.lr_scheduler_kwargs.min_lr_rate=-0.5 is not allowed"),
        ([MIN_LR, "+trainer.lr_scheduler_kwargs.min_lr=1"],
         "trainer.lr_scheduler_kwargs.min_lr=1 is not allowed"),
        (["trainer.warmup_steps=-3"], "trainer.warmup_steps=-3 is not allowed"),
    ],
    ids=["negative-power", "warm-up-as-long-as-the-run", "negative-lr-end", "timescale-0",
         "negative-floor", "floor-above-lr", "negative-warm-up"],
)  # fmt: skip
def test_a_schedule_unsound_at_any_update_is_refused(overrides, says):
    # 3 steps of 2 updates: the run makes updates 1-6, then the scheduler steps once more.
    base = ["model=tiny", "sampler=hf", "trainer.max_steps=3", "trainer.mini_batches=2"]
    with pytest.raises(ConfigError) as err:
        compose([*base, "trainer.lr=1e-3", *overrides])
    assert says in str(err.value)


def test_a_warm_up_longer_than_the_run_is_a_warning(capsys):
    # A recipe's warm-up (10 steps) tried for 2 steps: it runs, at the rate the ramp reaches.
    compose(["model=tiny", "sampler=hf", "trainer.warmup_steps=10", "trainer.max_steps=2",
             "trainer.lr=1e-3"])  # fmt: skip
    assert capsys.readouterr().err == (
        "rlcli: warning: trainer.warmup_steps=10 is not shorter than the run "
        "(trainer.max_steps=2): the rate only ramps up, to 0.000182 at the last update, and "
        "never reaches trainer.lr=0.001. Lower trainer.warmup_steps unless this is a quick try.\n"
    )


@pytest.mark.slow  # a whole run; scripts/bad_input.py's schedule cases cover the refusal
def test_a_schedule_that_would_fail_after_the_last_step_exits_2_before_loading(tmp_path):
    # Before: both steps trained, then ZeroDivisionError in the scheduler after the last
    # update, on this and every later attempt (the run could never finish).
    cmd = [sys.executable, "-m", "rlcli", "train", "model=tiny", "sampler=hf",
           "reward=space_rate", "trainer.max_steps=2", POLY,
           "+trainer.lr_scheduler_kwargs.power=-1", f"hydra.run.dir={tmp_path}"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "rlcli: error: trainer.lr_scheduler=polynomial with trainer.lr_scheduler_kwargs="
            "{'power': -1}, trainer.warmup_steps=0 and trainer.max_steps=2 cannot be computed"
        )
    )
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing trained
