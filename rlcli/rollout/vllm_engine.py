"""Sampling with a vLLM engine that lives in the learner's process, and weight pushes into it.

The engine is colocated: same process, same device. After each optimiser step the learner's
parameters are handed to the engine by reference (no copy through disk or sockets) with
`collective_rpc`, and its prefix cache is reset because cached keys/values came from the
old weights. On CUDA the engine sleeps (frees KV cache, offloads weights) while the learner
trains.

One engine is kept per process and reused by the next run that asks for the same model and
engine settings (Hydra multirun jobs, tests): its start-up costs tens of seconds, and a run
pushes its own initial weights into it before sampling anyway.

vLLM's log goes to train.log (`tracking.console`); the warnings it logs on every run, that
nobody can act on, are written there at INFO (`vllm_shared`).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch
from omegaconf import OmegaConf

from rlcli.config import CONF_DIR, SamplerConfig
from rlcli.env.episode import Turn
from rlcli.rollout.batch import Rollout, encode_prompts, rollout_from_tokens
from rlcli.rollout.contract import Sampler
from rlcli.rollout.vllm_shared import (
    checkpoint_casts_expected,
    expected_reload_notices,
    quiet_routine_notices,
    repack_tied_head,
    sampling_settings,
    weightless_layers,
)
from rlcli.runtime.lora import sampler_weights

_engine: tuple[tuple, object] | None = None  # (settings key, vllm.LLM) of the live engine


@contextlib.contextmanager
def random_state_kept(device: torch.device):
    """The process's random generators (Python's, NumPy's, torch's on the CPU and `device`) as
    they were before the block: the engine, started in this process, seeds them with its own."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        yield
    random.setstate(python)
    np.random.set_state(numpy)


def cuda_only_settings_changed(cfg: SamplerConfig) -> list[str]:
    """`key=value` of the CUDA-only engine settings that differ from conf/sampler_base.yaml (set
    on the command line or by a recipe): on CPU they change nothing, which the user is told."""
    base = OmegaConf.load(CONF_DIR / "sampler_base.yaml")
    keys = ("gpu_memory_utilization", "tensor_parallel_size")
    return [f"sampler.{k}={getattr(cfg, k)}" for k in keys if getattr(cfg, k) != base[k]]


def engine(
    model_path: str,
    dtype: str,
    cfg: SamplerConfig,
    device: torch.device,
    trust_remote_code: bool = False,
):
    """The process's vLLM engine for these settings (created, or reused when they match);
    `trust_remote_code`: model.init_kwargs', for a model that ships its own code."""
    global _engine
    on_cuda = device.type == "cuda"
    eager = cfg.enforce_eager if cfg.enforce_eager is not None else not on_cuda
    key = (model_path, dtype, cfg.max_model_len, eager, device.type, trust_remote_code)
    key += (
        (cfg.gpu_memory_utilization, cfg.tensor_parallel_size)
        if on_cuda
        else (cfg.cpu_kv_cache_gb,)
    )
    if _engine is not None and _engine[0] == key:
        return _engine[1]
    release_engine()
    # Set only when an engine starts, so importing rlcli (or sampler=hf) leaves vLLM alone.
    # The engine core runs in this process, so weights are handed over by reference.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM logs every start-up stage and, on CPU, a warning per generate call; rlcli's
    # progress bar says what a user needs. VLLM_LOGGING_LEVEL=INFO brings the logs back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    quiet_routine_notices()
    from vllm import LLM

    if on_cuda:
        memory = {
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "enable_sleep_mode": True,
        }
    else:
        if changed := cuda_only_settings_changed(cfg):
            print(
                f"rlcli: {' and '.join(changed)} ignored on CPU (CUDA only); the engine's KV "
                f"cache takes sampler.cpu_kv_cache_gb={cfg.cpu_kv_cache_gb} GiB."
            )
        memory = {"kv_cache_memory_bytes": int(cfg.cpu_kv_cache_gb * 2**30)}
    with random_state_kept(device), checkpoint_casts_expected():
        llm = LLM(
            model=model_path,
            dtype=dtype,
            max_model_len=cfg.max_model_len,
            enforce_eager=eager,
            enable_prefix_caching=True,  # the G samples of a prompt share its prefill
            # Log-probs after temperature (and the repetition penalty, min-p, top-k, top-p),
            # i.e. of the distribution actually sampled; the learner divides its logits by the
            # same temperature and applies none of the rest (sampler.top_k's comment).
            logprobs_mode="processed_logprobs",
            use_tqdm_on_load=False,  # rlcli's progress bar is the one on the console
            trust_remote_code=trust_remote_code,
            **memory,
        )
    _engine = (key, llm)
    return llm


def release_engine() -> None:
    """Shut the live engine down, if there is one; samplers still holding it stop working."""
    global _engine
    if _engine is not None:
        # Shut down now rather than whenever the old engine is garbage-collected: its
        # shutdown tears down vLLM's process-wide parallel state, which by then would
        # belong to the next engine.
        _engine[1].llm_engine.engine_core.shutdown()
        _engine = None
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _load_weights(worker, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the engine's worker: load checkpoint-format weights in place."""
    runner = worker.model_runner
    if not hasattr(runner, "reload_weights"):  # vLLM releases before in-place reload
        runner.model.load_weights(weights)
        return
    with expected_reload_notices(weightless_layers(runner.get_model())):
        runner.reload_weights(weights_iterator=weights)
    repack_tied_head(runner.get_model())


class VLLMSampler(Sampler):
    """Samples a group per prompt with vLLM; `sync(policy)` pushes the learner's weights."""

    def __init__(
        self,
        model_path: str,
        tokenizer,
        eos_ids: set[int],
        cfg: SamplerConfig,
        dtype: str,
        device: torch.device,
        seed: int,
        trust_remote_code: bool = False,
    ):
        self.llm = engine(model_path, dtype, cfg, device, trust_remote_code)
        self.tokenizer, self.eos_ids, self.cfg = tokenizer, eos_ids, cfg
        self.device, self.seed = device, seed
        self.calls = 0  # sampling calls so far; with the seed it fixes each call's randomness
        self.asleep = False

    def state_dict(self) -> dict:
        """What a checkpoint keeps so that a resumed run samples as an uninterrupted one."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sync(self, policy: torch.nn.Module) -> None:
        """Load the learner's current weights into the engine; drop caches built from old ones."""
        self._wake()
        # Streamed: each parameter is gathered (when sharded) as the engine loads it, and cast
        # to the engine's dtype (vLLM warns for every weight of another dtype).
        weights = sampler_weights(policy, self.llm.llm_engine.model_config.dtype)
        self.llm.collective_rpc(_load_weights, args=(weights,))
        self.llm.reset_prefix_cache()

    @torch.no_grad()
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
        """`group_size` responses per prompt. `temperature` (0 = greedy), `top_p` and `seed` replace
        the training stream's (sampler.temperature; trainer.seed and the call count) for one
        call, as evaluation does, leaving the training stream where it was."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        c = self.cfg
        encoded = encode_prompts(self.tokenizer, prompts, c)
        settings = sampling_settings(c, group_size, self.eos_ids, temperature, top_p)
        params = SamplingParams(**settings)
        with self.seeded(seed):
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=ids) for ids in encoded], params, use_tqdm=False
            )
        prompt_tokens, completions = [], []
        for ids, out in zip(encoded, outputs, strict=True):
            for completion in out.outputs:
                prompt_tokens.append(ids)
                completions.append(completion)
        return self._rollout(prompt_tokens, completions, group_size, prompt_ids, answers)

    @contextlib.contextmanager
    def seeded(self, seed: int | None = None):
        """A sampling call's randomness: the training stream's next (`seed` None) or `seed`'s.

        Requests carry no seed of their own (vLLM's per-request generators fail on CPU when a
        prefill is split across engine steps); the in-process engine draws from torch's global
        generator, seeded here per call and restored afterwards."""
        self._wake()
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed * 1_000_003 + self.calls if seed is None else seed)
            yield
        self.calls += seed is None
        if self.device.type == "cuda":
            self.llm.sleep(level=1)  # give the learner the GPU memory of KV cache and weights
            self.asleep = True

    def turns(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        stop: list[str],
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[Turn]:
        """One reply per token context, each held to its budget, stopping at EOS or a `stop`
        string (a multi-turn episode's next turn; inside `seeded`)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        settings = sampling_settings(self.cfg, 1, self.eos_ids, temperature, top_p)
        settings["stop"] = [*self.cfg.stop, *stop]
        params = [SamplingParams(**{**settings, "max_tokens": b}) for b in budgets]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in contexts], params, use_tqdm=False
        )
        turns = []
        for out in outputs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            end = "length" if c.finish_reason == "length" else "eos"
            end = "call" if c.stop_reason in stop else end
            logprobs = [step[t].logprob for step, t in zip(c.logprobs, ids, strict=True)]
            turns.append(Turn(ids, logprobs, end))
        return turns

    def _rollout(self, prompt_tokens, completions, group_size, prompt_ids, answers) -> Rollout:
        """Lay the engine's outputs out as a Rollout (left-padded prompts, right-padded replies)."""
        responses = [list(c.token_ids) for c in completions]
        return rollout_from_tokens(
            prompt_tokens,
            responses,
            texts=[c.text for c in completions],
            prompt_ids=[p for p in prompt_ids for _ in range(group_size)],
            pad_id=self.tokenizer.pad_token_id,
            device=self.device,
            answers=[a for a in answers for _ in range(group_size)],
            truncated=[c.finish_reason == "length" for c in completions],
            sampler_logp=[
                [step[token].logprob for step, token in zip(c.logprobs, r, strict=True)]
                for c, r in zip(completions, responses, strict=True)
            ],
        )
