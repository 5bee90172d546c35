"""The advantage estimators (`ops.advantages.ADVANTAGES`) on hand-worked numbers, each from
its paper (docs/algorithms.md), and the edges every estimator of a kind must hold: a group of
equal rewards gives exactly 0, a failed reward leaves its group smaller. The estimators of a
kind are read from the registry, so a new one is tested with its kind."""

import json
import math

import pytest
import torch

from rlcli.config import ConfigError
from rlcli.ops.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    SasState,
    SasTracker,
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    grpo_process_advantages,
    ppo_token_rewards,
    rloo_advantages,
    sas_advantages,
)
from rlcli.ops.estimate import estimate
from rlcli.validate import compose
from tests.ops.test_ops import close

# The estimators that compare a response's reward with its group's and read nothing else.
GROUP_RELATIVE = sorted(
    name for name, p in ADVANTAGES.items() if p.needs == {"groups", "response_advantage"}
)
# The estimators with statistics over the whole batch (whitening, counts).
BATCH_WIDE = sorted(name for name, p in ADVANTAGES.items() if "whole_batch" in p.needs)


def fresh_state(name: str):
    """What the estimator keeps across steps (`Piece.state`), new; None for most."""
    piece = ADVANTAGES[name]
    return piece.state() if piece.state else None


def outcome_inputs(scores, lengths, group_size, dtype=torch.float32):
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths], dtype=dtype)
    return AdvantageInputs(
        scores=torch.tensor(scores, dtype=dtype),
        kl_penalty=torch.zeros_like(mask),
        mask=mask,
        group_size=group_size,
        prompt_ids=["p"] * len(scores),
        lengths=torch.tensor(lengths),
    )


@pytest.mark.parametrize(
    "dtype, lengths, reward",
    [
        (torch.float32, [16, 41, 6, 19, 59, 45, 16, 57], 0.1),
        (torch.float64, [3, 17, 5, 11, 29, 2, 7, 13], 0.9),
    ],
)
def test_opo_gives_exactly_zero_to_a_group_of_equal_rewards_whatever_the_lengths(
    dtype, lengths, reward
):
    x = outcome_inputs([reward] * 8 + [0.1, 0.7] * 4, lengths * 2, 8, dtype)
    adv, _ = ADVANTAGES["opo"](x)
    assert adv[:8].tolist() == [0.0] * 8  # the length-weighted mean rounds off the reward
    assert bool((adv[8:] != 0).all())


@pytest.mark.parametrize("reward, tokens", [(0.9, 1), (-113.37, 7)])
@pytest.mark.parametrize("name, group", [("reinforce_pp", 1), ("reinforce_pp_baseline", 1)])
def test_reinforce_pp_whitening_gives_exactly_zero_when_every_return_is_equal(
    name, group, reward, tokens
):
    x = outcome_inputs([reward] * 16, [tokens] * 16, group)
    adv, _ = ADVANTAGES[name](x)
    # float32's mean of equal values, divided by sqrt(1e-8), gave |A| = 6e-4 and 0.076
    assert adv.abs().max().item() == 0.0


def test_reinforce_pp_whitens_in_float64():
    x = outcome_inputs([1.0, 1.0 + 1e-6, 1.0], [1, 1, 1], 1)
    adv, _ = ADVANTAGES["reinforce_pp"](x)
    r = torch.tensor([1.0, 1.0 + 1e-6, 1.0], dtype=torch.float32).double()
    expected = (r - r.mean()) / torch.sqrt(r.var() + 1e-8)
    assert adv[:, 0].double().tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_reinforce_pp_discounts_with_its_gamma_setting():
    x = outcome_inputs([1.0, 0.0], [3, 3], 1)
    adv, _ = ADVANTAGES["reinforce_pp"].run({"gamma": 0.5}, x=x)
    returns = torch.tensor([0.25, 0.5, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # G_t
    expected = (returns - returns.mean()) / torch.sqrt(returns.var() + 1e-8)
    assert adv.flatten().double().tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_remax_gives_no_signal_where_the_greedy_reward_failed():
    x = outcome_inputs([1.0, 0.5], [2, 2], 1)
    x = AdvantageInputs(**{**x.__dict__, "greedy_scores": torch.tensor([0.25, float("nan")])})
    adv, _ = ADVANTAGES["remax"](x)
    assert adv.tolist() == [0.75, 0.0]  # not A = R = 0.5, as a baseline of 0 gave


def advantage_inputs(scores, mask, group_size, lengths=None):
    mask = torch.tensor(mask, dtype=torch.float32)
    return AdvantageInputs(
        scores=torch.tensor(scores, dtype=torch.float32),
        kl_penalty=torch.zeros_like(mask),
        mask=mask,
        group_size=group_size,
        prompt_ids=["p"] * len(scores),
        lengths=None if lengths is None else torch.tensor(lengths),
    )


def test_reinforce_pp_whitens_the_returns_over_the_batchs_tokens():
    x = advantage_inputs([1.0, 0.0], [[1, 1, 1], [1, 1, 0]], 1)
    adv, _ = ADVANTAGES["reinforce_pp"](x)
    # returns 1,1,1 and 0,0: mean 0.6, Bessel var 0.3
    std = math.sqrt(0.3 + 1e-8)
    assert adv.tolist()[0] == pytest.approx([0.4 / std] * 3, rel=1e-5)
    assert adv.tolist()[1] == pytest.approx([-0.6 / std, -0.6 / std, 0.0], rel=1e-5)
    lonely = advantage_inputs([1.0], [[1, 0, 0]], 1)
    assert ADVANTAGES["reinforce_pp"](lonely)[0].tolist() == [[0.0, 0.0, 0.0]]


def test_reinforce_pp_baseline_opo_and_gpg_on_hand_worked_groups():
    base, _ = ADVANTAGES["reinforce_pp_baseline"](advantage_inputs([1.0, 0.0], [[1, 1]] * 2, 2))
    assert base.flatten().tolist() == pytest.approx([0.866025] * 2 + [-0.866025] * 2, rel=1e-5)
    opo, _ = ADVANTAGES["opo"](advantage_inputs([1.0, 0.0, 1.0], [[1]] * 3, 3, [2, 4, 6]))
    assert opo.tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3])  # b = 8 / 12
    gpg, _ = ADVANTAGES["gpg"](advantage_inputs([1.0, 0.0, 1.0, 1.0], [[1]] * 4, 2))
    assert gpg.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])  # alpha = 4 / (4 - 2)


def test_remax_subtracts_the_greedy_responses_reward():
    x = advantage_inputs([1.0, 0.0, 0.5], [[1]] * 3, 1)
    x = AdvantageInputs(**{**x.__dict__, "greedy_scores": torch.tensor([0.5, 0.5, float("nan")])})
    adv, _ = ADVANTAGES["remax"](x)
    # a failed greedy reward leaves no baseline: no signal (not A = R, as a baseline of 0 gave)
    assert adv.tolist() == [0.5, -0.5, 0.0]
    assert {"greedy", "response_advantage"} == set(ADVANTAGES["remax"].needs)


def test_worked_example_3_dr_grpo():
    adv = dr_grpo_advantages(torch.tensor([[1.0, 1.0, -1.0]]))
    assert close(adv, [[2 / 3, 2 / 3, -4 / 3]])


def test_grpo_advantages():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1]]))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # Bessel std of (1, 0, 0, 1) is sqrt(1/3)
    assert close(adv[0], [a, -a, -a, a])
    assert torch.equal(adv[1], torch.zeros(4))  # constant group: exactly 0


@pytest.mark.parametrize("name", GROUP_RELATIVE)
def test_constant_group_exactly_zero(name):
    # in float32, mean(0.9 x 16) != 0.9: without an explicit check GRPO would give ~0.056
    # (0.9 is a DUPO reward: 0.9 answer + 0.1 format with the format wrong)
    rewards = torch.tensor([0.9] * 16 + [0.3] * 16)
    inputs = AdvantageInputs(
        scores=rewards, kl_penalty=torch.zeros(32, 1), mask=torch.ones(32, 1), group_size=16,
        prompt_ids=["a"] * 16 + ["b"] * 16, state=fresh_state(name),
    )  # fmt: skip
    advantages, returns = ADVANTAGES[name](inputs)
    assert torch.equal(advantages, torch.zeros(32)) and returns is None


@pytest.mark.parametrize("name", GROUP_RELATIVE)
def test_a_group_with_one_scored_response_gets_zero_advantages(name):
    # Groups of 2 where the reward failed on one sample (NaN): the survivor has no baseline,
    # so its advantage is 0; RLOO used to raise "needs at least 2 samples" and stop the run.
    # The intact second group is estimated as usual.
    scores = torch.tensor([1.0, float("nan"), 1.0, 0.0])
    ones = torch.ones(4, 1)
    ids = ["a", "a", "b", "b"]
    inputs = AdvantageInputs(
        scores, ones * 0, ones, group_size=2, prompt_ids=ids, state=fresh_state(name)
    )
    advantages, _ = estimate(ADVANTAGES[name], {}, inputs)  # the caller handles failed rewards
    assert torch.equal(advantages[:2], torch.zeros(2))
    assert advantages[2] > 0 > advantages[3]


def test_rloo_advantages():
    adv = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert close(adv, [[1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3]])
    with pytest.raises(ValueError):
        rloo_advantages(torch.tensor([[1.0]]))


def test_ppo_token_rewards():
    k1 = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    rewards = ppo_token_rewards(k1, mask, torch.tensor([2.0, -1.0, 5.0]), beta=0.1)
    expected = [[-0.01, -0.02 + 2.0, 0.0], [-0.05, -0.05, -0.05 - 1.0], [0.0, 0.0, 0.0]]
    assert close(rewards, expected)


def test_gae_hand_computed():
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.0, 1.0, 9.0], [1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.2, 7.0], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = gae(rewards, values, mask, gamma, lam)

    # row 0: the padded token (reward 9, value 7) is ignored; V after t=1 is 0
    a01 = 1.0 + gamma * 0.0 - 0.2
    a00 = (0.0 + gamma * 0.2 - 0.5) + gamma * lam * a01
    # row 1: full length
    a12 = 2.0 + 0.0 - 3.0
    a11 = (0.0 + gamma * 3.0 - 2.0) + gamma * lam * a12
    a10 = (1.0 + gamma * 2.0 - 1.0) + gamma * lam * a11
    assert close(adv, [[a00, a01, 0.0], [a10, a11, a12]])
    assert close(ret, [[a00 + 0.5, a01 + 0.2, 0.0], [a10 + 1.0, a11 + 2.0, a12 + 3.0]])
    assert close(adv[1], [1.7856, -0.02, -1.0])


def _pop_stats(xs):
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def test_sas_three_visits_hand_computed():
    visits = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
    state, seen = None, []
    for i, rewards in enumerate(visits, start=1):
        adv, state = sas_advantages(torch.tensor(rewards), state)
        seen += rewards
        mu_new, sd_new = _pop_stats(rewards)
        mu_tot, sd_tot = _pop_stats(seen)  # directly over every reward so far
        expected = []
        for r in rewards:
            a_new, a_tot = (r - mu_new) / sd_new, (r - mu_tot) / sd_tot
            sa_new = (i - 1) / i * a_new + a_tot / i
            sa_tot = a_new / i + (i - 1) / i * a_tot
            expected.append(sa_new if abs(sa_new) < abs(sa_tot) else sa_tot)
        assert close(adv, expected), i
        assert state.count == i
        assert math.isclose(state.mean, mu_tot) and math.isclose(state.var, sd_tot**2)

    # third visit by hand: sigma_new = sqrt(3)/4, mu_tot = 0.5, sigma_tot = 0.5
    s3 = math.sqrt(3) / 4
    correct = 2 / 3 * (0.25 / s3) + 1 / 3 * 1.0  # SA_new is smaller here
    wrong = 1 / 3 * (-0.75 / s3) + 2 / 3 * -1.0  # SA_total is smaller here
    assert close(adv, [correct, correct, correct, wrong])


def test_sas_constant_groups():
    # constant rewards at every visit: every term has sigma 0 -> exactly 0
    state = None
    for _ in range(3):
        adv, state = sas_advantages(torch.tensor([0.1, 0.1, 0.1]), state)
        assert torch.equal(adv, torch.zeros(3))
    # a constant visit after a varied one keeps a signal through A_total
    _, state = sas_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), None)
    adv, _ = sas_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), state)
    mu, sd = _pop_stats([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert close(adv, [0.5 * (1.0 - mu) / sd] * 4)


def test_sas_tracker_state_dict_round_trip():
    first = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    second = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    tracker = SasTracker()
    tracker(["a", "b"], first)
    saved = json.loads(json.dumps(tracker.state_dict()))
    expected = tracker(["a", "b"], second)

    resumed = SasTracker()
    resumed.load_state_dict(saved)
    assert resumed.states["a"] == SasState(1, 0.25, 0.1875)
    assert torch.equal(resumed(["a", "b"], second), expected)
    assert resumed.state_dict() == tracker.state_dict()


def test_grpo_process_hand_example():
    step_end = torch.tensor([[False, True, False, True], [False, False, True, False]])
    step_rewards = torch.tensor([[7.0, 1.0, 7.0, 0.0], [7.0, 7.0, 0.2, 7.0]])  # 7 = ignored
    adv = grpo_process_advantages(step_rewards, step_end)
    mean = (1.0 + 0.0 + 0.2) / 3
    std = math.sqrt(((1.0 - mean) ** 2 + mean**2 + (0.2 - mean) ** 2) / 2) + 1e-6
    n1, n0, n2 = (1.0 - mean) / std, (0.0 - mean) / std, (0.2 - mean) / std
    assert close(adv, [[n1 + n0, n1 + n0, n0, n0], [n2, n2, n2, 0.0]])


def test_grpo_process_degenerate_groups():
    step_end = torch.tensor([[True, False, True]])
    assert torch.equal(
        grpo_process_advantages(torch.tensor([[0.5, 9.0, 0.5]]), step_end), torch.zeros(1, 3)
    )
    no_steps = torch.zeros(1, 3, dtype=torch.bool)
    assert torch.equal(grpo_process_advantages(torch.ones(1, 3), no_steps), torch.zeros(1, 3))


@pytest.mark.parametrize("name", BATCH_WIDE)
def test_batch_wide_estimators_are_refused_under_torchrun(monkeypatch, name):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=f"algo.advantage={name} .statistics over the whole"):
        compose(["model=tiny", "sampler=hf", f"algo.advantage={name}"])
