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
