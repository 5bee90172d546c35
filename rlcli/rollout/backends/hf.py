"""`sampler=hf`: transformers' `generate` on the learner's own weights."""

from __future__ import annotations

from rlcli.rollout.contract import Backend, Sampler, SamplerSetup
from rlcli.runtime import distributed


class HFBackend(Backend):
    name = "hf"
    title = "the transformers sampler"

    def make(self, setup: SamplerSetup) -> Sampler:
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


BACKEND = HFBackend()
