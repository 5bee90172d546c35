"""Rollout workers: vLLM servers in processes of their own, which sample over HTTP and take
the learner's weights through vLLM's weight-transfer API.

`sampler.workers=K` starts K local `vllm serve` processes (`server_command`); `sampler.urls`
names servers started elsewhere (`rlcli rollout-server` on another node). A step's prompts
are split over the workers, each asked through vLLM's token-in/token-out route
(`/inference/v1/generate`), so the learner's tokenizer and the engine see the same ids.
After each optimiser step `sync` pushes the weights: `GlooLearnerEngine` (or NCCL on CUDA)
broadcasts them and vLLM's RL routes (`/start_weight_update`, `/update_weights`,
`/finish_weight_update`) load them on every worker.

With `sampler.async_rollout=true` the step asks for the next batch (`prefetch`) before it
learns, so the workers generate while the learner trains; `sync` first waits for that
batch, then pushes. The batch a step learns from is then one update old (staleness 1),
never more, and the objective weighs it with the sampler's log-probs.

A worker that dies or stops answering is a `WorkerLost` naming it; the training loop saves
the last completed step before it reports it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import requests
import torch

from rlcli.config import ConfigError, SamplerConfig
from rlcli.rollout.batch import Rollout, encode_prompts, rollout_from_tokens
from rlcli.rollout.servers import (
    LocalWorkers,
    WorkerClients,
    WorkerLost,
    free_port,
    log_dir,
    transfer_backend,
)
from rlcli.rollout.vllm_engine import sampling_settings
from rlcli.runtime import distributed
from rlcli.runtime.lora import sampler_weight_shapes, sampler_weights


class ParameterSource:
    """The learner's parameters, one full tensor at a time (vLLM's `WeightSource`): a sharded
    parameter is gathered when it is reached, so no rank holds more than one extra."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def metadata(self):
        from vllm.distributed.weight_transfer import ParamMeta

        # Those of the merged weights when the policy has LoRA adapters.
        return [ParamMeta(*meta) for meta in sampler_weight_shapes(self.policy)]

    def __iter__(self):
        return sampler_weights(self.policy)


class WorkerSampler:
    """Samples a group per prompt on K rollout workers; `sync(policy)` pushes the weights."""

    def __init__(
        self,
        model_path: str,
        tokenizer,
        eos_ids: set[int],
        cfg: SamplerConfig,
        dtype: str,
        device: torch.device,
    ):
        self.tokenizer, self.eos_ids, self.cfg, self.device = tokenizer, eos_ids, cfg, device
        self.local = None
        urls = list(cfg.urls)
        if distributed.is_main() and not urls:
            self.local = LocalWorkers(cfg.workers, model_path, dtype, cfg, log_dir())
            urls = self.local.urls
        self.urls = distributed.from_main(urls)  # under torchrun every rank samples from them
        self.calls = 0
        self.waited = 0.0
        self.staleness = 0  # updates between the weights that sampled the last batch and now
        self.version = 0  # weight updates pushed so far
        self.pending: tuple[tuple, Future] | None = None  # (request, batch) of a prefetch
        self.background = ThreadPoolExecutor(max_workers=1)
        self.requests = ThreadPoolExecutor(max_workers=max(4 * len(urls), 1))
        self.transfer = None
        if self.local is not None:
            self.local.wait_ready(cfg.worker_timeout_s)

    # -- the Sampler protocol ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def metrics(self) -> dict[str, float]:
        # time/rollout_wait: how long the step's weight push waited for the batch that the
        # workers were generating ahead (part of time/sync).
        return {"rollout/staleness": float(self.staleness), "time/rollout_wait": self.waited}

    def sync(self, policy: torch.nn.Module) -> None:
        """Push the learner's weights to every worker (after any batch still in flight)."""
        begin = time.perf_counter()
        if self.pending is not None:
            self.pending[1].exception()  # wait; its errors surface when it is taken
        self.waited = time.perf_counter() - begin
        self._guard(self._push, policy)
        self.version += 1

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
        """`group_size` responses per prompt: the prefetched batch if it was asked for these
        prompts, else sampled now. `seed` is not passed on: vLLM's per-request generators
        are not reliable on CPU, so worker samples are not reproducible run to run."""
        request = (tuple(prompt_ids), group_size, temperature, top_p)
        if self.pending is not None and self.pending[0] == request:
            future, self.pending = self.pending[1], None
            rollout, version = self._guard(future.result)
        else:
            rollout, version = self._guard(
                self._sample, prompts, group_size, prompt_ids, answers, temperature, top_p
            )
        self.calls += seed is None
        self.staleness = self.version - version
        return rollout

    def prefetch(self, prompts, group_size, prompt_ids, answers) -> None:
        """Start sampling the next step's batch now, with the weights the workers hold."""
        request = (tuple(prompt_ids), group_size, None, None)  # as `sample` keys it
        job = self.background.submit(self._sample, prompts, group_size, prompt_ids, answers, None)
        self.pending = (request, job)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()

    # -- the work ---------------------------------------------------------------------------
    def _push(self, policy: torch.nn.Module) -> None:
        if self.transfer is None:
            self.transfer = self._connect(policy)
        self.transfer.source = ParameterSource(policy)
        self.transfer.send_weights()
        # Other ranks are done once their gathers are; they must not sample before rank 0
        # has finished the update (the workers' model is half-loaded until then).
        distributed.barrier()
        if distributed.is_main():
            for url in self.urls:  # cached keys/values came from the old weights
                self._post(url, "reset_prefix_cache", None)

    def _connect(self, policy: torch.nn.Module):
        """vLLM's learner-side transfer engine, joined with every worker: gloo on CPU, NCCL
        between GPUs (each worker then holds sampler.tensor_parallel_size ranks)."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        per_worker = self.cfg.tensor_parallel_size if torch.cuda.is_available() else 1
        where = {
            "master_address": self.cfg.transfer_address,
            "master_port": free_port(),
            "world_size": 1 + len(self.urls) * per_worker,
            "rank": distributed.rank(),
        }
        if transfer_backend() == "gloo":
            from rlcli.rollout import gloo_transfer

            gloo_transfer.register()
            init = gloo_transfer.GlooLearnerInit(**where, timeout_s=self.cfg.worker_timeout_s)
        else:  # not run here: this machine has no GPU, the lent GPU machine no vLLM
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            init = NCCLTrainerInitInfo(**where)
        clients = WorkerClients(self.urls, self.cfg.worker_timeout_s, per_worker)
        return WeightTransferTrainerFactory.trainer_init(
            init, client=clients, source=ParameterSource(policy)
        )

    def _sample(self, prompts, group_size, prompt_ids, answers, temperature, top_p=None):
        c = self.cfg
        version = self.version
        encoded = encode_prompts(self.tokenizer, prompts, c)
        params = sampling_settings(c, group_size, self.eos_ids, temperature, top_p)
        # Prompt i goes to worker i mod K, so every worker gets a share of every step.
        jobs = [
            self.requests.submit(
                self._post,
                self.urls[i % len(self.urls)],
                "inference/v1/generate",
                {"token_ids": ids, "sampling_params": params},
                i % len(self.urls),
            )
            for i, ids in enumerate(encoded)
        ]
        prompt_tokens, responses, truncated, logps = [], [], [], []
        for ids, job in zip(encoded, jobs, strict=True):
            for choice in job.result()["choices"]:
                tokens = choice["token_ids"]
                prompt_tokens.append(ids)
                responses.append(tokens)
                truncated.append(choice["finish_reason"] == "length")
                logps.append([step["logprob"] for step in choice["logprobs"]["content"]])
        rollout = rollout_from_tokens(
            prompt_tokens,
            responses,
            texts=self.tokenizer.batch_decode(responses, skip_special_tokens=True),
            prompt_ids=[p for p in prompt_ids for _ in range(group_size)],
            pad_id=self.tokenizer.pad_token_id,
            device=self.device,
            answers=[a for a in answers for _ in range(group_size)],
            truncated=truncated,
            sampler_logp=logps,
        )
        return rollout, version

    def _post(self, url: str, route: str, body, worker: int | None = None) -> dict:
        try:
            response = requests.post(f"{url}/{route}", json=body, timeout=self.cfg.worker_timeout_s)
        except requests.RequestException as err:
            i = self.urls.index(url) if worker is None else worker
            raise WorkerLost(self._lost(i, f"stopped answering ({type(err).__name__})")) from err
        if not response.ok:
            raise RuntimeError(f"{url}/{route} answered {response.status_code}: {response.text}")
        return response.json() if response.content else {}

    def _guard(self, call, *args):
        """`call(*args)`, with a dead worker process reported as WorkerLost."""
        try:
            return call(*args)
        except (WorkerLost, ConfigError):
            raise
        except Exception as err:
            if self.local is not None:
                for i in range(len(self.urls)):
                    self.local.check(i)
            raise WorkerLost(self._lost(None, f"failed: {err}")) from err

    def _lost(self, i: int | None, what: str) -> str:
        who = f"rollout worker {i} ({self.urls[i]})" if i is not None else "a rollout worker"
        log = f"; its log is {self.local.logs[i]}" if self.local and i is not None else ""
        if self.local is not None and i is not None:
            self.local.check(i)  # a process that ended says more than a refused connection
        return f"{who} {what}{log}."
