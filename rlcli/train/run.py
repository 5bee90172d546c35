"""An RL run's state: `setup` builds it, `save` and `restore` carry it across a checkpoint.

`Run` holds everything a training run keeps between steps (data stream, models, sampler,
scorer, objective, optimisers, counters); `train.step.train_step` advances it by one step
and `train.loop.train` drives the steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from rlcli.collect.collector import Collector, Shaping
from rlcli.config import Config, TrainerConfig
from rlcli.data import load_splits
from rlcli.data.files import read_texts
from rlcli.data.problems import Problem, PromptRenderer, PromptStream, fit_prompts, prompt_renderer
from rlcli.env import response_budget
from rlcli.lifecycle.checkpoint import (
    apply_optimizer_settings,
    load_checkpoint,
    python_rng_state,
    restore_rng,
    rng_state,
    save_checkpoint,
    set_python_rng_state,
)
from rlcli.lifecycle.ranks import rank_state, world_changed
from rlcli.ops.objective import Objective
from rlcli.ops.pieces import Piece
from rlcli.rewards.components import component_names
from rlcli.rewards.scorer import Scorer
from rlcli.rollout.backends import make_sampler, objective_sampler
from rlcli.rollout.contract import Sampler, SamplerSetup
from rlcli.runtime import distributed, memory
from rlcli.runtime.init_kwargs import trusts_remote_code
from rlcli.runtime.lora import add_adapters, dropout_off, load_adapters
from rlcli.runtime.memory import activation_bytes, checkpointing_kwargs, free_bytes
from rlcli.runtime.models import (
    adamw,
    compile_layers,
    compiles,
    compute_dtype,
    load_causal_lm,
    load_tokenizer,
    pick_device,
    resolve_model_path,
)
from rlcli.runtime.precision import WorkingWeights
from rlcli.runtime.seed import seed_everything
from rlcli.train.critic import make_critic
from rlcli.train.forward import TokenLogprobModel
from rlcli.train.objective_config import objective_from_config
from rlcli.train.pieces_chosen import advantage_piece
from rlcli.train.schedule import lr_schedule
from rlcli.train.step_settings import RunSettings, StepSettings, run_settings, step_settings


@dataclass
class Run:
    """Everything a training run holds between steps; the settings it reads are picked from the
    config once (`settings`, `loop`), and the config itself stays with the loop."""

    model_path: str
    device: torch.device
    compute_dtype: str  # what the learner multiplies in (`compute_dtype`)
    # The learner's passes under bfloat16 autocast (else over weights already in their dtype)
    learner_autocast: bool
    tokenizer: object
    policy: torch.nn.Module  # the causal LM (sharded in place under torchrun)
    learner: torch.nn.Module  # TokenLogprobModel over the policy: what the learner calls
    reference: torch.nn.Module | None  # None when beta = 0
    critic: torch.nn.Module | None  # PPO only (algo.advantage=gae)
    critic_optimizer: torch.optim.Optimizer | None
    sampler: Sampler
    render: PromptRenderer  # a question as the prompt the sampler is given
    collector: Collector  # each step's sampled, scored and shaped batch
    scorer: Scorer
    objective: Objective
    settings: StepSettings  # what a step reads of the config, picked once
    loop: RunSettings  # what the loop, evaluation and saving read of it
    estimator: Piece  # algo.advantage's, resolved once
    advantage_settings: dict  # its settings given in algo.advantage_settings
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    prompts: PromptStream
    test_problems: list[Problem]  # held out: trainer.eval_every evaluates on them
    # The estimator's state across steps (`Piece.state`: DCPO's per-prompt statistics); None
    # for the estimators that keep none.
    estimator_state: object | None
    beta: float  # KL coefficient; moves when algo.kl_target is set (adaptive controller)
    ptx_texts: list[str]
    rng: random.Random  # DUPO's choice of groups to duplicate, ptx batches
    step: int = 0  # optimiser steps done (more than 0 when resumed from a checkpoint)


def _problems(cfg: Config) -> tuple[list, list]:
    """The training and held-out problems; a warning when evaluations are asked for and none
    are held out."""
    t = cfg.trainer
    train_set, test_set = load_splits(cfg.data)
    if t.eval_every and not test_set and distributed.is_main():
        # Said once here; the loop then skips every evaluation (no held-out problems).
        print(
            f"rlcli: trainer.eval_every={t.eval_every}, but data={cfg.data.name} has no held-out "
            "problems (data.num_test=0 and no data.test_path), so nothing is evaluated during "
            "training; hold some out with data.num_test=N or give data.test_path=FILE."
        )
    return train_set, test_set


def _learner(cfg: Config, policy, compute: str, compiled: bool):
    """(the model the learner's passes run, its bfloat16 working weights or None, whether the
    passes run under autocast). Where the learner computes in bfloat16, its passes run over
    bfloat16 weights with float32 masters (`runtime.precision`) rather than under autocast; a
    LoRA policy keeps autocast."""
    t = cfg.trainer
    lora = cfg.model.lora.rank > 0
    bf16_weights = compute == "bfloat16" and t.bf16_weights and t.dtype == "float32" and not lora
    working = None
    learner = TokenLogprobModel(policy, fused_head=compiled)
    if distributed.world_size() > 1:
        learner = distributed.shard(learner, policy, torch.bfloat16 if bf16_weights else None)
    elif bf16_weights:
        working = WorkingWeights(policy)
        learner = TokenLogprobModel(working.model, fused_head=compiled)
    return learner, working, compute == "bfloat16" and not bf16_weights


def _reference(cfg: Config, policy, model_path: str, compute: str, device):
    """The frozen reference model of the KL term, in the compute dtype (half the memory), or
    None for beta = 0 (no KL term: nothing loaded). With LoRA the reference is the policy
    itself with its adapters off (`lora.adapters_off`)."""
    if not cfg.algo.beta:
        return None
    if cfg.model.lora.rank > 0:
        return policy
    reference = load_causal_lm(
        model_path, compute, device, False, init_kwargs=cfg.model.init_kwargs
    )
    if cfg.trainer.attention != "auto":
        reference.set_attn_implementation(cfg.trainer.attention)
    return reference


def _collector(cfg: Config, sampler, scorer, render, prompts, needs, rng) -> Collector:
    t, algo, world = cfg.trainer, cfg.algo, distributed.world_size()
    return Collector(
        sampler=sampler,
        scorer=scorer,
        render=render,
        prompts=prompts,
        prompts_per_step=t.prompts_per_step // world,  # under torchrun, this rank's share
        group_size=t.group_size,
        shaping=Shaping(
            algo.dynamic_sampling,
            algo.max_gen_batches,
            algo.filter_metric,
            algo.dupo_fill,
            tuple(component_names(cfg.reward)),
        ),
        needs=needs,
        rng=rng,
        max_staleness=cfg.sampler.max_staleness,
        rank=distributed.rank(),
        world=world,
    )


def _critic(cfg: Config, estimator, model_path: str, device, checkpoint: Path | None):
    """(PPO's critic, its optimiser) for an estimator that needs one (gae), else (None, None):
    a new value head on the policy's model, or algo.critic_path's."""
    algo = cfg.algo
    if "critic" not in estimator.needs:
        return None, None
    path, new_head = algo.critic_path or model_path, algo.critic_path is None
    critic = make_critic(path, cfg.trainer.dtype, device, new_head, cfg.model.lora, checkpoint)
    return critic, adamw(trainable(critic), algo.critic_lr or cfg.trainer.lr)


def recompute_and_compile(cfg: Config, lm: torch.nn.Module, device, compiled: bool) -> None:
    """Gradient checkpointing as `checkpointing_mode` decides, and trainer.compile."""
    if (recompute := checkpointing_mode(cfg, lm, device, compiled)) != "none":
        lm.gradient_checkpointing_enable(checkpointing_kwargs(recompute))
        lm.train()  # transformers only checkpoints in training mode; Llama has no dropout
        dropout_off(lm)  # LoRA's has, for the learner's passes only
    if compiled:
        compile_layers(lm)


def setup(cfg: Config, checkpoint: Path | None = None) -> Run:
    """Everything a run needs; from `checkpoint`, the state of the run that saved it."""
    t, algo = cfg.trainer, cfg.algo
    # Under torchrun each rank samples its own responses, so each draws its own numbers.
    seed_everything(t.seed + distributed.rank())
    device = distributed.init(pick_device(t.device))
    # Data and reward first: a bad data file or reward function should fail before minutes
    # of model loading.
    train_set, test_set = _problems(cfg)
    ptx_texts = read_texts(algo.ptx_path) if algo.ptx_coef > 0 else []
    budget = response_budget(cfg.sampler, cfg.env)  # the tokens after a prompt
    scorer = Scorer(cfg.reward, budget, device, t.dtype)
    scorer.check_records(train_set, cfg.data.name)  # the record fields the rewards read
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path, init_kwargs=cfg.model.init_kwargs)
    render = prompt_renderer(cfg.data, cfg.env, tokenizer)  # the system message, tools: once
    train_set = fit_prompts(cfg.sampler, cfg.data.name, render, train_set, "training")
    test_set = fit_prompts(cfg.sampler, cfg.data.name, render, test_set, "held-out")
    policy = load_policy(cfg, model_path, device, checkpoint)
    if t.attention != "auto":
        policy.set_attn_implementation(t.attention)
    compute = compute_dtype(t, device)
    memory.return_freed_tensors(device, compute)  # else freed tensors stay resident
    compiled = compiles(t.compile, device)
    learner, working, learner_autocast = _learner(cfg, policy, compute, compiled)
    reference = _reference(cfg, policy, model_path, compute, device)
    estimator = advantage_piece(algo.advantage)
    critic, critic_optimizer = _critic(cfg, estimator, model_path, device, checkpoint)
    # Under torchrun the sampler reads the weights it pushes through the sharded learner.
    sharded = learner if distributed.world_size() > 1 else None
    sampler = make_sampler(
        SamplerSetup(cfg.sampler, model_path, tokenizer, policy, device, compute, t.seed,
                     sharded, cfg.env, trusts_remote_code(cfg.model.init_kwargs))
    )  # fmt: skip
    # Decided once the rest of the run is loaded, by the memory left for the activations.
    recompute_and_compile(cfg, learner.lm, device, compiled)
    optimizer = adamw(trainable(policy if working else learner), t.lr, t.weight_decay)
    if working is not None:
        working.follow(optimizer)
    scheduler = lr_schedule(optimizer, t)
    prompts, rng = PromptStream(train_set, t.seed), random.Random(t.seed)
    run = Run(
        model_path=model_path, device=device, compute_dtype=compute,
        learner_autocast=learner_autocast, tokenizer=tokenizer, policy=policy,
        learner=learner, reference=reference, critic=critic,
        critic_optimizer=critic_optimizer, sampler=sampler, scorer=scorer, render=render,
        collector=_collector(cfg, sampler, scorer, render, prompts, estimator.needs, rng),
        objective=objective_from_config(algo, objective_sampler(cfg.sampler, t),
                                        norm_len=algo.norm_len or budget),
        settings=step_settings(t, algo, cfg.sampler), loop=run_settings(cfg),
        estimator=estimator, advantage_settings=dict(algo.advantage_settings),
        optimizer=optimizer, scheduler=scheduler, prompts=prompts,
        test_problems=test_set, estimator_state=estimator.state() if estimator.state else None,
        beta=algo.beta, ptx_texts=ptx_texts, rng=rng,
    )  # fmt: skip
    if checkpoint is not None:
        restore(run, checkpoint, t, algo.beta)
    return run


def checkpointing_mode(
    cfg: Config, lm: torch.nn.Module, device: torch.device, compiled: bool = False
) -> str:
    """What the learner recomputes in the backward, "none", "selective" or "full"
    (`runtime.memory`): `model.gradient_checkpointing` true, false or selective as set; auto:
    the least recompute whose activations for the largest pass (`activation_bytes` of
    trainer.max_tokens_per_micro_batch tokens, fewer where the layers are `compiled`) fit in
    half the memory free now, less the gradients and AdamW state to come (12 bytes per trained
    parameter). Under torchrun the rank with the least memory decides."""
    mode = cfg.model.gradient_checkpointing  # auto, true, false or selective (`validate`)
    if mode != "auto":
        return {"true": "full", "false": "none"}.get(mode, mode)
    t, s = cfg.trainer, cfg.sampler
    tokens = t.max_tokens_per_micro_batch or t.micro_batch_size * (
        s.max_prompt_tokens + s.max_new_tokens
    )
    optimiser_state = 12 * sum(p.numel() for p in lm.parameters() if p.requires_grad)
    free = -distributed.all_max(-(free_bytes(device) - optimiser_state))
    if 2 * activation_bytes(lm.config, tokens, compiled=compiled) <= free:
        return "none"
    selective = activation_bytes(lm.config, tokens, selective=True, compiled=compiled)
    return "selective" if 2 * selective <= free else "full"


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimiser updates: all of them, or a LoRA model's adapters."""
    return [p for p in model.parameters() if p.requires_grad]


def load_policy(cfg: Config, model_path: str, device, checkpoint: Path | None):
    """The policy to train: the model, from `checkpoint` when resuming. With LoRA it is the base
    model with fresh adapters, or with the checkpoint's (which holds the adapters only)."""
    t, lora, init_kwargs = cfg.trainer, cfg.model.lora, cfg.model.init_kwargs
    if not lora.rank:
        key = "trainer.resume" if checkpoint else "model.path"  # named when it fails to load
        return load_causal_lm(
            str(checkpoint or model_path), t.dtype, device, key=key, init_kwargs=init_kwargs
        )
    policy = load_causal_lm(model_path, t.dtype, device, init_kwargs=init_kwargs)
    if checkpoint is None:
        add_adapters(policy, lora)
    else:
        load_adapters(policy, checkpoint)
    return policy


def run_state(run: Run) -> tuple[dict, dict]:
    """(JSON state, tensor state dicts) that `restore` needs to continue the run exactly."""
    # Rounds the workers sample ahead (sampler.max_staleness) are not saved: the checkpoint's
    # position is before them, so a resumed run samples their problems again.
    position, ahead = run.collector.resume_position()
    # What each rank draws its own numbers from: under torchrun each samples its own responses.
    ranks = distributed.all_ranks(
        {
            "rng": rng_state(),
            "run_rng": python_rng_state(run.rng),
            "sampler": run.sampler.state_dict(),
        }
    )
    state = {
        "data_position": position,
        "rounds_ahead_discarded": ahead,
        "beta": run.beta,
        "estimator_state": _state_dict(run.estimator_state),
        **ranks[0],  # rank 0's also where checkpoints before per-rank states kept them
        "ranks": ranks,
        "world_size": distributed.world_size(),
        "config": run.loop.record,  # what a resume compares its command with
    }
    # The optimiser's state whole and by parameter name, so that any number of ranks resumes.
    tensors = {
        "optimizer": distributed.full_optimizer_state(_optimizer_holder(run), run.optimizer),
        "scheduler": run.scheduler.state_dict(),
    }
    if run.critic_optimizer is not None:
        tensors["critic_optimizer"] = run.critic_optimizer.state_dict()
    return state, tensors


def _optimizer_holder(run: Run) -> torch.nn.Module:
    """The module whose parameters the optimiser holds, by their names: the sharded learner
    under torchrun, else the policy (the float32 masters where the passes run over a copy)."""
    return run.learner if distributed.world_size() > 1 else run.policy


def _state_dict(state: object | None) -> dict | None:
    return None if state is None else state.state_dict()


def restore(run: Run, checkpoint: Path, t: TrainerConfig, beta: float) -> None:
    """Put the saved optimiser, scheduler, counters and RNG states back into a fresh `run`
    made for this command, whose trainer section is `t` and KL coefficient `beta`."""
    state, tensors = load_checkpoint(checkpoint)
    distributed.load_optimizer_state(_optimizer_holder(run), run.optimizer, tensors["optimizer"])
    run.scheduler.load_state_dict(tensors["scheduler"])
    apply_optimizer_settings(run.optimizer, t, run.scheduler)
    if run.critic_optimizer is not None:
        run.critic_optimizer.load_state_dict(tensors["critic_optimizer"])
    run.step, run.beta = state["step"], state["beta"]
    # β set anew on the command line replaces the saved one (which the KL controller may have
    # moved); `run_dir.check_resume` has said so.
    if state.get("config", {}).get("algo", {}).get("beta", beta) != beta:
        run.beta = beta
    run.prompts.position = state["data_position"]
    if (ahead := state.get("rounds_ahead_discarded", 0)) and distributed.is_main():
        print(
            f"rlcli: the {ahead} round(s) of groups the workers were sampling ahead when step "
            f"{run.step} was saved are not in the checkpoint (sampler.max_staleness): their "
            "problems are sampled again, with the saved weights."
        )
    if run.estimator_state is not None:
        # "sas": where checkpoints written before the estimators' state slot kept DCPO's.
        saved = state.get("estimator_state", state.get("sas"))
        if saved:
            run.estimator_state.load_state_dict(saved)
    world, rank = distributed.world_size(), distributed.rank()
    if (saved_world := state.get("world_size", 1)) != world and distributed.is_main():
        print(world_changed(checkpoint, saved_world, world, t.prompts_per_step))
    if (mine := rank_state(state, rank, world)) is None:  # a rank the writer did not have
        seed_everything(t.seed + rank + 100_003 * run.step)
        return
    set_python_rng_state(run.rng, mine["run_rng"])
    run.sampler.load_state_dict(mine["sampler"])
    restore_rng(mine["rng"])  # last: loading models above may have drawn numbers


def save(run: Run, run_dir: Path) -> Path:
    """Write a checkpoint of the run; under torchrun every rank gathers, rank 0 writes."""
    state, tensors = run_state(run)
    extra = {"critic": run.critic} if run.critic is not None else None
    weights, target = None, run_dir / "checkpoints" / f"step_{run.step}"
    if distributed.world_size() > 1:
        weights = distributed.full_weights(run.learner)
    if distributed.is_main():
        target = save_checkpoint(
            run_dir,
            run.step,
            run.policy,
            run.tokenizer,
            tensors,
            state,
            run.loop.keep_last,
            extra,
            weights,
        )
    distributed.barrier()
    return target
