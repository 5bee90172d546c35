"""The sampler backends, one module each, found by `sampler.name`; and what a run asks of the
chosen one: its sampler (`make_sampler`), the sampler section's checks (`check_sampler`), and
whose log-probs are the behaviour policy's (`resolved_old_logp`).

`rollout/backends/<name>.py` defines `BACKEND`, a `rollout.contract.Backend`, and
`conf/sampler/<name>.yaml` its defaults. The checks below ask a backend what it can do,
never its name.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from dataclasses import replace

from rlcli.config import ConfigError, ModelConfig, SamplerConfig, TrainerConfig
from rlcli.ops.policy_loss import IS_CORRECTIONS
from rlcli.rollout.contract import Backend, Sampler, SamplerSetup


def backend_names() -> list[str]:
    """Every backend `sampler.name` may choose: the modules of this folder."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def backend(name: str) -> Backend:
    """The backend `sampler.name` names (validate.py has refused any other name)."""
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def make_sampler(setup: SamplerSetup) -> Sampler:
    """The sampler `sampler.name` names, holding the policy's current weights; with tools
    (`env`), one that runs multi-turn episodes on it."""
    if setup.cfg.max_staleness:
        # It samples on a thread of its own while the learner's uses the run's tokenizer: a
        # copy of its own, so that neither sees the other change a Rust tokenizer's padding or
        # truncation mid-call ("Already borrowed").
        setup = replace(setup, tokenizer=copy.deepcopy(setup.tokenizer))
    chosen = backend(setup.cfg.name)
    sampler = chosen.make(setup)
    if setup.env is None or setup.env.name == "none":
        return sampler
    from rlcli.rollout.multiturn import EpisodeSampler

    return EpisodeSampler(sampler, setup.tokenizer, setup.env, setup.cfg, chosen.own_logprobs)


def check_sampler(sampler: SamplerConfig, model: ModelConfig) -> None:
    """A ConfigError for sampling settings the chosen backend cannot run, before anything
    loads: values out of their range, then what the backend cannot do."""
    _check_ranges(sampler)
    chosen = backend(sampler.name)
    _check_capabilities(sampler, chosen)
    chosen.check(sampler, model)


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
    if sampler.workers < 0:
        raise ConfigError(
            f"sampler.workers={sampler.workers} is not allowed: it is the number of rollout "
            "workers, a whole number >= 0 (0 = the engine runs in the learner's process)."
        )


def _those_that(capable: str) -> str:
    """ "sampler=a or sampler=b": the backends that have a capability, for messages."""
    names = [n for n in backend_names() if getattr(backend(n), capable)]
    return " or ".join(f"sampler={n}" for n in names) or "a backend that has none yet"


def _check_capabilities(sampler: SamplerConfig, chosen: Backend) -> None:
    if sampler.stop and not chosen.stop_strings:
        raise ConfigError(
            f"sampler.stop={list(sampler.stop)} needs {_those_that('stop_strings')}: "
            f"{chosen.title} stops only at the end-of-sequence token."
        )
    if sampler.old_logp == "sampler" and not chosen.own_logprobs:
        raise ConfigError(
            f"sampler.old_logp=sampler needs {_those_that('own_logprobs')}: {chosen.title} "
            "returns no log-probs of its own. Use sampler.old_logp=learner."
        )
    prompt, response = sampler.max_prompt_tokens, sampler.max_new_tokens
    context = sampler.max_model_len
    if prompt < 1 or (chosen.bounded_context and prompt + response > context):
        raise ConfigError(
            f"sampler.max_prompt_tokens={prompt} must be >= 1, and with "
            f"sampler.max_new_tokens={response} fit in sampler.max_model_len="
            f"{context} (the engine's context: prompt + response)."
        )
    remote = sampler.workers > 0 or bool(sampler.urls)
    if remote and not chosen.workers:
        raise ConfigError(
            f"sampler.workers={sampler.workers} / sampler.urls={list(sampler.urls)}: rollout "
            f"workers are servers of {_those_that('workers')}; {chosen.title} has none (0 = "
            "the engine runs in the learner's process)."
        )
    if sampler.max_staleness < 0 or (sampler.max_staleness and not remote):
        raise ConfigError(
            f"sampler.max_staleness={sampler.max_staleness} is not allowed: it is 0 (each batch "
            "sampled after the previous update) or, with rollout workers (sampler.workers=K or "
            "sampler.urls=[...]), k >= 1 updates the workers may run ahead of the learner; an "
            "engine in the learner's process cannot sample while it learns."
        )
    if not chosen.installed():
        raise ConfigError(
            f"sampler={chosen.name} needs {chosen.title}, which is not installed. Install the "
            f"extra for your machine: {chosen.install}; or sample with another backend: "
            f"{', '.join(f'sampler={n}' for n in backend_names() if n != chosen.name)}."
        )


def resolved_old_logp(sampler: SamplerConfig, trainer: TrainerConfig) -> str:
    """Whose log-probs are the behaviour policy's, "sampler" or "learner", for a run
    sampling as `sampler` says and learning as `trainer` does.

    With `sampler.max_staleness` >= 1 the batch may be several updates old, so the sampler,
    not the learner, is its behaviour policy. `sampler.old_logp=auto` is the sampler's
    log-probs when a backend with log-probs of its own samples in bfloat16, where its kernels
    and the learner's disagree by ~0.03 per token (docs/tracking.md); else the learner's (in
    float32 the two agree to ~1e-6). Resolved here, where it is read, so that the config keeps
    `auto`.
    """
    if sampler.max_staleness:
        return "sampler"
    if sampler.old_logp != "auto":
        return sampler.old_logp
    from rlcli.runtime.models import compute_dtype, pick_device

    bf16 = compute_dtype(trainer, pick_device(trainer.device)) == "bfloat16"
    return "sampler" if backend(sampler.name).own_logprobs and bf16 else "learner"


def objective_sampler(sampler: SamplerConfig, trainer: TrainerConfig) -> SamplerConfig:
    """`sampler` with `old_logp` resolved, for `objective_from_config`: a copy."""
    return replace(sampler, old_logp=resolved_old_logp(sampler, trainer))
