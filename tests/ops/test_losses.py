"""The peers' losses and estimators (docs/algorithms.md, each from its paper) on
hand-worked numbers, their gradients where the gradient is the point, and the registry that
declares them."""

import math

import pytest
import torch

from rlcli.ops.losses import LOSSES, top_entropy_mask
from rlcli.ops.pieces import piece, registrar, settings_problem
from rlcli.ops.policy_loss import decoupled_bounds, sequence_ratio, token_ratio


def inputs(logp, old_logp, advantages, mask=None, eps_low=0.2, eps_high=0.2, ratio=token_ratio):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(old_logp, dtype=torch.float64)
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float64)
    adv = torch.tensor(advantages, dtype=torch.float64)
    adv = adv[:, None].expand_as(old) if adv.dim() == 1 else adv
    lo, hi = decoupled_bounds(old, eps_low, eps_high)
    r = ratio(logp, old, mask)
    return dict(logp=logp, old_logp=old, ref_logp=None, advantages=adv, mask=mask,
                entropy=torch.zeros_like(old), ratio=r, lo=lo, hi=hi, eps_low=eps_low,
                eps_high=eps_high, dual_clip=None, selected=None)  # fmt: skip


def grad_of(loss, x):
    (g,) = torch.autograd.grad(loss.sum(), x["logp"])
    return g


def test_cispo_is_minus_w_a_logp_and_every_token_keeps_its_gradient():
    # r = e^1.8 = 6.05 above the cap 5 (eps_high 4), and r = 1
    x = inputs([[-0.1, -2.0]], [[-1.9, -2.0]], [1.0], eps_low=1.0, eps_high=4.0)
    loss, metrics = LOSSES["cispo"].run({}, **x)
    assert loss.tolist()[0] == pytest.approx([0.5, 2.0])  # -5*1*(-0.1), -1*1*(-2.0)
    assert grad_of(loss, x).tolist()[0] == pytest.approx([-5.0, -1.0])
    assert float(metrics["cispo/capped"]) == 1.0
    # PPO's clip zeroes the capped token's gradient; CISPO does not
    x2 = inputs([[-0.1, -2.0]], [[-1.9, -2.0]], [1.0], eps_low=1.0, eps_high=4.0)
    ppo, _ = LOSSES["ppo_clip"].run({}, **x2)
    assert grad_of(ppo, x2).tolist()[0][0] == 0.0


def test_sapo_at_ratio_one_has_the_plain_gradient_and_value_minus_two_a_over_tau():
    x = inputs([[-1.0, -1.0]], [[-1.0, -1.0]], torch.tensor([[2.0, -1.0]]).tolist())
    loss, _ = LOSSES["sapo"].run({}, **x)
    assert loss.tolist()[0] == pytest.approx([-2 * 2.0 / 1.0, 2 * 1.0 / 1.05])
    assert grad_of(loss, x).tolist()[0] == pytest.approx([-2.0, 1.0])  # -A, f'(1) = 1
    wider, _ = LOSSES["sapo"].run({"tau_neg": 2.0}, **x)
    assert float(wider[0, 1].detach()) == pytest.approx(2 * 1.0 / 2.0)


def test_gmpo_clips_each_log_ratio_pessimistically_and_takes_the_geometric_mean():
    # d = [0.5, -0.1], eps 0.4: A > 0 caps 0.5 at 0.4 -> rho = e^0.15; A < 0 keeps it -> e^0.2
    x = inputs([[0.5, -0.1], [0.5, -0.1]], [[0.0, 0.0], [0.0, 0.0]], [1.0, -1.0], None, 0.4, 0.4)
    loss, metrics = LOSSES["gmpo"].run({}, **x)
    assert loss.tolist() == pytest.approx([-math.exp(0.15), math.exp(0.2)])
    assert float(metrics["gmpo/clipped"]) == 1.0
    assert "response_advantage" in LOSSES["gmpo"].needs


def test_luspo_is_gspo_times_the_length():
    mask = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    x = inputs([[-1.0, -1.1, -0.9], [-0.5, 0, 0]], [[-1.0, -1.0, -1.0], [-0.6, 0, 0]],
               [1.0, -2.0], mask, 3e-4, 4e-4, ratio=sequence_ratio)  # fmt: skip
    loss, _ = LOSSES["luspo"].run({}, **x)
    per_token, _ = LOSSES["ppo_clip"].run({}, **x)
    gspo = per_token[:, 0]  # the same on every token of a response
    assert loss.tolist() == pytest.approx((gspo * torch.tensor([3.0, 1.0])).tolist())


def test_gpg_loss_is_minus_a_logp():
    x = inputs([[-1.0, -2.0]], [[-1.5, -1.0]], [0.5])
    loss, _ = LOSSES["gpg"].run({}, **x)
    assert loss.tolist()[0] == pytest.approx([0.5, 1.0])
    assert grad_of(loss, x).tolist()[0] == pytest.approx([-0.5, -0.5])


def test_clip_cov_detaches_exactly_min_n_candidates_inside_the_bounds():
    torch.manual_seed(0)
    old = torch.randn(40, 50, dtype=torch.float64) - 2
    logp = (old + 0.05 * torch.randn_like(old)).tolist()
    adv = (torch.randn(40, dtype=torch.float64) * 3).tolist()
    x = inputs(logp, old.tolist(), adv)
    settings = {**LOSSES["clip_cov"].settings, "rho": 0.01}
    r = torch.exp(x["logp"].detach() - x["old_logp"])
    lo, hi = torch.full_like(r, 0.8), torch.full_like(r, 1.2)
    chosen = LOSSES["clip_cov"].select(x["advantages"], x["logp"], x["mask"], r, lo, hi,
                                       **settings)  # fmt: skip
    m = x["mask"].bool()
    cov = (x["advantages"] - x["advantages"][m].mean()) * (
        x["logp"].detach() - x["logp"].detach()[m].mean()
    )
    binds = ((x["advantages"] > 0) & (r > 1.2)) | ((x["advantages"] < 0) & (r < 0.8))
    candidates = (cov > 1) & (cov < 5) & ~binds
    assert int(chosen.sum()) == min(int(0.01 * 2000), int(candidates.sum())) == 20
    assert bool((chosen <= candidates).all())
    x["selected"] = chosen
    loss, metrics = LOSSES["clip_cov"].run(settings, **x)
    g = grad_of(loss, x)
    assert bool((g[chosen] == 0).all()) and float(metrics["clip_cov/detached"]) == 20
    live = ~chosen & ~binds
    assert bool((g[live] != 0).all())


def test_kl_cov_penalises_the_largest_covariances_ties_to_the_earlier_token():
    # A = [1, -1] per response, logp rows [-1, -2, -3]: covariances [1, 0, -1] and [-1, 0, 1]
    x = inputs([[-1.0, -2.0, -3.0]] * 2, [[-1.5, -2.0, -3.0]] * 2, [1.0, -1.0])
    settings = LOSSES["kl_cov"].settings
    select = LOSSES["kl_cov"].select
    unused = (None, None, None)  # KL-Cov's choice reads no ratio or clip
    one = select(x["advantages"], x["logp"], x["mask"], *unused, **settings)
    assert one.nonzero().tolist() == [[0, 0]]  # n = max(1, floor(0.002 * 6)) = 1, the earlier
    two = select(x["advantages"], x["logp"], x["mask"], *unused, **{**settings, "rho": 0.34})
    assert two.nonzero().tolist() == [[0, 0], [1, 2]]
    x["selected"] = one
    loss, metrics = LOSSES["kl_cov"].run({"coef": 2.0}, **x)
    r00 = math.exp(0.5)
    assert float(loss[0, 0]) == pytest.approx(-r00 * 1.0 + 2.0 * 0.5)
    assert float(loss[1, 0]) == pytest.approx(r00)  # -r A with A = -1, no penalty
    assert float(metrics["kl_cov/penalised"]) == 1.0


def test_top_entropy_keeps_the_highest_entropy_tokens_ties_to_the_earlier():
    entropy = torch.tensor([[0.5, 2.0, 2.0], [1.0, 3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    assert top_entropy_mask(entropy, mask, 0.2).nonzero().tolist() == [[1, 1]]  # k = 1
    assert top_entropy_mask(entropy, mask, 0.6).nonzero().tolist() == [[0, 1], [0, 2], [1, 1]]


def test_a_piece_declares_its_inputs_and_settings_and_names_are_unique():
    registry = {}
    register = registrar(registry, ("logp", "mask"))

    @register("mine", needs=("groups",))
    def mine(*, logp, mask, scale: float = 2.0, keep: bool = True):
        """My loss."""
        return -scale * logp, {}

    p = registry["mine"]
    assert (p.inputs, p.settings, p.needs, p.doc) == (
        {"logp", "mask"}, {"scale": 2.0, "keep": True}, {"groups"}, "My loss.")  # fmt: skip
    with pytest.raises(ValueError, match="registered already"):
        register("mine")(mine)
    with pytest.raises(ValueError, match="parameter 'other' is neither an input"):
        piece("bad", lambda logp, other: logp, ("logp",))
    with pytest.raises(ValueError, match="unknown needs"):
        piece("bad", mine, ("logp", "mask"), needs=("a gpu",))
    assert settings_problem(p, {"scale": 3}, "algo.loss_settings") is None
    assert "is not a setting of mine; its settings are: scale=2.0, keep=True" in settings_problem(
        p, {"scael": 3}, "algo.loss_settings"
    )
    assert "must be a bool" in settings_problem(p, {"keep": 1}, "algo.loss_settings")
    assert "must be a float" in settings_problem(p, {"scale": "big"}, "algo.loss_settings")


def test_the_adaptive_kl_controller_moves_beta_by_the_clipped_error():
    from rlcli.ops.policy_loss import adaptive_kl_beta, kl_reward_penalty

    # KL 3x the target: the error 2.0 is clipped to 0.2; 16 responses of a 10000 horizon
    assert adaptive_kl_beta(0.1, 0.03, 0.01, 16, 10000) == pytest.approx(0.1 * (1 + 0.2 * 0.0016))
    assert adaptive_kl_beta(0.1, 0.009, 0.01, 16, 10000) == pytest.approx(0.1 * (1 - 0.1 * 0.0016))
    penalty = kl_reward_penalty(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]),
                                torch.tensor([[1.0, 0.0]]), 0.5)  # fmt: skip
    assert penalty.tolist() == [[0.25, 0.0]]  # 0.5 * k1 on the masked token only


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_each_loss_is_the_same_split_into_micro_batches(name):
    """The step's counts divide every micro-batch's share, so the parts sum to the whole, for
    per-response losses as for per-token ones (the mini-batch's selection is made once)."""
    from functools import partial

    from rlcli.ops.objective import Objective, policy_objective
    from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, RATIOS, StepCounts

    g = torch.Generator().manual_seed(1)
    old = torch.randn(6, 5, generator=g, dtype=torch.float64) - 2
    logp = (old + 0.1 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.float64)
    mask[2, 3:] = 0
    selected = torch.zeros(6, 5, dtype=torch.bool)
    selected[1, 2] = selected[4, 0] = True
    ratio = "sequence" if name == "luspo" else "token"
    obj = Objective(
        ratio=RATIOS[ratio], bounds=partial(CLIP_BOUNDS["decoupled"], eps_low=0.2, eps_high=0.28),
        loss=LOSSES[name], kl=None, aggregate=partial(AGGREGATIONS["token_mean"], norm_len=5),
        beta=0.0, dual_clip=None, entropy_coef=0.0,
    )  # fmt: skip
    counts = StepCounts(tokens=float(mask.sum()), seqs=6.0, responses=6.0)

    def loss_of(rows):
        zeros = torch.zeros(len(rows), 5)
        args = (logp[rows], old[rows], None, adv[rows], mask[rows], zeros, counts)
        return policy_objective(obj, *args, selected=selected[rows])[0]

    whole = loss_of(list(range(6)))
    (whole_grad,) = torch.autograd.grad(whole, logp)
    parts = loss_of([0, 1, 2]) + loss_of([3, 4, 5])
    (parts_grad,) = torch.autograd.grad(parts, logp)
    assert float(parts) == pytest.approx(float(whole), rel=1e-12)
    assert torch.allclose(parts_grad, whole_grad, rtol=1e-12, atol=1e-15)


def test_every_registered_losss_own_metrics_are_in_the_metrics_reference():
    # A loss's metrics reach metrics.jsonl under its own names; each must have a row in
    # rlcli/tracking/metric_names.py (from which the Metrics reference is generated).
    from rlcli.ops.losses import LOSSES
    from rlcli.tracking.metric_names import documented

    g = torch.Generator().manual_seed(0)
    rows, width = 4, 3
    old = -torch.rand(rows, width, generator=g) - 0.5
    logp = (old + 0.1 * torch.randn(rows, width, generator=g)).requires_grad_()
    inputs = dict(
        logp=logp, old_logp=old, ref_logp=old.clone(), mask=torch.ones(rows, width),
        advantages=torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(rows, width),
        entropy=torch.rand(rows, width, generator=g), ratio=(logp - old).exp(),
        lo=torch.full((rows, width), 0.8), hi=torch.full((rows, width), 1.2), eps_low=0.2,
        eps_high=0.2, dual_clip=None, selected=torch.zeros(rows, width, dtype=torch.bool),
    )  # fmt: skip
    undocumented = {}
    for name, registered in LOSSES.items():
        _, metrics = registered.run({}, **inputs)
        missing = [key for key in metrics if documented(key) is None]
        if missing:
            undocumented[name] = missing
    assert not undocumented, f"add these to rlcli/tracking/metric_names.py: {undocumented}"
