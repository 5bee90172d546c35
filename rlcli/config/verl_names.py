"""verl's names for rlcli's options (`VERL_NAMES`), by their place in verl's ppo_trainer.yaml.
A name ending in `.*` stands for the settings under it that have no entry of their own.
"""

from __future__ import annotations

from rlcli.config.peer_names import EQUAL_KL, KL_MEANS, LORA_MODULES, PeerName

P = PeerName
LOSS_ALGOS = ("gspo", "cispo", "sapo", "clip_cov", "kl_cov", "gpg")  # verl's loss_mode = algo
VERL_NAMES: dict[str, PeerName] = {
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
                                     "FILE.py:NAME, with reward=python (rlcli's or TRL's "
                                     "convention: fn(prompts, completions, **kwargs))"),
    "custom_reward_function.*": P("verl", "reward.function", "your reward function as "
                                  "FILE.py:NAME (the file, then verl's name), with reward=python"),
    "trainer.resume_from_path": P("verl", "trainer.resume", "a checkpoint of rlcli's "
                                  "(RUN_DIR/checkpoints/step_N) or a run directory",
                                  "trainer.resume={value}"),
    "trainer.n_gpus_per_node": P("verl", None, "torchrun starts a run's processes: torchrun "
                                 "--nproc_per_node N -m rlcli train ... trains with FSDP2 over "
                                 "N GPUs; rollout workers (sampler.workers) take GPUs of their "
                                 "own"),
    "trainer.nnodes": P("verl", None, "torchrun --nnodes N --rdzv_endpoint HOST:PORT "
                        "--nproc_per_node G -m rlcli train ... on each node; rollout servers "
                        "on other nodes are sampler.urls"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": P(
        "verl", "algo.loss", "the per-token loss: vanilla is algo.loss=ppo_clip, geo_mean is "
        "algo=gmpo, and gspo, cispo, sapo, clip_cov, kl_cov and gpg are the algos of those "
        "names", values={"vanilla": "algo.loss=ppo_clip", "geo_mean": "algo=gmpo",
                         **{m: f"algo={m}" for m in LOSS_ALGOS}}),
    "algorithm.norm_adv_by_std_in_grpo": P(
        "verl", "algo.advantage", "true is algo.advantage=grpo, (R - mean) / std in each group; "
        "false is algo.advantage=dr_grpo, R - mean", values={
            "true": "algo.advantage=grpo", "false": "algo.advantage=dr_grpo"}),
    "critic.optim.lr": P("verl", "algo.critic_lr", "PPO's critic's learning rate (null = "
                         "trainer.lr)", "algo.critic_lr={value}"),
    "actor_rollout_ref.model.lora_rank": P("verl", "model.lora.rank", "the adapters' rank (0 = "
                                           "no LoRA)", "model.lora.rank={value}"),
    "actor_rollout_ref.model.lora_alpha": P("verl", "model.lora.alpha", "the adapters' update is "
                                            "scaled by alpha / r", "model.lora.alpha={value}"),
    "actor_rollout_ref.model.target_modules": P("verl", "model.lora.target_modules",
                                                LORA_MODULES, "model.lora.target_modules={list}"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": P(
        "verl", "model.gradient_checkpointing", "recompute activations in the backward pass "
        "(auto, the default: when free memory is short)", "model.gradient_checkpointing={value}"),
    "actor_rollout_ref.actor.use_torch_compile": P(
        "verl", "trainer.compile", "torch.compile of the learner's decoder layers and head",
        "trainer.compile={value}"),
    "actor_rollout_ref.model.use_liger": P(
        "verl", None, "Liger's kernels are not used; trainer.compile=true fuses the same "
        "norms, SwiGLU and rotary with torch.compile"),
    "actor_rollout_ref.model.use_fused_kernels": P(
        "verl", None, "trainer.compile=true compiles the LM head's log-prob and entropy "
        "chunks (and the decoder layers) with torch.compile"),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": P(
        "verl", "trainer.dtype", "the learner's parameter dtype, float32, bfloat16 or float16 "
        "(trainer.bf16_autocast computes in bfloat16 over float32 weights)",
        "trainer.dtype={value}", {"fp32": "trainer.dtype=float32",
                                  "bf16": "trainer.dtype=bfloat16",
                                  "fp16": "trainer.dtype=float16"}),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": P(
        "verl", "trainer.lr_scheduler", "the schedule after the warm-up, by transformers' names: "
        "verl's constant is constant_with_warmup, cosine is cosine (with min_lr_ratio, "
        "cosine_with_min_lr)", values={"constant": "trainer.lr_scheduler=constant_with_warmup",
                                       "cosine": "trainer.lr_scheduler=cosine"}),
    "actor_rollout_ref.actor.optim.min_lr_ratio": P(
        "verl", "trainer.lr_scheduler_kwargs", "cosine's floor as a share of the learning rate",
        "trainer.lr_scheduler=cosine_with_min_lr trainer.lr_scheduler_kwargs.min_lr_rate={value}"),
    "actor_rollout_ref.rollout.name": P("verl", "the sampler group", "sampler=vllm (vLLM in the "
                                        "learner's process) or sampler=hf (transformers' "
                                        "generate); sglang has no equivalent", values={
                                            "vllm": "sampler=vllm", "hf": "sampler=hf"}),
    "actor_rollout_ref.rollout.val_kwargs.*": P(
        "verl", "eval", "held-out evaluation samples eval.k responses per problem at "
        "eval.temperature and eval.top_p for pass@k; its accuracy is always one greedy reply"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": P(
        "verl", "eval.temperature", "the temperature of evaluation's pass@k samples",
        "eval.temperature={value}"),
    "actor_rollout_ref.rollout.val_kwargs.top_p": P(
        "verl", "eval.top_p", "the top_p of evaluation's pass@k samples", "eval.top_p={value}"),
    "actor_rollout_ref.rollout.val_kwargs.n": P("verl", "eval.k", "evaluation's samples per "
                                                "problem, for pass@k", "eval.k={value}"),
    "actor_rollout_ref.rollout.multi_turn.*": P(
        "verl", "the env group", "multi-turn episodes with tools are env=calculator, env=python "
        "or env=search, with env.tools=[...] (your own as FILE.py:NAME), env.max_turns and "
        "env.tool_format=chat_template for the model's own call format"),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": P(
        "verl", "env.max_turns", "the model's turns per episode", "env.max_turns={value}"),
    "algorithm.kl_ctrl.*": P("verl", "algo.kl_target", "the KL coefficient is algo.beta; fixed is "
                             "algo.kl_target=null (the default), adaptive a target, "
                             "algo.kl_target=KL, with algo.kl_horizon"),
    "algorithm.kl_ctrl.type": P("verl", "algo.kl_target", "fixed is algo.kl_target=null (the "
                                "default), adaptive a target, algo.kl_target=KL",
                                values={"fixed": "algo.kl_target=null"}),
    "algorithm.filter_groups.*": P("verl", "algo.dynamic_sampling", "DAPO's dynamic sampling: "
                                   "algo.dynamic_sampling, algo.filter_metric and "
                                   "algo.max_gen_batches"),
    "algorithm.filter_groups.enable": P("verl", "algo.dynamic_sampling", "groups whose rewards "
                                        "are all equal are dropped and more prompts sampled",
                                        "algo.dynamic_sampling={value}"),
    "algorithm.filter_groups.metric": P(
        "verl", "algo.filter_metric", "what a group is judged by: acc is correctness, "
        "seq_reward and seq_final_reward are total (the reward trained on)", values={
            "acc": "algo.filter_metric=correctness", "seq_reward": "algo.filter_metric=total",
            "seq_final_reward": "algo.filter_metric=total"}),
    "algorithm.filter_groups.max_num_gen_batches": P(
        "verl", "algo.max_gen_batches", "the sampling rounds a step may use",
        "algo.max_gen_batches={value}"),
    "algorithm.rollout_correction.*": P(
        "verl", "sampler.old_logp", "the sampler/learner mismatch: sampler.old_logp=sampler "
        "weights each token by min(exp(learner - sampler), sampler.tis_cap), "
        "sampler.is_correction=mask drops a token above the cap instead"),
    "reward_model.*": P("verl", "the reward group", "a reward model is reward=reward_model "
                        "reward.model_path=PATH (reward=process for a process reward model)"),
    "reward_model.enable": P("verl", "the reward group", "reward=reward_model scores with a "
                             "reward model (reward.model_path)",
                             values={"true": "reward=reward_model"}),
    "reward_model.model.path": P("verl", "reward.model_path", "the reward model, with "
                                 "reward=reward_model",
                                 "reward=reward_model reward.model_path={value}"),
    "reward_model.overlong_buffer.*": P(
        "verl", "reward.overlong_cache_len", "DAPO's soft overlong punishment is "
        "reward.overlong_cache_len=L, the ramp's length in tokens, with any reward (reward=dapo "
        "sets it); algo.overlong_filter leaves truncated responses out of the loss instead"),
    "reward_model.overlong_buffer.enable": P(
        "verl", "reward.overlong_cache_len", "the soft overlong punishment is on when "
        "reward.overlong_cache_len > 0, the ramp's length in tokens",
        values={"true": None, "false": "reward.overlong_cache_len=0"}),
    "reward_model.overlong_buffer.len": P("verl", "reward.overlong_cache_len", "the punishment's "
                                          "ramp in tokens", "reward.overlong_cache_len={value}"),
}  # fmt: skip
