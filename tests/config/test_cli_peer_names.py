"""TRL's and verl's names on rlcli's command line: the message names rlcli's field (and writes the
override for the value given), in one paragraph with exit code 2, before anything loads."""

import re

import pytest

from rlcli.cli import main
from rlcli.config.overrides import (
    PEER_NAMES,
    check_overrides,
    group_choices,
    peer_override,
    unknown_key_message,
)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("trainer.num_generations=8", "trainer.num_generations is not a config key: "
         "num_generations is TRL's name; in rlcli it is trainer.group_size: the responses "
         "sampled per prompt. Instead of trainer.num_generations=8, write trainer.group_size=8."),
        ("learning_rate=1e-6", "learning_rate is TRL's name; in rlcli it is trainer.lr"),
        ("per_device_train_batch_size=4", "in rlcli it is trainer.micro_batch_size: the most "
         "responses per forward and backward pass. The prompts sampled per step"),
        ("lr_scheduler_type=cosine", "write trainer.lr_scheduler=cosine."),
        ("loss_type=dr_grpo", "write algo.aggregation=seq_mean_token_sum_norm."),
        ("warmup_ratio=0.1", "warmup_ratio is TRL's name; rlcli has no such option: the closest "
         "is trainer.warmup_steps"),
        ("actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.n is verl's name; in rlcli "
         "it is trainer.group_size"),
        ("rollout.n=8", "rollout.n is not a config key: actor_rollout_ref.rollout.n is verl's"),
        ("data.train_batch_size=64", "data.train_batch_size is verl's name; in rlcli it is "
         "trainer.prompts_per_step: the prompts sampled per step. Instead of "
         "data.train_batch_size=64, write trainer.prompts_per_step=64."),
        ("actor_rollout_ref.actor.clip_ratio_high=0.28", "write algo.clip=decoupled "
         "algo.eps_high=0.28."),
        ("trainer.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_coef is verl's name; in "
         "rlcli it is algo.beta"),
        ("algorithm.adv_estimator=reinforce_plus_plus", "write algo.advantage=reinforce_pp."),
        ("trainer.total_epochs=3", "rlcli has no such option: it counts steps, not epochs"),
        ("algorithm.gamma=0.99", "write algo.advantage_settings.gamma=0.99."),
        # rlcli's own key from before the estimators' settings became their own
        ("algo.lam=0.9", "algo.lam is now algo.advantage_settings.lam: an advantage estimator's "
         "settings are its own (gae's gamma, lam and whiten; reinforce_pp's gamma), listed by "
         "rlcli train --help algo. Instead of algo.lam=0.9, write "
         "algo.advantage_settings.lam=0.9."),
    ],
)  # fmt: skip
def test_a_trl_or_verl_name_is_answered_with_rlclis(tmp_path, capsys, override, says):
    with pytest.raises(SystemExit) as done:
        main(["train", "model=tiny", override, f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcli: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and says in err
    assert not (tmp_path / "run").exists()


def rlcli_keys(override: str) -> list[str]:
    """The keys an override the table suggests sets: `a.b=1 c=2` -> [a.b, c]."""
    return [part.split("=")[0] for part in override.split() if "=" in part]


def test_every_field_the_table_names_is_rlclis():
    # A typo in the table (trainer.group_sizes) would send a user to a second error.
    groups = group_choices()
    fields = {p.rlcli for p in PEER_NAMES.values() if p.rlcli and re.fullmatch(r"[\w.]+", p.rlcli)}
    examples = [peer_override(p, "1") for p in PEER_NAMES.values() if p.example]
    examples += [v for p in PEER_NAMES.values() for v in p.values.values() if v]
    keys = fields | {k for e in examples for k in rlcli_keys(e)}
    for key in sorted(keys - {"hydra.run.dir"}):
        assert key in groups or unknown_key_message(key) is None, key
    for example in examples:  # a group choice it suggests exists
        for part in example.split():
            group, _, choice = part.partition("=")
            if group in groups:
                assert choice in groups[group], example


def test_rlclis_own_keys_and_a_losss_settings_are_not_taken_for_other_tools():
    check_overrides(["trainer.group_size=8", "trainer.lr_scheduler=cosine"])
    # Under a free-form field the loss's own signature decides (validate), not the schema.
    check_overrides(["algo.loss_settings.tau_pos=2", "+algo.advantage_settings.scale=3"])
    # A last part that is an rlcli field put under the wrong section gets the usual message.
    assert "sampler has no 'path'" in unknown_key_message("sampler.path")


def test_a_losss_setting_is_set_on_the_command_line(capsys):
    main(["train", "model=tiny", "algo=sapo", "algo.loss_settings.tau_pos=2", "--cfg", "job"])
    assert "tau_pos: 2" in capsys.readouterr().out
