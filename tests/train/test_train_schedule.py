"""Learning-rate schedules (`trainer.lr_scheduler`, built by `transformers.get_scheduler`):
the default is the warm-up rlcli always had, the logged `actor/lr` follows cosine and linear,
a resume continues the schedule, and a bad name or setting is a one-paragraph error.

The schedule is also checked over the whole run before any model loads: at every optimiser
update (trainer.mini_batches x trainer.epochs per step) and at the scheduler's step after the
last, where polynomial with a negative power or a warm-up as long as the run divides by zero.
Each bad setting is one paragraph naming it and what keeps the rate sound."""

import math
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from rlcli.config import ConfigError
from rlcli.lifecycle.run_dir import kind_of_field
from rlcli.tracking.metrics import read_metrics
from rlcli.train.loop import train
from rlcli.train.run import lr_schedule
from rlcli.validate import compose
from tests.conftest import tiny

TINY = tiny("trainer.prompts_per_step=2", "trainer.group_size=2", "trainer.lr=1e-3",
            "trainer.max_steps=4", new_tokens=4)  # fmt: skip


def rates(overrides: list[str], updates: int) -> list[float]:
    """The learning rate of each of the first `updates` optimiser updates, as factors of lr."""
    t = compose(["model=tiny", *overrides]).trainer
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=t.lr)
    scheduler = lr_schedule(optimizer, t)
    out = []
    for _ in range(updates):
        out.append(optimizer.param_groups[0]["lr"] / t.lr)
        optimizer.step()
        scheduler.step()
    return out


def test_the_default_schedule_is_the_linear_warm_up_rlcli_always_had():
    # 3 warm-up steps of 2 mini-batches: 6 updates at (i+1)/7, then the full rate; no update
    # at 0 (transformers' own warm-up starts there).
    warm = rates(["trainer.warmup_steps=3", "trainer.mini_batches=2"], 10)
    assert warm == pytest.approx([1 / 7, 2 / 7, 3 / 7, 4 / 7, 5 / 7, 6 / 7, 1, 1, 1, 1], abs=1e-12)
    assert rates([], 5) == [1.0] * 5


def cosine(step: int, warmup: int, total: int) -> float:
    """The lr factor of step `step` (1-based, one update a step) of cosine with warm-up."""
    if step <= warmup:
        return step / (warmup + 1)
    return 0.5 * (1 + math.cos(math.pi * (step - 1 - warmup) / (total - warmup)))


def test_logged_lr_follows_cosine_and_linear_and_a_resume_continues_it(tmp_path):
    lr = 1e-3
    cos = [*TINY, "trainer.lr_scheduler=cosine", "trainer.warmup_steps=1"]
    train(compose(cos), tmp_path / "straight")
    logged = [r["actor/lr"] for r in read_metrics(tmp_path / "straight")]
    assert logged == pytest.approx([lr * cosine(s, 1, 4) for s in (1, 2, 3, 4)])
    assert logged == pytest.approx([5e-4, 1e-3, 7.5e-4, 2.5e-4])  # by hand

    # Two steps, then a resume to four: the schedule goes on where it was.
    train(compose([*cos, "trainer.max_steps=2"]), tmp_path / "split")
    train(compose(cos), tmp_path / "split")
    assert [r["actor/lr"] for r in read_metrics(tmp_path / "split")] == pytest.approx(logged)

    train(compose([*TINY, "trainer.lr_scheduler=linear"]), tmp_path / "linear")
    logged = [r["actor/lr"] for r in read_metrics(tmp_path / "linear")]
    assert logged == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


def test_a_resume_may_change_the_schedule_and_says_so():
    assert kind_of_field("trainer.lr_scheduler") == "applied"  # with a line naming it
    assert kind_of_field("trainer.lr_scheduler_kwargs.min_lr_rate") == "applied"
    assert kind_of_field("trainer.val_before_train") == "free"  # a resume does not evaluate


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["trainer.lr_scheduler=cosin"], "not one of the valid choices: constant_with_warmup, "),
        (["trainer.lr_scheduler=reduce_lr_on_plateau"], "cosine_with_min_lr"),
        (["trainer.lr_scheduler=constant", "trainer.warmup_steps=2"], "constant_with_warmup"),
        (["trainer.lr_scheduler=cosine", "+trainer.lr_scheduler_kwargs.power=2"],
         "does not take; its settings: num_cycles"),
        (["trainer.lr_scheduler=cosine_with_min_lr"], "min_lr_rate"),
    ],
    ids=["typo", "metric-driven", "constant-with-warm-up", "unknown-setting", "missing-setting"],
)  # fmt: skip
def test_a_bad_schedule_is_refused_before_anything_loads(overrides, says):
    with pytest.raises(ConfigError) as err:
        compose(["model=tiny", *overrides])
    assert says in str(err.value)


def test_a_bad_schedule_name_exits_2_naming_the_valid_ones(tmp_path):
    cmd = [sys.executable, "-m", "rlcli", "train", "model=tiny", "trainer.lr_scheduler=cosin",
           f"hydra.run.dir={tmp_path}"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "rlcli: error: trainer.lr_scheduler='cosin' is not one of the valid choices: "
        "constant_with_warmup, constant, linear, cosine, cosine_with_min_lr, "
        "cosine_with_restarts, polynomial, inverse_sqrt."
    )


def test_cosine_with_min_lr_ends_at_its_floor():
    floor = [
        "trainer.lr_scheduler=cosine_with_min_lr",
        "+trainer.lr_scheduler_kwargs.min_lr_rate=0.1",
    ]
    t = compose(["model=tiny", *floor, "trainer.max_steps=3"]).trainer
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = lr_schedule(optimizer, replace(t, lr=1.0))
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # after the last update


# ---- the schedule over the whole run ----

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
