"""A researcher's own loss and estimator from a file (tests/fixtures/my_losses.py): settings
from the signature, set from the command line, checked before anything loads, and trained."""

import pytest
import torch

from rlcli.config import ConfigError
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose
from tests.conftest import TINY_ANY_ALGO

LOSS = "algo.loss=tests/fixtures/my_losses.py:covariance_penalty"
ADVANTAGE = "algo.advantage=tests/fixtures/my_losses.py:centred"


def test_a_loss_and_an_estimator_from_a_file_train_with_their_settings():
    cfg = compose([*TINY_ANY_ALGO, LOSS, ADVANTAGE, "+algo.loss_settings.coef=2.0",
                   "+algo.advantage_settings.scale=3.0"])  # fmt: skip
    run = setup(cfg)
    assert run.objective.loss.settings == {"share": 0.1, "coef": 0.5}  # from the signature
    assert run.objective.loss_settings == {"coef": 2.0}  # from the command line
    before = [p.detach().clone() for p in run.policy.parameters()]
    metrics = [train_step(run) for _ in range(2)]
    assert all(m["covariance_penalty/penalised"] > 0 for m in metrics), metrics
    moved = [
        not torch.equal(a, b.detach()) for a, b in zip(before, run.policy.parameters(), strict=True)
    ]
    assert any(moved)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            [LOSS, "+algo.loss_settings.coeff=2"],
            "algo.loss_settings.coeff is not a setting of tests/fixtures/my_losses.py:"
            "covariance_penalty; its settings are: share=0.1, coef=0.5.",
        ),
        ([LOSS, "+algo.loss_settings.coef=lots"], "algo.loss_settings.coef='lots' must be a float"),
        (["algo.loss=tests/fixtures/my_losses.py:nothing"], "has no function 'nothing'"),
        (["algo.loss=nowhere.py:fn"], "algo.loss=nowhere.py:fn: no such file"),
        (["algo.loss=cispoo"], "algo.loss=cispoo is not a loss: cispo, clip_cov, gmpo, gpg,"),
        (
            ["algo=gmpo", "algo.advantage=grpo_process", "reward=process"],
            "algo.loss=gmpo needs one advantage per response",
        ),
        (
            ["algo.advantage=tests/fixtures/my_losses.py:centred", "trainer.group_size=1"],
            "trainer.group_size=1 is too small",
        ),
        (["algo.top_entropy=1.5"], "algo.top_entropy=1.5 must lie in [0, 1]"),
    ],
)
def test_bad_pieces_and_settings_are_named_before_loading(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        compose([*TINY_ANY_ALGO, *overrides])


def test_a_users_loss_brings_its_mini_batch_selection_as_an_attribute():
    from rlcli.train.objective_config import objective_from_config
    from rlcli.train.pieces_chosen import loss_piece

    cfg = compose([*TINY_ANY_ALGO, "algo.loss=tests/fixtures/my_losses.py:frozen_selection"])
    piece = loss_piece(cfg.algo.loss)
    assert piece.select.__name__ == "most_negative_tokens"
    assert objective_from_config(cfg.algo, cfg.sampler, 1).select is piece.select


def test_a_failed_reward_is_left_out_of_a_users_estimators_group_by_the_caller():
    # The estimator (`centred`: R minus the group's mean) knows nothing of failed rewards; the
    # caller estimates a group with one from its scored responses alone.
    from rlcli.ops.advantages import AdvantageInputs
    from rlcli.ops.estimate import estimate
    from rlcli.train.pieces_chosen import advantage_piece

    nan = float("nan")
    scores = torch.tensor([1.0, nan, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0, nan, nan, nan, 1.0])
    x = AdvantageInputs(
        scores=scores, kl_penalty=torch.zeros(12, 2), mask=torch.ones(12, 2), group_size=4,
        prompt_ids=[p for p in "abc" for _ in range(4)],
    )  # fmt: skip
    advantages, _ = estimate(advantage_piece(ADVANTAGE.split("=")[1]), {"scale": 2.0}, x)
    # a: mean of (1, 0, 0.5) is 0.5; b: complete, mean 0.25; c: one scored response, no baseline
    assert advantages.tolist() == [1.0, 0.0, -1.0, 0.0, 1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]


def test_a_users_estimator_keeps_its_state_across_steps_and_in_the_checkpoint(tmp_path):
    import json

    from rlcli.train.loop import train

    history = "algo.advantage=tests/fixtures/my_losses.py:centred_on_history"
    cfg = compose([*TINY_ANY_ALGO, history, "trainer.prompts_per_step=2", "trainer.group_size=2",
                   "trainer.max_steps=2"])  # fmt: skip
    train(cfg, tmp_path)
    saved = json.loads((tmp_path / "checkpoints/step_2/trainer_state.json").read_text())
    assert saved["estimator_state"]["count"] == 8  # 2 steps x 4 responses, the trial not among them
    run = setup(compose([*TINY_ANY_ALGO, history]))
    assert run.estimator_state.count == 0  # a new run starts afresh
