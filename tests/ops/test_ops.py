"""Numeric tests of rlcli.ops on hand-worked values (the papers' equations, worked by hand)."""

import math

import pytest
import torch

from rlcli.ops.policy_loss import (
    AGGREGATIONS,
    CLIP_BOUNDS,
    KL_ESTIMATORS,
    RATIOS,
    StepCounts,
    clipped_surrogate,
    dpo_loss,
    explained_variance,
    masked_is_response_weights,
    masked_is_weights,
    overlong_penalty,
    truncated_is_response_weights,
    truncated_is_weights,
    value_loss,
)

TOL = 1e-4


def close(actual, expected, tol=TOL):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    return torch.allclose(torch.as_tensor(actual).double(), expected, atol=tol, rtol=0)


def aggregate(name, loss, mask, total_tokens, total_seqs, norm_len=4.0):
    """Every row of `loss` is a sampled response (total_responses), empty ones included."""
    counts = StepCounts(tokens=total_tokens, seqs=total_seqs, responses=float(loss.shape[0]))
    return AGGREGATIONS[name](loss, mask, counts, norm_len)


# --- worked example 1: token vs sequence ratio -------------------------------------------


def test_worked_example_1_token_clip():
    logp = torch.log(torch.tensor([[2.0, 0.4]]))
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    ratio = RATIOS["token"](logp, old, mask)
    lo, hi = CLIP_BOUNDS["symmetric"](old, 0.2, 0.28)
    loss, low, high, dual = clipped_surrogate(ratio, torch.ones(1, 1), lo, hi)
    # objective = -loss: min(2.0, 1.2) = 1.2 and min(0.4, 0.8) = 0.4 (A > 0 keeps 0.4)
    assert close(-loss, [[1.2, 0.4]])
    assert close(-aggregate("token_mean", loss, mask, 2, 1), 0.8)
    assert high.tolist() == [[True, False]]
    assert not low.any() and not dual.any()


def test_worked_example_1_gspo_sequence_ratio():
    logp = torch.log(torch.tensor([[2.0, 0.4]])).requires_grad_()
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    s = RATIOS["sequence"](logp, old, mask)
    assert s.shape == (1, 2)
    assert close(s, [[math.sqrt(0.8)] * 2])
    assert close(s[0, 0], 0.894, tol=5e-4)

    # with eps 0.2 the sequence ratio 0.894 lies inside [0.8, 1.2]: objective 0.894
    lo, hi = CLIP_BOUNDS["symmetric"](old, 0.2, 0.2)
    loss, low, high, _ = clipped_surrogate(s, torch.ones(1, 1), lo, hi)
    assert close(-aggregate("seq_mean_token_mean", loss, mask, 2, 1), math.sqrt(0.8))
    assert not low.any() and not high.any()

    # GSPO's own range [1 - 3e-4, 1 + 4e-4]: 0.894 is below it, but for A > 0 the
    # pessimistic minimum keeps the unclipped 0.894, so the objective and its gradient
    # are unchanged and no clip is active
    lo, hi = CLIP_BOUNDS["decoupled"](old, 3e-4, 4e-4)
    assert (s < lo).all()
    loss, low, high, _ = clipped_surrogate(s, torch.ones(1, 1), lo, hi)
    objective = -aggregate("seq_mean_token_mean", loss, mask, 2, 1)
    assert close(objective, math.sqrt(0.8))
    assert not low.any() and not high.any()
    (grad,) = torch.autograd.grad(objective, logp, retain_graph=True)
    assert close(grad, [[math.sqrt(0.8) / 2] * 2])

    # with A < 0 the same ratio is clipped low: loss = (1 - 3e-4), no gradient
    loss, low, _, _ = clipped_surrogate(s, -torch.ones(1, 1), lo, hi)
    assert low.all()
    assert close(loss, [[1 - 3e-4] * 2], tol=1e-6)
    (grad,) = torch.autograd.grad(loss.mean(), logp)
    assert torch.equal(grad, torch.zeros(1, 2))


def test_sequence_ratio_uses_mask_and_gspo_token_gradient():
    logp = torch.tensor([[math.log(2.0), math.log(0.5), 5.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # padded token must not enter s
    s = RATIOS["sequence"](logp, old, mask)
    assert close(s, [[1.0, 1.0, 1.0]])
    (grad,) = torch.autograd.grad(s[0, 0], logp)
    assert close(grad, [[0.5, 0.5, 0.0]])  # d s / d logp_t = s * mask_t / |o|

    st = RATIOS["sequence_token"](logp, old, mask)
    assert close(st, s.detach())
    (grad,) = torch.autograd.grad(st.sum(), logp)
    assert close(grad, [[1.0, 1.0, 1.0]])  # each token's gradient is s_i * 1


def test_empty_row_sequence_ratio_is_one():
    logp = torch.tensor([[-3.0, -1.0]])
    ratio = RATIOS["sequence"](logp, torch.zeros(1, 2), torch.zeros(1, 2))
    assert torch.equal(ratio, torch.ones(1, 2))


# --- worked example 2 and clip rules ------------------------------------------------------


def test_worked_example_2_bounds_at_q_001():
    q = 0.01
    old = torch.full((1, 1), math.log(q))
    lo, hi = CLIP_BOUNDS["symmetric"](old, 0.2, 99.0)  # eps_high ignored
    assert close(lo * q, 0.008, 1e-7) and close(hi * q, 0.012, 1e-7)
    lo, hi = CLIP_BOUNDS["decoupled"](old, 0.2, 0.28)
    assert close(lo * q, 0.008, 1e-7) and close(hi * q, 0.0128, 1e-7)
    lo, hi = CLIP_BOUNDS["dcpo"](old, 0.16, 0.2)
    # 1 - 4*0.16/0.01 < 0 -> lo = 0.5; hi = 0.5 + 0.5*sqrt(81) = 5
    assert close(lo, 0.5, 1e-6) and close(hi, 5.0, 1e-5)
    assert close(lo * q, 0.005, 1e-7) and close(hi * q, 0.05, 1e-7)


def test_worked_example_2_dcpo_at_q_09():
    q = 0.9
    lo, hi = CLIP_BOUNDS["dcpo"](torch.full((1, 1), math.log(q)), 0.16, 0.2)
    assert close(lo, 0.5 + 0.5 * math.sqrt(1 - 0.64 / 0.9))
    assert close(hi, 0.5 + 0.5 * math.sqrt(1 + 0.8 / 0.9))
    # the spec's rounded numbers
    assert close(lo, 0.769, 5e-4) and close(hi, 1.187, 5e-4)
    assert close(lo * q, 0.692, 5e-4) and close(hi * q, 1.068, 5e-4)


def test_dcpo_hi_capped_at_r_max():
    old = torch.full((1, 1), math.log(1e-6))  # uncapped hi would be ~447
    _, hi = CLIP_BOUNDS["dcpo"](old, 0.16, 0.2)
    assert close(hi, 10.0, 1e-6)
    _, hi = CLIP_BOUNDS["dcpo"](old, 0.16, 0.2, r_max=100.0)
    assert close(hi, 100.0, 1e-6)


def test_clip_flags_and_dual_clip():
    ratio = torch.tensor([[0.5, 1.5, 0.5, 1.5, 5.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    lo, hi = CLIP_BOUNDS["symmetric"](torch.zeros(1, 5), 0.2, 0.0)
    loss, low, high, dual = clipped_surrogate(ratio, adv, lo, hi)
    assert close(loss, [[-0.5, -1.2, 0.8, 1.5, 5.0]])
    assert low.tolist() == [[False, False, True, False, False]]
    assert high.tolist() == [[False, True, False, False, False]]
    assert not dual.any()

    loss, low, high, dual = clipped_surrogate(ratio, adv, lo, hi, dual_clip=3.0)
    assert close(loss, [[-0.5, -1.2, 0.8, 1.5, 3.0]])
    assert dual.tolist() == [[False, False, False, False, True]]
    assert low.tolist() == [[False, False, True, False, False]]


def test_clip_broadcasts_sequence_advantage():
    ratio = torch.tensor([[1.5, 0.5], [1.5, 0.5]])
    adv = torch.tensor([[2.0], [-1.0]])  # [B, 1]
    lo, hi = CLIP_BOUNDS["decoupled"](torch.zeros(2, 2), 0.2, 0.28)
    loss, low, high, dual = clipped_surrogate(ratio, adv, lo, hi)
    assert loss.shape == low.shape == high.shape == dual.shape == (2, 2)
    assert close(loss, [[-2.56, -1.0], [1.5, 0.8]])
    assert high.tolist() == [[True, False], [False, False]]
    assert low.tolist() == [[False, False], [False, True]]


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_must_exceed_one(c):
    with pytest.raises(ValueError):
        clipped_surrogate(
            torch.ones(1, 1), -torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1), c
        )


# --- worked examples 3 and 4 ------------------------------------------------------------


def test_worked_example_4_overlong_penalty():
    pen = overlong_penalty(torch.tensor([16, 18, 20, 21, 5]), max_len=20, cache_len=4)
    assert pen.dtype.is_floating_point
    assert close(pen, [0.0, -0.5, -1.0, -1.0, 0.0])


# --- outcome advantages ------------------------------------------------------------------


# --- KL ----------------------------------------------------------------------------------


def test_kl_estimators():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    assert close(KL_ESTIMATORS["k1"](logp, ref), [[0.5, 0.0]])
    assert close(KL_ESTIMATORS["k2"](logp, ref), [[0.125, 0.0]])
    assert close(KL_ESTIMATORS["k3"](logp, ref), [[math.exp(-0.5) + 0.5 - 1, 0.0]])
    assert KL_ESTIMATORS["k3"](logp, ref)[0, 1] == 0.0

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 7, generator=gen), torch.randn(50, 7, generator=gen)
    assert (KL_ESTIMATORS["k3"](a, b) >= 0).all()
    assert torch.equal(KL_ESTIMATORS["k3"](a, a), torch.zeros(50, 7))


# --- aggregation -------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("token_mean", (1 + 2 + 3 + 5) / 4),  # all tokens / 4 tokens
        ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + 5 / 1) / 2),  # 2 non-empty responses
        # L = 4, and all 3 sampled responses count, the empty one too (Dr.GRPO, eq. 3)
        ("seq_mean_token_sum_norm", ((1 + 2 + 3) / 4 + 5 / 4) / 3),
        ("seq_sum_token_mean", (1 + 2 + 3) / 3 + 5 / 1),  # no mean over responses
    ],
)
def test_aggregation_denominators(name, expected):
    # third row has no loss tokens: it adds 0 and must not produce NaN
    value = aggregate(name, LOSS, MASK, total_tokens=4.0, total_seqs=2.0, norm_len=4.0)
    assert close(value, expected)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
@pytest.mark.parametrize("splits", [[2, 2, 2], [1, 5], [3, 3]])
def test_aggregation_micro_batches_match_big_batch(name, splits):
    gen = torch.Generator().manual_seed(1)
    loss = torch.randn(6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([8, 1, 5, 0, 3, 7])
    mask = (torch.arange(8) < lengths[:, None]).double()
    counts = StepCounts(tokens=float(mask.sum()), seqs=5.0, responses=6.0)

    big = AGGREGATIONS[name](loss, mask, counts, 8.0)
    (big_grad,) = torch.autograd.grad(big, loss)

    micro_sum = 0.0
    for rows, mask_rows in zip(loss.split(splits), mask.split(splits), strict=True):
        micro_sum = micro_sum + AGGREGATIONS[name](rows, mask_rows, counts, 8.0)
    (micro_grad,) = torch.autograd.grad(micro_sum, loss)

    assert torch.isfinite(big)
    assert torch.allclose(micro_sum, big, atol=1e-12)
    assert torch.allclose(micro_grad, big_grad, atol=1e-12)


def test_per_micro_batch_denominator_would_differ():
    # guards the test above: normalising each micro-batch by its own tokens is wrong
    loss, mask = LOSS[:2], MASK[:2]
    right = aggregate("token_mean", loss, mask, total_tokens=4.0, total_seqs=2.0)
    pairs = zip(loss, mask, strict=True)
    wrong = sum(aggregate("token_mean", row, m, float(m.sum()), 1.0) for row, m in pairs)
    assert not close(wrong / 2, right)


# --- GAE and PPO rewards -----------------------------------------------------------------


# --- DCPO SAS ----------------------------------------------------------------------------


# --- process supervision ----------------------------------------------------------------


# --- value loss, IS weights, DPO, explained variance -------------------------------------


def test_value_loss_clipping():
    values = torch.tensor([[1.0, 1.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    returns = torch.tensor([[1.0, -1.0, 0.5]])
    loss, clipped = value_loss(values, old, returns, clip=0.2)
    # t0: max(0, (0.2-1)^2) ; t1: max((1+1)^2, (0.2+1)^2) ; t2: both 0.25
    assert close(loss, [[0.5 * 0.64, 0.5 * 4.0, 0.5 * 0.25]])
    assert clipped.tolist() == [[True, False, False]]
    (grad,) = torch.autograd.grad(loss.sum(), values)
    assert close(grad, [[0.0, 2.0, -0.5]])  # clipped term has no gradient in V


def test_truncated_is_weights():
    old = torch.tensor([[0.0, math.log(1.5), math.log(3.0)]], requires_grad=True)
    w = truncated_is_weights(old, torch.zeros(1, 3), cap=2.0)
    assert close(w, [[1.0, 1.5, 2.0]])
    assert not w.requires_grad


def test_masked_is_weights_drop_the_tokens_above_the_cap():
    # AReaL's decoupled PPO: pi_prox / pi_behav = 1, 1.5, 3 with cap 2 -> 1, 1.5 and 0 (the
    # third token leaves the loss), where truncation would count it as 2.
    old = torch.tensor([[0.0, math.log(1.5), math.log(3.0)]], requires_grad=True)
    w = masked_is_weights(old, torch.zeros(1, 3), cap=2.0)
    assert close(w, [[1.0, 1.5, 0.0]])
    assert not w.requires_grad
    # A weight exactly at the cap stays.
    assert close(masked_is_weights(torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1), 2.0), 2.0)
    # Per response: the geometric mean of its tokens' weights, e.g. sqrt(1 * 9) = 3 > 2 -> 0,
    # sqrt(1.5 * 1.5) = 1.5 kept; truncation gives 2 and 1.5.
    old = torch.tensor([[0.0, math.log(9.0)], [math.log(1.5), math.log(1.5)]])
    mask = torch.ones(2, 2)
    assert close(masked_is_response_weights(old, torch.zeros(2, 2), mask, 2.0), [0.0, 1.5])
    assert close(truncated_is_response_weights(old, torch.zeros(2, 2), mask, 2.0), [2.0, 1.5])


def test_the_decoupled_objective_masks_what_truncation_caps():
    # One loss per token (GRPO's clipped surrogate, token-mean): with ratio 1 each token's
    # loss is -A * w, so the mean over 3 tokens is -(1 + 1.5 + w3)/3 with A = 1: truncation
    # w3 = 2, masking w3 = 0. The token leaves the numerator, not the denominator.
    from rlcli.ops.objective import policy_objective
    from rlcli.train.objective_config import objective_from_config
    from rlcli.validate import section

    logp = torch.tensor([[0.0, math.log(1.5), math.log(3.0)]]) - 2.0
    behaviour = torch.full((1, 3), -2.0)
    mask, entropy = torch.ones(1, 3), torch.zeros(1, 3)
    counts = StepCounts(tokens=3.0, seqs=1.0, responses=1.0)
    algo = section("algo", "grpo", beta=0.0)
    losses, capped = {}, {}
    for correction in ("truncate", "mask"):
        sampler = section("sampler", "vllm", old_logp="sampler", is_correction=correction)
        obj = objective_from_config(algo, sampler, 3)
        loss, sums = policy_objective(
            obj, logp, logp, None, torch.ones(1), mask, entropy, counts, behaviour
        )
        losses[correction], capped[correction] = loss.item(), sums["rollout/is_capped"].item()
    assert close(losses["truncate"], -(1 + 1.5 + 2) / 3)
    assert close(losses["mask"], -(1 + 1.5 + 0) / 3)
    assert capped == {"truncate": 1.0, "mask": 1.0}  # one token above the cap either way


def test_dpo_loss_value_and_gradient_sign():
    chosen = torch.tensor([-1.0], requires_grad=True)
    rejected = torch.tensor([-3.0], requires_grad=True)
    loss, r_w, r_l = dpo_loss(chosen, rejected, torch.tensor([-2.0]), torch.tensor([-2.0]), 0.1)
    assert close(r_w, [0.1]) and close(r_l, [-0.1])
    assert close(loss, [math.log(1 + math.exp(-0.2))])
    g_w, g_l = torch.autograd.grad(loss.sum(), (chosen, rejected))
    sigmoid_neg = 1 / (1 + math.exp(0.2))
    assert g_w.item() < 0 and g_l.item() > 0  # raising chosen logp lowers the loss
    assert close(g_w, [-0.1 * sigmoid_neg]) and close(g_l, [0.1 * sigmoid_neg])


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert close(explained_variance(returns, returns, mask), 1.0)
    assert close(explained_variance(torch.zeros(1, 4), returns, mask), 0.0)
    values = torch.tensor([[1.0, 2.0, 4.0, 0.0]])
    # R - V = (0, 0, -1): var 2/9; var R over 1,2,3 = 2/3
    assert close(explained_variance(values, returns, mask), 1 - (2 / 9) / (2 / 3))
    assert torch.isnan(explained_variance(values, torch.ones(1, 4), mask))


def test_with_staleness_zero_the_asynchronous_objective_is_the_synchronous_one():
    # sampler.max_staleness resolves sampler.old_logp to sampler: each token's loss is weighted by
    # min(exp(learner - sampler), cap). When the batch was sampled with the learner's own
    # weights (staleness 0, no rounding gap) the weight is exactly 1, so the loss and its
    # gradient equal those of the synchronous objective bit for bit.
    from rlcli.ops.objective import policy_objective
    from rlcli.train.objective_config import objective_from_config
    from rlcli.validate import section

    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 6, generator=g) * 3
    mask = (torch.rand(4, 6, generator=g) > 0.2).float()
    adv, entropy = torch.randn(4, generator=g), torch.rand(4, 6, generator=g)
    counts = StepCounts(tokens=float(mask.sum()), seqs=4.0, responses=4.0)
    algo = section("algo", "grpo", beta=0.0)
    results = []
    for old_logp in ("learner", "sampler"):
        obj = objective_from_config(algo, section("sampler", "vllm", old_logp=old_logp), 6)
        logp = old + 0.1 * torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
        logp.requires_grad_(True)
        loss, _ = policy_objective(obj, logp, old, None, adv, mask, entropy, counts, old)
        loss.backward()
        results.append((loss.detach(), logp.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    # ... and a stale batch (the sampler one update behind) is weighted differently.
    obj = objective_from_config(algo, section("sampler", "vllm", old_logp="sampler"), 6)
    stale, _ = policy_objective(
        obj,
        old.clone().requires_grad_(True),
        old,
        None,
        adv,
        mask,
        entropy,
        counts,
        old - 0.3 * mask,
    )
    same, _ = policy_objective(
        obj, old.clone().requires_grad_(True), old, None, adv, mask, entropy, counts, old
    )
    assert not torch.equal(stale, same)
