"""Rollout workers: vLLM servers in processes of their own, which sample over HTTP and take
the learner's weights through vLLM's weight-transfer API.

`sampler.workers=K` starts K local `vllm serve` processes (`server_command`); `sampler.urls`
names servers started elsewhere (`rlcli rollout-server` on another node). A step's prompts
are split over the workers, each asked through vLLM's token-in/token-out route
(`/inference/v1/generate`), so the learner's tokenizer and the engine see the same ids; a
multi-turn episode (env=...) asks there for each of its turns (`turns`).
After each optimiser step `sync` pushes the weights: `GlooLearnerEngine` (or NCCL on CUDA)
broadcasts them and vLLM's RL routes (`/start_weight_update`, `/update_weights`,
`/finish_weight_update`) load them on every worker.

With `sampler.async_rollout=true` the step asks for the next batch (`prefetch`) before it
learns, so the workers generate while the learner trains; `sync` first waits for that
batch, then pushes. The batch a step learns from is then one update old (staleness 1),
never more, and the objective weighs it with the sampler's log-probs.

Every worker named in sampler.urls must answer like a vLLM server before the first push
(`not_a_worker`); HTTP calls retry transient failures (`worker_session`), and each generate
answer is checked before it is trained on (`read_answer`: ids inside the model's vocabulary,
one finite log-prob per token). A worker that dies, stops answering or answers nonsense is a
`WorkerLost` naming it; the training loop saves the last completed step before it reports it.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor

import requests
import torch

from rlcli.config import ConfigError, SamplerConfig
from rlcli.env.episode import Turn
from rlcli.rollout.batch import Rollout, encode_prompts, rollout_from_tokens
from rlcli.rollout.servers import (
    LocalWorkers,
    WorkerClients,
    WorkerLost,
    answer_snippet,
    free_port,
    log_dir,
    not_a_worker,
    transfer_backend,
    why_unreachable,
    worker_session,
)
from rlcli.rollout.vllm_engine import sampling_settings
from rlcli.runtime import distributed
from rlcli.runtime.lora import sampler_weight_shapes, sampler_weights


class ParameterSource:
    """The learner's parameters, one full tensor at a time (vLLM's `WeightSource`): a sharded
    parameter is gathered when it is reached, so no rank holds more than one extra. With
    `dtype` (the workers'), each is cast to it before it is sent."""

    def __init__(self, policy: torch.nn.Module, dtype: torch.dtype | None = None):
        self.policy, self.dtype = policy, dtype

    def metadata(self):
        from vllm.distributed.weight_transfer import ParamMeta

        # Those of the merged weights when the policy has LoRA adapters.
        return [ParamMeta(*meta) for meta in sampler_weight_shapes(self.policy, self.dtype)]

    def __iter__(self):
        return sampler_weights(self.policy, self.dtype)


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
        self.vocab = vocab_size(model_path, tokenizer)
        self.local = None
        urls = [url.rstrip("/") for url in cfg.urls]
        # The dtype the workers hold weights in: `dtype` for those started here; a worker at a
        # URL runs in trainer.dtype (`rlcli rollout-server`), the policy's own: sent as it is.
        self.dtype = None if urls else getattr(torch, dtype)
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
        self.session = worker_session()
        if self.local is not None:
            self.local.wait_ready(cfg.worker_timeout_s)
        elif distributed.is_main():
            for i, url in enumerate(self.urls):
                if problem := not_a_worker(self.session, url, min(cfg.worker_timeout_s, 60)):
                    raise WorkerLost(
                        f"rollout worker {i} ({url}) {problem}. Each URL in sampler.urls must "
                        "be a running `rlcli rollout-server` (started on that node with the "
                        "learner's model); check that it runs and that the host and port are "
                        "right."
                    )

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

    # -- multi-turn episodes (env=...; rollout.multiturn.EpisodeSampler drives the turns) ---
    @contextlib.contextmanager
    def seeded(self, seed: int | None = None):
        """One sampling call of several `turns`: counted as `sample` counts it, not seeded."""
        yield
        self.calls += seed is None

    def turns(self, contexts, budgets, stop, temperature=None, top_p=None) -> list[Turn]:
        """One reply per token context, each held to its budget, stopping at EOS or a `stop`
        string (an episode's next turn), through the route `sample` uses: context i goes to
        worker i mod K (a dead or misbehaving worker is a WorkerLost naming it)."""
        settings = sampling_settings(self.cfg, 1, self.eos_ids, temperature, top_p)
        settings["stop"] = [*self.cfg.stop, *stop]
        return self._guard(self._turns, contexts, budgets, stop, settings)

    def _turns(self, contexts, budgets, stop, settings) -> list[Turn]:
        k = len(self.urls)

        def ask(i: int, ids: list[int], budget: int) -> dict:
            body = {"token_ids": ids, "sampling_params": {**settings, "max_tokens": budget}}
            return self._post(self.urls[i % k], "inference/v1/generate", body, i % k)

        asked = enumerate(zip(contexts, budgets, strict=True))
        jobs = [self.requests.submit(ask, i, ids, budget) for i, (ids, budget) in asked]
        turns = []
        for i, (job, budget) in enumerate(zip(jobs, budgets, strict=True)):
            answer = job.result()
            try:
                [(tokens, cut, logps)] = read_answer(answer, 1, self.vocab, budget)
            except ValueError as err:
                why = f"answered a generate request with what cannot be trained on: {err}"
                raise WorkerLost(self._lost(i % k, why)) from None
            reason = answer["choices"][0].get("stop_reason")  # the stop string, if one ended it
            end = "length" if cut else "call" if reason in stop else "eos"
            turns.append(Turn(tokens, logps, end))
        return turns

    # -- the work ---------------------------------------------------------------------------
    def _push(self, policy: torch.nn.Module) -> None:
        if self.transfer is None:
            self.transfer = self._connect(policy)
        self.transfer.source = ParameterSource(policy, self.dtype)
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
            init, client=clients, source=ParameterSource(policy, self.dtype)
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
        for i, (ids, job) in enumerate(zip(encoded, jobs, strict=True)):
            try:
                choices = read_answer(job.result(), group_size, self.vocab, c.max_new_tokens)
            except ValueError as err:
                raise WorkerLost(
                    self._lost(
                        i % len(self.urls),
                        f"answered a generate request with what cannot be trained on: {err}",
                    )
                ) from None
            for tokens, cut, token_logps in choices:
                prompt_tokens.append(ids)
                responses.append(tokens)
                truncated.append(cut)
                logps.append(token_logps)
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
        """POST `body` to a worker's route (transient failures retried); its JSON answer."""
        i = self.urls.index(url) if worker is None else worker
        try:
            response = self.session.post(
                f"{url}/{route}", json=body, timeout=self.cfg.worker_timeout_s
            )
        except requests.RequestException as err:
            why = f"stopped answering: {why_unreachable(err)}"
            raise WorkerLost(self._lost(i, why)) from err
        if not response.ok:
            why = f"answered HTTP {response.status_code} to /{route} ({answer_snippet(response)})"
            raise WorkerLost(self._lost(i, why))
        try:
            return response.json() if response.content else {}
        except ValueError:
            why = f"answered /{route} with what is not JSON ({answer_snippet(response)})"
            raise WorkerLost(self._lost(i, why)) from None

    def _guard(self, call, *args):
        """`call(*args)`, with a dead worker process reported as WorkerLost."""
        try:
            return call(*args)
        except (WorkerLost, ConfigError):
            raise
        except Exception as err:
            if self.local is not None:
                # A killed worker breaks the transfer before its process is seen to end: give
                # it a moment to be reaped, so the message can name it.
                deadline = time.monotonic() + 2.0
                while True:
                    for i in range(len(self.urls)):
                        self.local.check(i)
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
            # One paragraph: the first line of what failed (a gloo error runs to many).
            what = next((line for line in str(err).splitlines() if line.strip()), "")
            what = f"{type(err).__name__}: {what.strip()[:300]}"
            raise WorkerLost(self._lost(None, f"failed ({what})")) from err

    def _lost(self, i: int | None, what: str) -> str:
        who = f"rollout worker {i} ({self.urls[i]})" if i is not None else "a rollout worker"
        log = f"; its log is {self.local.logs[i]}" if self.local and i is not None else ""
        if self.local is not None and i is not None:
            self.local.check(i)  # a process that ended says more than a refused connection
        return f"{who} {what}{log}."


def vocab_size(model_path: str, tokenizer) -> int:
    """Rows of the model's embedding (its config's vocab_size; at least the tokenizer's)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    size = getattr(config.get_text_config(), "vocab_size", None) or 0
    return max(size, len(tokenizer))


def read_answer(answer, n: int, vocab: int, max_tokens: int) -> list[tuple[list[int], bool, list]]:
    """The `n` responses of a worker's generate answer as (token ids, truncated, log-prob of
    each token), checked. Anything else is a ValueError saying what is wrong: an id past the
    vocabulary would crash the learner, and log-probs one short, too many or NaN would train
    on wrong numbers (the ratio and the KL are made from them token by token)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        raise ValueError(f"the answer has no list of choices ({_short(answer)})")
    if len(choices) != n:
        raise ValueError(f"a prompt that asked for {n} responses got {len(choices)}")
    responses = []
    for choice in choices:
        try:
            tokens, finish = choice["token_ids"], choice["finish_reason"]
            logps = [step["logprob"] for step in choice["logprobs"]["content"]]
        except (KeyError, TypeError):
            raise ValueError(
                f"a response lacks token_ids, finish_reason or logprobs.content ({_short(choice)})"
            ) from None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise ValueError(f"a response's token_ids are not a list of integers: {_short(tokens)}")
        if outside := [t for t in tokens if not 0 <= t < vocab]:
            raise ValueError(
                f"token id {outside[0]} is outside the model's vocabulary (ids 0 to {vocab - 1}); "
                "is the worker serving the learner's model?"
            )
        if len(tokens) > max_tokens:
            raise ValueError(
                f"a response of {len(tokens)} tokens is longer than sampler.max_new_tokens="
                f"{max_tokens}"
            )
        if len(logps) != len(tokens):
            raise ValueError(
                f"a response of {len(tokens)} tokens came with {len(logps)} log-probs; exactly "
                "one per token is needed"
            )
        for k, logp in enumerate(logps):
            if type(logp) not in (int, float) or not math.isfinite(logp):
                raise ValueError(
                    f"the log-prob of token {k} of a response is {logp!r}, not a finite number"
                )
        responses.append((tokens, finish == "length", [float(x) for x in logps]))
    return responses


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 100 else text[:100] + "..."
