"""The objectives at their edges (docs/algorithms.md): settings that combine, all-equal groups
that must give exactly 0, settings that would be ignored, and a researcher's own pieces that
raise or return the wrong thing. Each case is hand-worked from the spec's formulas."""

import dataclasses
import math
import re

import pytest
import torch

from rlcli.config import ConfigError
from rlcli.ops.losses import LOSSES
from rlcli.ops.objective import policy_objective
from rlcli.ops.pieces import PieceError
from rlcli.ops.policy_loss import StepCounts
from rlcli.train.objective_config import objective_from_config
from rlcli.validate import compose, section
from tests.conftest import tiny

# --- SAPO in the loss's dtype, REINFORCE++'s gamma, ReMax's failed greedy reward -------------


def test_sapo_builds_its_temperatures_in_the_losss_dtype():
    r, a = 1.3, -0.7
    logp = torch.tensor([[math.log(r)]], dtype=torch.float64, requires_grad=True)
    x = dict(ratio=logp.exp(), advantages=torch.tensor([[a]], dtype=torch.float64),
             mask=torch.ones(1, 1, dtype=torch.float64))  # fmt: skip
    loss, _ = LOSSES["sapo"].run({}, **x)
    tau = 1.05  # tau_neg, A < 0
    expected = -(4 / tau) / (1 + math.exp(-tau * (r - 1))) * a
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-14)  # float32 tau: 4e-6


# --- the objective: top-entropy and TIS with a loss per response --------------------------


def _batch(seed=0, rows=4, width=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2 - 0.1
    logp = (old + 0.1 * torch.randn(rows, width, generator=g, dtype=torch.float64)).requires_grad_()
    mask = torch.ones(rows, width, dtype=torch.float64)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    counts = StepCounts(tokens=float(mask.sum()), seqs=float(rows), responses=float(rows))
    return logp, old, adv, mask, torch.rand(rows, width, generator=g, dtype=torch.float64), counts


def test_top_entropy_with_a_loss_per_response_is_refused_before_anything_loads():
    with pytest.raises(ConfigError, match="gives one loss per response"):
        compose(["model=tiny", "sampler=hf", "algo=gmpo", "algo.top_entropy=0.2"])
    logp, old, adv, mask, entropy, counts = _batch()
    obj = objective_from_config(section("algo", "gmpo", beta=0.0), section("sampler", "hf"), 5)
    every = torch.ones_like(mask, dtype=torch.bool)
    with pytest.raises(ValueError, match="not per-response"):
        policy_objective(obj, logp, old, None, adv, mask, entropy, counts, trained=every)


@pytest.mark.parametrize("name", ["gmpo", "luspo"])
def test_tis_weighs_a_loss_per_response_by_its_tokens_geometric_mean_ratio(name):
    logp, old, adv, mask, entropy, counts = _batch()
    sampler = old - torch.tensor([0.3, 0.0, -0.2, 1.5], dtype=torch.float64)[:, None]
    algo = section("algo", name, beta=0.0)
    plain = objective_from_config(algo, section("sampler", "vllm", old_logp="learner"), 5)
    tis = objective_from_config(algo, section("sampler", "vllm", old_logp="sampler"), 5)
    assert tis.tis_cap == 2.0
    lo, hi = plain.bounds(old)
    per_response, _ = plain.loss.run(
        {}, logp=logp, old_logp=old, advantages=adv[:, None].expand(4, 5), mask=mask,
        ratio=plain.ratio(logp, old, mask), lo=lo, hi=hi, eps_low=algo.eps_low,
        eps_high=algo.eps_high, dual_clip=None,
    )  # fmt: skip
    weights = torch.tensor([math.exp(0.3), 1.0, math.exp(-0.2), 2.0], dtype=torch.float64)
    expected = (per_response * weights).sum() / 4
    loss, _ = policy_objective(tis, logp, old, None, adv, mask, entropy, counts, sampler)
    untouched, _ = policy_objective(plain, logp, old, None, adv, mask, entropy, counts, sampler)
    assert float(loss) == pytest.approx(float(expected), rel=1e-12)
    assert float(untouched) == pytest.approx(float(per_response.sum() / 4), rel=1e-12)


def test_clip_cov_skips_tokens_its_active_clip_rule_already_clips():
    # r = 1.1 with A > 0: inside DAPO's 1 + 0.28, but beyond a clip rule whose hi is 1.05.
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = torch.tensor([[-0.1, -3.0, -0.1, -3.0]], dtype=torch.float64)
    mask = torch.ones_like(logp)
    ratio = torch.tensor([[1.1, 1.0, 1.0, 1.0]], dtype=torch.float64)
    settings = {"rho": 1.0, "lower": -10.0, "upper": 10.0}
    select = LOSSES["clip_cov"].select
    wide = select(adv, logp, mask, ratio, ratio * 0 + 0.8, ratio * 0 + 1.28, **settings)
    tight = select(adv, logp, mask, ratio, ratio * 0 + 0.8, ratio * 0 + 1.05, **settings)
    assert bool(wide[0, 0]) and not bool(tight[0, 0])
    assert int(tight.sum()) == 3


# --- settings that would be ignored, or are out of range, stop before anything loads --------


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["algo.eps_high=0.28"], "algo.eps_high=0.28 would be ignored: algo.clip=symmetric"),
        (["algo=gpg", "algo.eps_low=0.1"], "algo.eps_low=0.1 would be ignored: algo.loss=gpg"),
        (["algo=gpg", "algo.clip=decoupled"], "algo.clip=decoupled would be ignored"),
        (["algo=cispo", "algo.dual_clip=3"], "algo.dual_clip=3.0 would be ignored"),
        (["algo=gmpo", "algo.ratio=sequence"], "algo.ratio=sequence would be ignored"),
        (["algo=gpg", "trainer.epochs=2"], "algo.loss=gpg reads no importance ratio"),
        (["algo=gpg", "trainer.mini_batches=2"], "trainer.mini_batches=2 and trainer.epochs=1"),
        (["algo=sapo", "algo.loss_settings.tau_pos=0"], "algo.loss_settings.tau_pos=0 must be > 0"),
        (
            ["algo=kl_cov", "algo.loss_settings.rho=0"],
            "algo.loss_settings.rho=0 must lie in (0, 1]",
        ),
        (["algo=clip_cov", "algo.loss_settings.lower=6"], "lower=6 must be below upper=5.0"),
    ],
)
def test_a_setting_that_would_be_ignored_or_is_out_of_range_is_refused(overrides, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        compose(["model=tiny", "sampler=hf", *overrides])


@pytest.mark.parametrize("overrides", [["algo.eps_low=0.1"], ["algo=dapo", "algo.eps_high=0.3"],
                                       ["algo=gmpo", "algo.eps_high=0.5"]])  # fmt: skip
def test_a_setting_its_loss_reads_is_accepted(overrides):
    cfg = compose(["model=tiny", "sampler=hf", *overrides])
    assert cfg.algo.eps_low > 0


# --- a researcher's own pieces: refused with their name when they misbehave ------------------

OWN = """
import torch

def scalar(*, ratio, advantages, mask):
    return (-ratio * advantages * mask).sum(), {}

def short(*, ratio, advantages):
    return (-ratio * advantages)[:, :-1], {}

def no_metrics(*, ratio, advantages):
    return -ratio * advantages

def float_metric(*, ratio, advantages):
    return -ratio * advantages, {"mine/x": 1.5}

def detached(*, ratio, advantages):
    return (-ratio * advantages).detach(), {}

def as_list(*, ratio, advantages):
    return [-ratio * advantages, {}]

def raises(*, ratio, advantages):
    raise KeyError("mask")

def zeroes_mask(*, ratio, advantages, mask, old_logp):
    mask.zero_()
    old_logp.add_(1.0)
    return -ratio * advantages, {}

def adv_wrong_shape(x):
    return x.scores[:-1], None

def adv_nan(x):
    return x.scores * float("nan"), None

def adv_tuple3(x):
    return x.scores, None, None
"""


@pytest.mark.parametrize(
    "key, fn, words",
    [
        ("loss", "scalar", "returned a loss of shape [] where [4, 3] was expected"),
        ("loss", "short", "returned a loss of shape [4, 2] where [4, 3] was expected"),
        ("loss", "no_metrics", "returned a Tensor, not a pair (loss, metrics)"),
        ("loss", "float_metric", "the metric 'mine/x' as a float, not a one-number tensor"),
        ("loss", "detached", "a loss with no gradient"),
        ("loss", "as_list", "returned a list, not a pair"),
        ("loss", "raises", "raised KeyError: 'mask' at "),
        ("advantage", "adv_wrong_shape", "advantages of shape [3] where [4] or [4, 3]"),
        ("advantage", "adv_nan", "a non-finite advantage (nan or inf)"),
        ("advantage", "adv_tuple3", "returned a tuple, not a pair (advantages, returns or None)"),
    ],
)
def test_an_own_piece_that_misbehaves_is_named_before_anything_loads(tmp_path, key, fn, words):
    own = tmp_path / "own.py"
    own.write_text(OWN)
    with pytest.raises(ConfigError) as err:
        compose(["model=tiny", "sampler=hf", f"algo.{key}={own}:{fn}"])
    message = str(err.value)
    assert f"algo.{key}={own}:{fn}" in message and words in message
    assert "made-up batch before loading anything" in message


def test_an_own_loss_that_writes_into_its_inputs_changes_nothing_else(tmp_path):
    own = tmp_path / "own.py"
    own.write_text(OWN)
    cfg = compose(["model=tiny", "sampler=hf", "algo.beta=0.04", f"algo.loss={own}:zeroes_mask"])
    obj = objective_from_config(cfg.algo, cfg.sampler, 5)
    logp, old, adv, mask, entropy, counts = _batch()
    before = (mask.clone(), old.clone())
    _, sums = policy_objective(obj, logp, old, old, adv, mask, entropy, counts)
    assert torch.equal(mask, before[0]) and torch.equal(old, before[1])
    assert float(sums["actor/entropy"]) == pytest.approx(float((entropy * mask).sum()))


def test_an_own_loss_failing_during_a_step_is_a_piece_error_naming_it(tmp_path):
    from rlcli.train.pieces_chosen import loss_piece

    own = tmp_path / "own.py"
    own.write_text(OWN)
    obj = objective_from_config(section("algo", "grpo", beta=0.0), section("sampler", "hf"), 5)
    obj = dataclasses.replace(obj, loss=loss_piece(f"{own}:short"))
    logp, old, adv, mask, entropy, counts = _batch()
    with pytest.raises(PieceError, match=re.escape(f"algo.loss={own}:short returned a loss")):
        policy_objective(obj, logp, old, None, adv, mask, entropy, counts)


# --- during a run: a NaN own loss is named; OPO warns -----------------------------------------

TINY = tiny("trainer.micro_batch_size=64")

RUN_TIME = """
import torch

def nan_loss(*, ratio, advantages):
    return -ratio * advantages * float("nan"), {}
"""


def train(run_dir, *overrides):
    """`rlcli train TINY overrides` in this process: (exit code, stdout + stderr)."""
    import contextlib
    import io

    from rlcli.cli import main

    out, code = io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(["train", *TINY, *overrides, f"hydra.run.dir={run_dir}"])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return code, out.getvalue()


# A loss that raises in step 2 (after rlcli's trial passed) saves step 1 and exits 2 naming
# it: scripts/bad_input.py's fault own_loss_that_raises_at_step_2 (tests/cli/test_bad_input.py).


def test_an_own_loss_that_gives_nan_is_named_as_the_first_suspect(tmp_path):
    own = tmp_path / "run_time.py"
    own.write_text(RUN_TIME)
    code, text = train(tmp_path / "run", f"algo.loss={own}:nan_loss", "trainer.max_steps=3",
                       "trainer.max_bad_steps=1")  # fmt: skip
    assert code == 3, text
    assert f"First suspect your own algo.loss={own}:nan_loss" in text
    # The warning of each such step names it too, for runs that go on (max_bad_steps > 1).
    warning = next(line for line in text.splitlines() if "had a non-finite loss" in line)
    assert f"Check your own algo.loss={own}:nan_loss first" in warning


def test_opo_with_several_updates_a_batch_warns_at_the_start(tmp_path):
    code, text = train(tmp_path / "run", "algo=opo", "trainer.mini_batches=2",
                       "trainer.max_steps=1")  # fmt: skip
    assert code == 0, text
    assert "rlcli: warning: algo.advantage=opo is meant for exactly on-policy updates" in text
