"""Other tools' names for rlcli's options: `PeerName`, what one is in rlcli, and TRL's names
(`TRL_NAMES`; verl's are in `verl_names.py`). `overrides.py` answers one given as a key with
rlcli's name and the override to write, and reads TRL's `--name value` style through them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PeerName:
    """What another tool's option is in rlcli."""

    tool: str  # whose name it is
    rlcli: str | None  # rlcli's field (or group) for it; None where rlcli has nothing like it
    means: str  # what it is, how it maps, and what comes closest where rlcli has no equivalent
    # The rlcli override for the value given: "{value}" in it, or "{list}", the value as a list
    # ([q_proj] for q_proj; a list stays as it is).
    example: str | None = None
    # The override for given values (lowercase), before the example; None: no override fits
    values: Mapping[str, str | None] = field(default_factory=dict)


P = PeerName
EQUAL_KL = {"kl": "algo.kl=k1", "mse": "algo.kl=k2", "low_var_kl": "algo.kl=k3"}
KL_MEANS = ("the KL estimator (verl's kl is k1, mse is k2, low_var_kl is k3, unclamped here; "
            "abs and full have no equivalent)")  # fmt: skip
LORA_MODULES = "the layers given adapters: [all-linear] (every linear layer but the head) or names"
# TRL's names: GRPOConfig, the transformers TrainingArguments it extends, and the ModelConfig and
# script arguments of its command line (`trl grpo --use_peft --lora_r 16 --reward_funcs ...`).
TRL_NAMES: dict[str, PeerName] = {
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
    "weight_decay": P("TRL and verl", "trainer.weight_decay", "AdamW's weight decay",
                      "trainer.weight_decay={value}"),
    "seed": P("TRL", "trainer.seed", "the seed of python, numpy and torch (data.seed shuffles "
              "the records)", "trainer.seed={value}"),
    "bf16": P("TRL", "trainer.bf16_autocast", "bfloat16 autocast where the device has it "
              "(trainer.dtype is the weights' dtype)", "trainer.bf16_autocast={value}"),
    "gradient_checkpointing": P("TRL", "model.gradient_checkpointing", "recompute activations "
                                "in the backward pass", "model.gradient_checkpointing={value}"),
    "torch_compile": P("TRL", "trainer.compile", "torch.compile of the learner's decoder "
                       "layers and head", "trainer.compile={value}"),
    "use_liger_kernel": P("TRL", None, "Liger's kernels are not used; trainer.compile=true "
                          "fuses the same norms, SwiGLU and rotary with torch.compile"),
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
    "resume_from_checkpoint": P("TRL", "trainer.resume", "auto (TRL's true: the run directory's "
                                "newest checkpoint, so rerunning with the same hydra.run.dir "
                                "continues; the default), a checkpoint of rlcli's "
                                "(RUN_DIR/checkpoints/step_N, or a run directory), or null (start "
                                "afresh)", "trainer.resume={value}", {
                                    "true": "trainer.resume=auto", "false": "trainer.resume=null",
                                    "none": "trainer.resume=null"}),
    "push_to_hub": P("TRL", "trainer.push_to_hub", "it names the hub repo itself (TRL's "
                     "hub_model_id): trainer.push_to_hub=user/name pushes the final checkpoint's "
                     "model there; null = no push", values={"true": None,
                                                           "false": "trainer.push_to_hub=null"}),
    "use_peft": P("TRL", "model.lora.rank", "LoRA is on when model.lora.rank > 0 (0, the default, "
                  "is full fine-tuning); TRL's lora_r is 16", values={
                      "true": "model.lora.rank=16", "false": "model.lora.rank=0"}),
    "lora_r": P("TRL", "model.lora.rank", "the adapters' rank r (0 = no LoRA)",
                "model.lora.rank={value}"),
    "lora_alpha": P("TRL", "model.lora.alpha", "the adapters' update is scaled by alpha / r",
                    "model.lora.alpha={value}"),
    "lora_dropout": P("TRL", "model.lora.dropout", "dropout on the adapters' input",
                      "model.lora.dropout={value}"),
    "lora_target_modules": P("TRL", "model.lora.target_modules", LORA_MODULES,
                             "model.lora.target_modules={list}"),
    "target_modules": P("peft (LoraConfig) and verl", "model.lora.target_modules", LORA_MODULES,
                        "model.lora.target_modules={list}"),
    "peft_config": P("TRL", "model.lora", "a LoraConfig's r, lora_alpha, lora_dropout and "
                     "target_modules are model.lora.rank, model.lora.alpha, model.lora.dropout "
                     "and model.lora.target_modules"),
    "model_name_or_path": P("TRL", "model.path", "a local directory or hub id",
                            "model.path={value}"),
    "model_init_kwargs": P("TRL", "model.init_kwargs", "from_pretrained's keyword arguments "
                           "(trust_remote_code, attn_implementation, ...), set one at a time: "
                           "model.init_kwargs.trust_remote_code=true"),
    "top_k": P("TRL and verl", "sampler.top_k", "sampling from the k most likely tokens only "
               "(0 or -1 = off)", "sampler.top_k={value}"),
    "min_p": P("TRL", "sampler.min_p", "tokens less likely than min_p times the most likely "
               "one's probability are not sampled", "sampler.min_p={value}"),
    "repetition_penalty": P("TRL", "sampler.repetition_penalty", "tokens already in the prompt "
                            "or response are made less likely (1.0 = off)",
                            "sampler.repetition_penalty={value}"),
    "vllm_importance_sampling_correction": P(
        "TRL", "sampler.old_logp", "sampler.old_logp=sampler weights each token's loss by "
        "min(exp(learner - sampler), sampler.tis_cap); learner only logs the mismatch; auto, the "
        "default, is sampler when vLLM samples in bfloat16", values={
            "true": "sampler.old_logp=sampler", "false": "sampler.old_logp=learner"}),
    "vllm_importance_sampling_cap": P("TRL", "sampler.tis_cap", "the cap on those weights, read "
                                      "with sampler.old_logp=sampler", "sampler.tis_cap={value}"),
    "reward_funcs": P("TRL", "reward.function", "your reward functions, with reward=python: "
                      "FILE.py:NAME or package.module:NAME (TRL's my_lib.rewards.f is "
                      "my_lib.rewards:f), a list for several; a TRL reward function works as it "
                      "is", "reward=python reward.function={value}"),
    "tools": P("TRL", "env.tools", "the tools of an episode (env=calculator, python or search), "
               "rlcli's by name and yours as FILE.py:NAME, a function of one string returning "
               "text", "env=calculator env.tools={list}"),
    "lr_scheduler_kwargs": P("TRL", "trainer.lr_scheduler_kwargs", "the schedule's settings by "
                             "transformers' names, one at a time: "
                             "trainer.lr_scheduler_kwargs.min_lr_rate=0.1"),
    "num_completions_to_print": P("TRL", None, "the closest: the console's table shows the first "
                                  "4 responses every logger.print_samples_every steps, and "
                                  "samples.jsonl holds every one (logger.samples_every)"),
}  # fmt: skip
