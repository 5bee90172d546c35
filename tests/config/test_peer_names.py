"""Every TRL and verl name the page docs/from-trl-verl.md lists is answered with rlcli's, with an
override rlcli takes; and TRL's command-line style (`--learning_rate=1e-6`, `--num_generations
8`) is read as the overrides it stands for, or refused in one paragraph saying why."""

import re

import pytest

from rlcli.cli import main
from rlcli.config import ConfigError
from rlcli.config.overrides import (
    PEER_NAMES,
    check_overrides,
    group_choices,
    peer_message,
    peer_name,
    read_dashed,
    unknown_key_message,
)
from rlcli.lifecycle.checkpoint import resume_point
from rlcli.validate import compose
from tests.conftest import REPO

PAGE = REPO / "docs" / "from-trl-verl.md"
TOOLS = ("TRL", "verl")


def page_names() -> list[tuple[str, str, str]]:
    """(tool, name, value or "") for each option in the TRL and verl columns of the page's
    tables: their backticked words, with the value where one is given (`loss_type="grpo"`).
    Commands and calls (`accelerate launch`, `model.merge_and_unload()`) are no options."""
    found, columns = [], None
    for line in PAGE.read_text().splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if columns is None:  # the header row
            columns = {i: t for i, c in enumerate(cells) for t in TOOLS if c.startswith(t)}
            continue
        for i, tool in columns.items():
            for span in re.findall(r"`([^`]+)`", cells[i]):
                name, _, value = span.partition("=")
                if re.fullmatch(r"[a-z0-9_.]+(\.\*)?", name):  # not datasets.Dataset
                    found.append((tool, name, value.strip('"')))
    return found


def is_rlclis(override: str) -> bool:
    """Whether `key=value` sets one of rlcli's keys or groups."""
    key = override.partition("=")[0]
    return key in group_choices() or unknown_key_message(key) is None


def suggested(message: str) -> list[str]:
    """The overrides an answer tells a user to write."""
    instead = re.search(r", write (.+)\.$", message)
    assert instead, message
    return instead[1].split()


def test_the_page_lists_the_names_the_issue_found_unanswered():
    names = {name for _, name, _ in page_names()}
    assert len(names) > 100
    assert {"use_peft", "lora_r", "reward_funcs", "push_to_hub", "critic.optim.lr",
            "vllm_importance_sampling_correction", "trainer.n_gpus_per_node", "trainer.nnodes",
            "model_init_kwargs", "num_completions_to_print", "norm_adv_by_std_in_grpo",
            "actor.policy_loss.loss_mode", "actor_rollout_ref.model.lora_rank",
            "resume_from_checkpoint", "kl_ctrl.*"} <= names  # fmt: skip


@pytest.mark.parametrize(("tool", "name", "value"), page_names())
def test_every_trl_and_verl_name_on_the_page_is_answered_with_rlclis(tool, name, value):
    if name in group_choices() or unknown_key_message(name) is None:
        return  # rlcli's own key or group as well (trainer.val_before_train, data.seed, model)
    key = name.replace("*", "some_setting")  # a setting under `kl_ctrl.*`
    found = peer_name(key)
    assert found is not None and tool in PEER_NAMES[found].tool, unknown_key_message(key)
    message = unknown_key_message(key, value)
    assert message == peer_message(key, found, value)
    if re.fullmatch(r"[\w.-]+", value):  # a value the page gives: the override for it
        assert all(is_rlclis(o) for o in suggested(message)), message


@pytest.mark.parametrize(
    ("override", "instead"),
    [
        ("use_peft=true", "model.lora.rank=16"),
        ("lora_r=8", "model.lora.rank=8"),
        ("lora_alpha=16", "model.lora.alpha=16"),
        ("target_modules=q_proj", "model.lora.target_modules=[q_proj]"),
        ("actor_rollout_ref.model.target_modules=all-linear",
         "model.lora.target_modules=[all-linear]"),
        ("actor_rollout_ref.model.lora_rank=8", "model.lora.rank=8"),
        ("reward_funcs=docs/examples/trl_rewards.py:correct",
         "reward=python reward.function=docs/examples/trl_rewards.py:correct"),
        ("push_to_hub=false", "trainer.push_to_hub=null"),
        ("vllm_importance_sampling_correction=true", "sampler.old_logp=sampler"),
        ("vllm_importance_sampling_cap=3.0", "sampler.tis_cap=3.0"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", "algo=gmpo"),
        ("algorithm.norm_adv_by_std_in_grpo=false", "algo.advantage=dr_grpo"),
        ("critic.optim.lr=1e-5", "algo.critic_lr=1e-5"),
        ("model_name_or_path=Qwen/Qwen2.5-0.5B", "model.path=Qwen/Qwen2.5-0.5B"),
        ("top_k=50", "sampler.top_k=50"),
        ("min_p=0.1", "sampler.min_p=0.1"),
        ("repetition_penalty=1.1", "sampler.repetition_penalty=1.1"),
        ("rollout.val_kwargs.temperature=0.6", "eval.temperature=0.6"),
        ("algorithm.filter_groups.metric=acc", "algo.filter_metric=correctness"),
    ],
)  # fmt: skip
def test_the_override_an_answer_suggests_composes(override, instead):
    key, _, value = override.partition("=")
    message = unknown_key_message(key, value)
    assert suggested(message) == instead.split(), message
    if "sampler.old_logp=sampler" in instead:  # it needs sampler=vllm, the default
        pytest.importorskip("vllm")
    compose(["model=tiny", *instead.split()])  # valid, values included


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("trainer.n_gpus_per_node", "torchrun --nproc_per_node N -m rlcli train"),
        ("trainer.nnodes", "torchrun --nnodes N"),
        ("num_completions_to_print", "logger.print_samples_every"),
        ("model_init_kwargs", "model.init_kwargs.trust_remote_code=true"),
        ("push_to_hub", "trainer.push_to_hub=user/name"),
        ("algorithm.kl_ctrl.type", "algo.kl_target"),
        ("reward_model.overlong_buffer.penalty_factor", "reward.overlong_cache_len"),
    ],
)
def test_a_name_without_an_override_says_what_comes_closest(key, says):
    message = unknown_key_message(key, "true")
    assert says in message and "Valid keys" not in message and "write" not in message, message


@pytest.mark.parametrize("given", ["true", "True", "false"])
def test_resume_from_checkpoint_is_answered_with_a_resume_rlcli_takes(tmp_path, given):
    overrides = suggested(unknown_key_message("resume_from_checkpoint", given))
    cfg = compose(["model=tiny", "sampler=hf", *overrides])
    # A fresh run directory: true (auto) and false (null) both start afresh, without an error.
    assert resume_point(cfg.trainer.resume, tmp_path, say=print) is None


def test_a_hub_id_given_as_the_model_group_is_sent_to_model_path():
    with pytest.raises(ConfigError, match="write model.path=Qwen/Qwen2.5-0.5B"):
        check_overrides(["model=Qwen/Qwen2.5-0.5B"])


@pytest.mark.parametrize(
    ("argv", "overrides"),
    [
        (["--learning_rate=1e-6", "--num_generations", "8"],
         ["trainer.lr=1e-6", "trainer.group_size=8"]),
        (["--trainer.lr", "1e-6", "--algo=dapo", "--hydra.run.dir=runs/a"],
         ["trainer.lr=1e-6", "algo=dapo", "hydra.run.dir=runs/a"]),
        (["--epsilon_high", "0.28"], ["algo.clip=decoupled", "algo.eps_high=0.28"]),
        (["--lora_target_modules", "q_proj", "v_proj"],
         ["model.lora.target_modules=[q_proj,v_proj]"]),
        (["--use_peft", "--bf16", "--use_vllm", "false"],
         ["model.lora.rank=16", "trainer.bf16_autocast=true", "sampler=hf"]),
        (["--max_steps", "-1", "trainer.seed=3"], ["trainer.max_steps=-1", "trainer.seed=3"]),
        (["--resume_from_checkpoint", "true"], ["trainer.resume=auto"]),
        (["-m", "--learning_rate", "1e-6,3e-6"], ["-m", "trainer.lr=1e-6,3e-6"]),
    ],
)  # fmt: skip
def test_trls_style_is_read_as_overrides(argv, overrides):
    read, said = read_dashed(argv)
    assert read == overrides
    dashed = [a for a in argv if a.startswith("--")]
    assert [s.split(" ")[0] for s in said] == dashed


def test_the_line_says_what_each_option_was_read_as():
    _, said = read_dashed(["--learning_rate=1e-6", "--num_generations", "8", "a=1"])
    assert said == ["--learning_rate=1e-6 as trainer.lr=1e-6", "--num_generations 8 as "
                    "trainer.group_size=8"]  # fmt: skip


def test_hydras_flags_and_overrides_are_left_as_they_are():
    argv = ["-m", "--multirun", "--cfg", "job", "--cfg=job", "--config-name", "config", "-cn",
            "x", "--info", "defaults", "--hydra-help", "--resolve", "--multi", "trainer.lr=1",
            "~trainer.lr_scheduler_kwargs.x", "+trainer.lr_scheduler_kwargs.y=2"]  # fmt: skip
    assert read_dashed(argv) == (argv, [])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--num_train_epochs", "3"], "--num_train_epochs 3 is read as num_train_epochs=3 "
         "(rlcli's options are key=value: Hydra's style, without dashes): num_train_epochs is "
         "TRL's name; rlcli has no such option: it counts steps, not epochs"),
        (["--learning_rate"], "--learning_rate has no value (rlcli's options are key=value: "
         "Hydra's style, without dashes): learning_rate is TRL's name; in rlcli it is "
         "trainer.lr: AdamW's learning rate. Write trainer.lr=VALUE."),
        (["--trainer.lr", "--use_peft"], "--trainer.lr has no value (rlcli's options are "
         "key=value: Hydra's style, without dashes): write trainer.lr=VALUE."),
        (["--no_such_option=1"], "no_such_option is not a config key: the config has no "
         "'no_such_option'."),
        (["--push_to_hub"], "trainer.push_to_hub=user/name"),
    ],
)  # fmt: skip
def test_an_option_with_no_single_reading_is_refused_saying_why(argv, says):
    with pytest.raises(ConfigError) as refused:
        read_dashed(argv)
    assert says in str(refused.value)


def test_rlcli_train_reads_trls_style_and_says_so(capsys):
    main(["train", "model=tiny", "--learning_rate=1e-6", "--num_generations", "8", "--cfg", "job"])
    out, err = capsys.readouterr()
    assert "lr: 1.0e-06" in out and "group_size: 8" in out
    assert ("rlcli: read --learning_rate=1e-6 as trainer.lr=1e-6, --num_generations 8 as "
            "trainer.group_size=8\n") in err  # fmt: skip


def test_rlcli_train_refuses_an_option_it_cannot_read_in_one_paragraph(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "model=tiny", "--num_train_epochs", "3", f"hydra.run.dir={tmp_path / 'r'}"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcli: error: --num_train_epochs 3 is read as") and err.count("\n") == 1
    assert not (tmp_path / "r").exists()
