"""Checks of a command line's overrides before Hydra composes them: a group choice that does
not exist, or a key that is not in the config, is named with the valid ones in one paragraph
(Hydra's own messages for them span many lines). A key that is TRL's or verl's name for an
option (`num_generations`, `actor_rollout_ref.rollout.n`) is answered with rlcli's name for it
(`PEER_NAMES`). They read only the schema and conf/'s files, not the registries, so they sit at
the bottom beside the schema.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlcli.config.free_form import refuse_deletion
from rlcli.config.moved import MOVED, moved_message
from rlcli.config.schema import CONF_DIR, Config, ConfigError


def group_choices(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """Each config group of conf/ (algo, reward, ...) and its choices (the YAML file names)."""
    return {
        d.name: sorted(f.stem for f in d.glob("*.yaml"))
        for d in sorted(conf_dir.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


@dataclass(frozen=True)
class PeerName:
    """What another tool's option is in rlcli."""

    tool: str  # whose name it is
    rlcli: str | None  # rlcli's field (or group) for it; None where rlcli has nothing like it
    means: str  # what it is, how it maps, and what comes closest where rlcli has no equivalent
    example: str | None = None  # the rlcli override for the value given, "{value}" in it
    values: Mapping[str, str] = field(default_factory=dict)  # the override for given values


P = PeerName
EQUAL_KL = {"kl": "algo.kl=k1", "mse": "algo.kl=k2", "low_var_kl": "algo.kl=k3"}
KL_MEANS = ("the KL estimator (verl's kl is k1, mse is k2, low_var_kl is k3, unclamped here; "
            "abs and full have no equivalent)")  # fmt: skip
# Other tools' names for rlcli's options, answered when one is given as a key. A name holding
# dots is matched whole or by its tail (rollout.n); one without, also under any section
# (trainer.num_generations). TRL: GRPOConfig and the transformers TrainingArguments it extends.
PEER_NAMES: dict[str, PeerName] = {
    # TRL (GRPOConfig, TrainingArguments)
    "num_generations": P("TRL", "trainer.group_size", "the responses sampled per prompt",
                         "trainer.group_size={value}"),
    "learning_rate": P("TRL", "trainer.lr", "AdamW's learning rate", "trainer.lr={value}"),
    "max_prompt_length": P("TRL", "sampler.max_prompt_tokens", "the longest prompt in tokens, "
                           "chat template applied; longer ones are an error or dropped "
                           "(sampler.long_prompts), never cut",
                           "sampler.max_prompt_tokens={value}"),
    "max_completion_length": P("TRL", "sampler.max_new_tokens", "the most tokens per response",
                               "sampler.max_new_tokens={value}"),
    "per_device_train_batch_size": P(
        "TRL", "trainer.micro_batch_size", "the most responses per forward and backward pass. "
        "The prompts sampled per step, TRL's per_device_train_batch_size x "
        "gradient_accumulation_steps x processes / num_generations, are trainer.prompts_per_step"),
    "generation_batch_size": P("TRL", "trainer.prompts_per_step", "counted in prompts, not "
                               "responses (generation_batch_size / num_generations)"),
    "steps_per_generation": P("TRL", "trainer.mini_batches", "the optimiser steps made from each "
                              "sampled batch", "trainer.mini_batches={value}"),
    "gradient_accumulation_steps": P(
        "TRL", None, "it accumulates gradients over as many passes as a mini-batch needs; "
        "trainer.micro_batch_size and trainer.max_tokens_per_micro_batch set a pass's size, "
        "trainer.mini_batches the optimiser steps made from each sampled batch"),
    "num_iterations": P("TRL", "trainer.epochs", "the passes over each sampled batch (mu)",
                        "trainer.epochs={value}"),
    "beta": P("TRL", "algo.beta", "the KL coefficient; 0 loads no reference model (rlcli's GRPO "
              "default is 0.04, TRL's 0.0)", "algo.beta={value}"),
    "epsilon": P("TRL", "algo.eps_low", "the clip width, on both sides unless "
                 "algo.clip=decoupled", "algo.eps_low={value}"),
    "epsilon_high": P("TRL", "algo.eps_high", "the upper clip width, read with "
                      "algo.clip=decoupled", "algo.clip=decoupled algo.eps_high={value}"),
    "delta": P("TRL", "algo.dual_clip", "the bound on the ratio where the advantage is negative",
               "algo.dual_clip={value}"),
    "temperature": P("TRL and verl", "sampler.temperature", "the sampling temperature; "
                     "evaluation has its own, eval.temperature", "sampler.temperature={value}"),
    "top_p": P("TRL and verl", "sampler.top_p", "nucleus sampling; evaluation has its own, "
               "eval.top_p", "sampler.top_p={value}"),
    "max_steps": P("TRL", "trainer.max_steps", "the steps to run, each on a newly sampled "
                   "batch", "trainer.max_steps={value}"),
    "num_train_epochs": P("TRL", None, "it counts steps, not epochs (trainer.max_steps = "
                          "epochs x training prompts / trainer.prompts_per_step)"),
    "warmup_steps": P("TRL", "trainer.warmup_steps", "the linear warm-up's steps",
                      "trainer.warmup_steps={value}"),
    "warmup_ratio": P("TRL", None, "the closest is trainer.warmup_steps, in steps (the ratio "
                      "x trainer.max_steps)"),
    "lr_scheduler_type": P("TRL", "trainer.lr_scheduler", "the learning-rate schedule, by the "
                           "same transformers names (linear, cosine, constant_with_warmup, ...)",
                           "trainer.lr_scheduler={value}"),
    "loss_type": P("TRL", "algo.aggregation", "how token losses are averaged (TRL's grpo is "
                   "seq_mean_token_mean, dapo and bnpo are token_mean, dr_grpo is "
                   "seq_mean_token_sum_norm); its cispo, sapo and luspo are algo=cispo, algo=sapo "
                   "and algo=luspo", values={
                       "grpo": "algo.aggregation=seq_mean_token_mean",
                       "dapo": "algo.aggregation=token_mean", "bnpo": "algo.aggregation=token_mean",
                       "dr_grpo": "algo.aggregation=seq_mean_token_sum_norm",
                       "cispo": "algo=cispo", "sapo": "algo=sapo", "luspo": "algo=luspo"}),
    "scale_rewards": P("TRL", "algo.advantage", "group (or true) is algo.advantage=grpo, "
                       "(R - mean) / std in each group, none (or false) is "
                       "algo.advantage=dr_grpo, R - mean, and batch is closest to "
                       "algo.advantage=reinforce_pp_baseline (R - group mean, whitened over the "
                       "batch)", values={
                           "group": "algo.advantage=grpo", "true": "algo.advantage=grpo",
                           "none": "algo.advantage=dr_grpo", "false": "algo.advantage=dr_grpo",
                           "batch": "algo.advantage=reinforce_pp_baseline"}),
    "mask_truncated_completions": P("TRL", "algo.overlong_filter", "truncated responses left "
                                    "out of the loss", "algo.overlong_filter={value}"),
    "top_entropy_quantile": P("TRL", "algo.top_entropy", "the share of tokens of highest "
                              "entropy trained on; every token is 1.0 in TRL, 0 in rlcli",
                              "algo.top_entropy={value}", {"1.0": "algo.top_entropy=0",
                                                           "1": "algo.top_entropy=0"}),
    "importance_sampling_level": P("TRL", "algo.ratio", "token, or sequence (GSPO)",
                                   "algo.ratio={value}"),
    "max_grad_norm": P("TRL", "trainer.max_grad_norm", "the gradient-norm clip",
                       "trainer.max_grad_norm={value}"),
    "weight_decay": P("TRL", "trainer.weight_decay", "AdamW's weight decay",
                      "trainer.weight_decay={value}"),
    "seed": P("TRL", "trainer.seed", "the seed of python, numpy and torch (data.seed shuffles "
              "the records)", "trainer.seed={value}"),
    "bf16": P("TRL", "trainer.bf16_autocast", "bfloat16 autocast where the device has it "
              "(trainer.dtype is the weights' dtype)", "trainer.bf16_autocast={value}"),
    "gradient_checkpointing": P("TRL", "model.gradient_checkpointing", "recompute activations "
                                "in the backward pass", "model.gradient_checkpointing={value}"),
    "logging_steps": P("TRL", None, "it logs every step's metrics; logger.print_samples_every "
                       "prints responses every N steps, logger.samples_every saves them"),
    "log_completions": P("TRL", "logger.print_samples_every", "a table of responses every N "
                         "steps (0 = never)", values={"true": "logger.print_samples_every=1",
                                                      "false": "logger.print_samples_every=0"}),
    "save_steps": P("TRL", "trainer.save_every", "a checkpoint every N steps",
                    "trainer.save_every={value}"),
    "eval_steps": P("TRL", "trainer.eval_every", "a held-out evaluation every N steps",
                    "trainer.eval_every={value}"),
    "output_dir": P("TRL", "hydra.run.dir", "the run directory", "hydra.run.dir={value}"),
    "resume_from_checkpoint": P("TRL", "trainer.resume", "a checkpoint, auto (the run "
                                "directory's newest) or null", "trainer.resume={value}"),
    "hub_model_id": P("TRL", "trainer.push_to_hub", "the hub repo the final model is pushed "
                      "to", "trainer.push_to_hub={value}"),
    "report_to": P("TRL", "the logger group", "logger=wandb, logger=tensorboard or "
                   "logger=mlflow (metrics.jsonl is always written); several: "
                   "logger.backends=[jsonl,wandb,tensorboard]", values={
                       "wandb": "logger=wandb", "tensorboard": "logger=tensorboard",
                       "mlflow": "logger=mlflow", "none": "logger=jsonl"}),
    "use_vllm": P("TRL", "the sampler group", "sampler=vllm samples with vLLM (the default "
                  "when it is installed), sampler=hf with transformers' generate",
                  values={"true": "sampler=vllm", "false": "sampler=hf"}),
    "vllm_mode": P("TRL", "sampler.workers and sampler.urls", "colocate is sampler=vllm (the "
                   "engine in the learner's process); server is sampler.workers=N (vLLM servers "
                   "started by rlcli) or sampler.urls=[...] (rlcli rollout-server elsewhere)",
                   values={"colocate": "sampler=vllm"}),
    "vllm_gpu_memory_utilization": P("TRL", "sampler.gpu_memory_utilization", "the share of GPU "
                                     "memory vLLM may take",
                                     "sampler.gpu_memory_utilization={value}"),
    "vllm_tensor_parallel_size": P("TRL", "sampler.tensor_parallel_size", "the GPUs vLLM shards "
                                   "the model over", "sampler.tensor_parallel_size={value}"),
    "reward_weights": P("TRL", "reward.weights", "one weight per reward.components entry",
                        "reward.weights={value}"),
    # verl (ppo_trainer.yaml)
    "actor_rollout_ref.rollout.n": P("verl", "trainer.group_size", "the responses sampled per "
                                     "prompt", "trainer.group_size={value}"),
    "data.train_batch_size": P("verl", "trainer.prompts_per_step", "the prompts sampled per step",
                               "trainer.prompts_per_step={value}"),
    "data.max_prompt_length": P("verl", "sampler.max_prompt_tokens", "the longest prompt in "
                                "tokens; longer ones are an error or dropped "
                                "(sampler.long_prompts)", "sampler.max_prompt_tokens={value}"),
    "data.max_response_length": P("verl", "sampler.max_new_tokens", "the most tokens per "
                                  "response", "sampler.max_new_tokens={value}"),
    "data.train_files": P("verl", "data.path", "a .parquet or .jsonl file of prompts and answers",
                          "data=parquet data.path={value}"),
    "data.val_files": P("verl", "data.test_path", "the held-out file", "data.test_path={value}"),
    "data.prompt_key": P("verl", "data.prompt_field", "the record's prompt field",
                         "data.prompt_field={value}"),
    "actor_rollout_ref.model.path": P("verl", "model.path", "a local directory or hub id",
                                      "model.path={value}"),
    "actor_rollout_ref.actor.optim.lr": P("verl", "trainer.lr", "AdamW's learning rate",
                                          "trainer.lr={value}"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": P("verl", "trainer.warmup_steps", "the "
                                                       "linear warm-up's steps",
                                                       "trainer.warmup_steps={value}"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": P(
        "verl", "trainer.mini_batches", "verl gives the prompts per mini-batch, rlcli the number "
        "of mini-batches (optimiser steps) per sampled batch (trainer.mini_batches = "
        "data.train_batch_size / ppo_mini_batch_size)"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": P(
        "verl", "trainer.micro_batch_size", "the most responses per forward and backward pass",
        "trainer.micro_batch_size={value}"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": P(
        "verl", "trainer.max_tokens_per_micro_batch", "the most tokens per forward and backward "
        "pass", "trainer.max_tokens_per_micro_batch={value}"),
    "actor_rollout_ref.actor.ppo_epochs": P("verl", "trainer.epochs", "the passes over each "
                                            "sampled batch", "trainer.epochs={value}"),
    "actor_rollout_ref.actor.clip_ratio": P("verl", "algo.eps_low", "the clip width",
                                            "algo.eps_low={value}"),
    "actor_rollout_ref.actor.clip_ratio_low": P("verl", "algo.eps_low", "the lower clip width",
                                                "algo.eps_low={value}"),
    "actor_rollout_ref.actor.clip_ratio_high": P("verl", "algo.eps_high", "the upper clip width, "
                                                 "read with algo.clip=decoupled",
                                                 "algo.clip=decoupled algo.eps_high={value}"),
    "actor_rollout_ref.actor.clip_ratio_c": P("verl", "algo.dual_clip", "the dual-clip bound",
                                              "algo.dual_clip={value}"),
    "actor_rollout_ref.actor.use_kl_loss": P(
        "verl", "algo.beta", "the KL to the reference is in the loss when algo.beta > 0 "
        "(algo.kl_in=loss, the default); algo.beta=0 turns it off and loads no reference",
        values={"false": "algo.beta=0", "true": "algo.kl_in=loss"}),
    "actor_rollout_ref.actor.kl_loss_coef": P("verl", "algo.beta", "the KL coefficient",
                                              "algo.beta={value}"),
    "actor_rollout_ref.actor.kl_loss_type": P("verl", "algo.kl", KL_MEANS, values=EQUAL_KL),
    "actor_rollout_ref.actor.entropy_coeff": P("verl", "algo.entropy_coef", "the entropy bonus",
                                               "algo.entropy_coef={value}"),
    "actor_rollout_ref.actor.grad_clip": P("verl", "trainer.max_grad_norm", "the gradient-norm "
                                           "clip", "trainer.max_grad_norm={value}"),
    "actor_rollout_ref.actor.loss_agg_mode": P(
        "verl", "algo.aggregation", "how token losses are averaged, by the same names with _ "
        "for - (seq-mean-token-sum has no equivalent)", values={
            m.replace("_", "-"): f"algo.aggregation={m}"
            for m in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")}),
    "actor_rollout_ref.rollout.gpu_memory_utilization": P(
        "verl", "sampler.gpu_memory_utilization", "the share of GPU memory vLLM may take",
        "sampler.gpu_memory_utilization={value}"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": P(
        "verl", "sampler.tensor_parallel_size", "the GPUs vLLM shards the model over",
        "sampler.tensor_parallel_size={value}"),
    "algorithm.adv_estimator": P(
        "verl", "algo.advantage", "the advantage estimator, by verl's names but "
        "reinforce_plus_plus (reinforce_pp) and reinforce_plus_plus_baseline "
        "(reinforce_pp_baseline); gae comes with PPO's critic (algo=ppo)", values={
            "gae": "algo=ppo", "reinforce_plus_plus": "algo.advantage=reinforce_pp",
            "reinforce_plus_plus_baseline": "algo.advantage=reinforce_pp_baseline",
            **{a: f"algo.advantage={a}" for a in ("grpo", "rloo", "remax", "opo", "gpg")}}),
    "algorithm.use_kl_in_reward": P("verl", "algo.kl_in", "where the KL goes, reward or loss",
                                    values={"true": "algo.kl_in=reward",
                                            "false": "algo.kl_in=loss"}),
    "algorithm.kl_penalty": P("verl", "algo.kl", KL_MEANS, values=EQUAL_KL),
    "algorithm.kl_ctrl.kl_coef": P("verl", "algo.beta", "the KL coefficient", "algo.beta={value}"),
    "algorithm.kl_ctrl.target_kl": P("verl", "algo.kl_target", "the adaptive controller's "
                                     "target", "algo.kl_target={value}"),
    "algorithm.kl_ctrl.horizon": P("verl", "algo.kl_horizon", "the adaptive controller's horizon",
                                   "algo.kl_horizon={value}"),
    "algorithm.gamma": P("verl", "algo.advantage_settings.gamma", "GAE's discount (algo=ppo)",
                         "algo.advantage_settings.gamma={value}"),
    "algorithm.lam": P("verl", "algo.advantage_settings.lam", "GAE's lambda (algo=ppo)",
                       "algo.advantage_settings.lam={value}"),
    "trainer.total_training_steps": P("verl", "trainer.max_steps", "the steps to run",
                                      "trainer.max_steps={value}"),
    "trainer.total_epochs": P("verl", None, "it counts steps, not epochs (trainer.max_steps = "
                              "epochs x training prompts / trainer.prompts_per_step)"),
    "trainer.save_freq": P("verl", "trainer.save_every", "a checkpoint every N steps",
                           "trainer.save_every={value}"),
    "trainer.test_freq": P("verl", "trainer.eval_every", "a held-out evaluation every N steps",
                           "trainer.eval_every={value}"),
    "trainer.val_before_train": P("verl", "trainer.val_before_train", "a held-out evaluation "
                                  "before the first step", "trainer.val_before_train={value}"),
    "trainer.logger": P("verl", "the logger group", "logger=wandb, logger=tensorboard or "
                        "logger=mlflow (metrics.jsonl is always written); several: "
                        "logger.backends=[jsonl,wandb]"),
    "trainer.project_name": P("verl", "logger.project", "the tracker's project",
                              "logger.project={value}"),
    "trainer.experiment_name": P("verl", "logger.run_name", "the tracker's run name",
                                 "logger.run_name={value}"),
    "trainer.default_local_dir": P("verl", "hydra.run.dir", "the run directory, checkpoints in "
                                   "its checkpoints/", "hydra.run.dir={value}"),
    "trainer.resume_mode": P("verl", "trainer.resume", "auto (the run directory's newest), a "
                             "checkpoint path, or null", values={"auto": "trainer.resume=auto",
                                                                 "disable": "trainer.resume=null"}),
    "custom_reward_function.path": P("verl", "reward.function", "your reward function as "
                                     "FILE.py:NAME, with reward=python"),
}  # fmt: skip


def peer_name(key: str) -> str | None:
    """The name in PEER_NAMES that `key` is: itself, a dotted name it is the tail of
    (`rollout.n`) or one it ends with (`trainer.num_generations`), else one with its last part
    (`trainer.clip_ratio_high`); None when it is no other tool's name."""
    if key in PEER_NAMES:
        return key
    tails = [n for n in PEER_NAMES if n.endswith(f".{key}") or key.endswith(f".{n}")]
    if tails:
        return max(tails, key=len)
    # A last part that is the name of an rlcli field (path, lr) is more likely that field put
    # under the wrong section: the usual message lists the section's keys.
    last = key.rsplit(".", 1)[-1]
    if last in field_names():
        return None
    return next((n for n in PEER_NAMES if n.rsplit(".", 1)[-1] == last), None)


def field_names(node=None) -> set[str]:
    """The names of every field and section of the config, at any depth."""
    node = Config() if node is None else node
    names = set()
    for f in dataclasses.fields(node):
        names.add(f.name)
        if dataclasses.is_dataclass(value := getattr(node, f.name)):
            names |= field_names(value)
    return names


def peer_message(key: str, name: str, value: str | None = None) -> str:
    """`key` (the given form of the other tool's `name`) is not rlcli's: what to write."""
    peer = PEER_NAMES[name]
    where = f"in rlcli it is {peer.rlcli}" if peer.rlcli else "rlcli has no such option"
    message = f"{name} is {peer.tool}'s name; {where}: {peer.means}."
    if peer.rlcli == name:  # the same name in both tools, given without its section
        message = f"the key is {name}, as in {peer.tool}: {peer.means}."
    if key != name:
        message = f"{key} is not a config key: {message}"
    given = (value or "").strip()
    instead = peer.values.get(given.lower()) or (
        peer.example.format(value=given) if peer.example and given else None
    )
    if instead:
        message += f" Instead of {key}={given}, write {instead}."
    return message


def unknown_key_message(key: str, value: str | None = None) -> str | None:
    """None when `key` (dotted) is a field of the config, or lies under a free-form one (a
    loss's settings); else a message naming the valid keys, or rlcli's name for it when it is
    TRL's or verl's (`value`, the one given, then goes into the override it suggests)."""
    if key in MOVED:  # one of rlcli's own earlier keys
        return moved_message(key, value)
    node, parts, free_form = Config(), key.split("."), False
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the config"
        if free_form:
            return None  # e.g. algo.loss_settings.tau_pos: the piece's signature checks it
        if not dataclasses.is_dataclass(node):
            return f"{key} is not a config key: {where} is a value, not a section."
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            if (name := peer_name(key)) is not None:
                return peer_message(key, name, value)
            valid = sorted(fields)
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f" Did you mean {'.'.join([*parts[:depth], close[0]])}?" if close else ""
            return (
                f"{key} is not a config key: {where} has no {part!r}.{hint} Valid keys of "
                f"{where}: {', '.join(valid)}."
            )
        free_form = str(fields[part].type).startswith("dict")
        node = getattr(node, part)
    return None


def check_overrides(overrides: Sequence[str]) -> None:
    """Raise ConfigError for a group choice that does not exist, a key that is not in the
    config, or the deletion of one of rlcli's keys, before Hydra composes (whose own messages
    span many lines)."""
    groups = group_choices()
    for override in overrides:
        key, sign, value = override.partition("=")
        key = key.lstrip("+")
        if key.startswith("~") and not key.startswith(("~hydra", "~recipe")):
            refuse_deletion(key[1:], unknown_key_message(key[1:]))  # a hole Hydra would leave
        if not sign or key.startswith(("hydra", "~", "-")) or "@" in key or key == "recipe":
            continue
        if key in groups:
            # A sweep (-m) lists choices with commas; other sweep syntax is left to Hydra.
            chosen = [] if "(" in value else value.split(",")
            for name in chosen:
                if name not in groups[key] and name != "null":
                    raise ConfigError(
                        f"{key}={name} is not one of the valid choices for {key}: "
                        f"{', '.join(groups[key])}."
                    )
        elif (message := unknown_key_message(key, value)) is not None:
            raise ConfigError(message)


def check_syntax(overrides: Sequence[str]) -> None:
    """Raise ConfigError for an override Hydra's grammar cannot read (`trainer.lr=[1,`, a
    word without `=`): Hydra itself reports it with exit code 1, not a config error's 2."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as err:
            # Hydra's message: "Error parsing override ..." (sometimes), the parser's words,
            # then a link; the parser's words are what locate the mistake.
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            words = [line for line in lines if not line.startswith(("Error parsing", "See "))]
            why = f" ({words[0]})" if words else ""
            raise ConfigError(
                f"{override!r} is not a valid override{why}. An override is key=value: a "
                "list as key=[a,b], a value holding spaces, commas, brackets, = or quotes "
                "quoted as key='a, b' (the whole argument in double quotes for the shell); "
                "see https://hydra.cc/docs/advanced/override_grammar/basic/."
            ) from None
