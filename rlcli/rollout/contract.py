"""What a sampler is (`Sampler`), what it is given to start (`SamplerSetup`), and what its
backend declares before anything loads (`Backend`).

The loop, the collectors and the multi-turn episode use only what `Sampler` declares; the
config checks and `sampler.old_logp` ask a `Backend` what it can do. Neither ever asks for a
backend by name, so a new backend is its module in `rollout/backends/` and its YAML in
`conf/sampler/` (docs/ARCHITECTURE.md, "Add a sampler backend").
"""

from __future__ import annotations

import contextlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from rlcli.config import EnvConfig, ModelConfig, SamplerConfig
from rlcli.env.episode import Turn
from rlcli.rollout.batch import Rollout


class Sampler(ABC):
    """Turns rendered prompts into a `Rollout` of `group_size` responses each, and takes the
    learner's new weights after every optimiser step (`sync`)."""

    device: torch.device  # where the rollouts' tensors are put
    # The label of the weights held (the pushes so far, less one); only rollout workers tag
    # tokens with it, for `sampler.max_staleness`.
    version: int = -1

    @abstractmethod
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

    @abstractmethod
    def sync(self, policy: torch.nn.Module) -> None:
        """Sample from `policy`'s current weights from now on."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps so that a resumed run samples as an uninterrupted one."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back what `state_dict` returned."""
        return  # nothing kept, nothing to take back

    def metrics(self) -> dict[str, float]:
        """What the sampler reports about the batch it returned last (none for most)."""
        return {}

    def close(self) -> None:
        """Stop what the sampler started (rollout-worker processes)."""
        return  # most start nothing

    # -- what a multi-turn episode (env=...) runs on ------------------------------------------
    def turns(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        stop: list[str],
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[Turn]:
        """One generation per context (token ids), each within its budget of new tokens and
        ended at the first of `stop`'s strings, kept."""
        raise NotImplementedError(f"{type(self).__name__} cannot run multi-turn episodes")

    def seeded(self, seed: int | None = None) -> contextlib.AbstractContextManager:
        """A context in which `turns` draws from `seed` (None: the training stream)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run multi-turn episodes")


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


class Backend(ABC):
    """A sampler backend as the config checks see it: what it can do, what it needs
    installed, its own checks, and how it makes its sampler (importing its heavy modules only
    then, so that checking a config loads nothing)."""

    name: str  # sampler.name, and conf/sampler/<name>.yaml
    title: str  # how messages name it ("the transformers sampler")
    # Returns the behaviour policy's log-probs with each response (sampler.old_logp=sampler).
    own_logprobs: bool = False
    # Ends a response at sampler.stop's strings.
    stop_strings: bool = False
    # Runs as rollout-worker processes (sampler.workers, sampler.urls).
    workers: bool = False
    # Has a context window, sampler.max_model_len, that prompt and response must fit in.
    bounded_context: bool = False
    # The module it imports, and how to install it when it is missing.
    package: str | None = None
    install: str = ""

    def installed(self) -> bool:
        """Whether the package it needs, if any, can be imported here."""
        return self.package is None or importlib.util.find_spec(self.package) is not None

    def check(self, sampler: SamplerConfig, model: ModelConfig) -> None:
        """A ConfigError for settings this backend cannot run (none beyond the capabilities by
        default)."""
        return

    @abstractmethod
    def make(self, setup: SamplerSetup) -> Sampler:
        """The sampler, holding the policy's current weights."""
