"""What every sampler offers (`Sampler`), and the registry `sampler.name` picks from.

A sampler turns rendered prompts into a `Rollout` of `group_size` responses each, and is told
after every optimiser step to take the learner's new weights (`sync`). Its `state_dict` is
what a checkpoint keeps so that a resumed run samples exactly as an uninterrupted one.
A new sampler (a remote engine, say) is one class with these methods and one line in
`SAMPLERS`; its module is imported only when it is chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from rlcli.config import EnvConfig, SamplerConfig
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


def hf_sampler(setup: SamplerSetup) -> Sampler:
    from rlcli.rollout.hf import HFSampler

    s, learner = setup.cfg, setup.learner
    gather = (lambda: distributed.gathered(learner)) if learner is not None else None
    return HFSampler(
        setup.policy, setup.tokenizer, s.temperature, s.top_p, s.max_new_tokens, gather
    )


def vllm_sampler(setup: SamplerSetup) -> Sampler:
    eos_ids = eos_token_ids(setup.tokenizer, setup.policy)
    if setup.cfg.workers or setup.cfg.urls:  # vLLM servers in processes of their own
        from rlcli.rollout.workers import WorkerSampler

        sampler = WorkerSampler(
            setup.model_path, setup.tokenizer, eos_ids, setup.cfg, setup.dtype, setup.device
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
    )
    sampler.sync(setup.policy)  # a reused engine may hold another run's weights
    return sampler


SAMPLERS: dict[str, Callable[[SamplerSetup], Sampler]] = {"hf": hf_sampler, "vllm": vllm_sampler}


def make_sampler(setup: SamplerSetup) -> Sampler:
    """The sampler `sampler.name` names, holding the policy's current weights; with tools
    (`env`), one that runs multi-turn episodes on it."""
    sampler = SAMPLERS[setup.cfg.name](setup)
    if setup.env is None or setup.env.name == "none":
        return sampler
    from rlcli.rollout.multiturn import EpisodeSampler

    return EpisodeSampler(sampler, setup.tokenizer, setup.env, setup.cfg)
