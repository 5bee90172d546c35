"""Rollout workers: vLLM servers in processes of their own, which sample over HTTP and take
the learner's weights through vLLM's weight-transfer API. `WorkerSampler` is the `Sampler`
they make, composed from the pieces by role: the processes (`rollout.workers.processes`), the
HTTP requests and the checks of their answers (`rollout.workers.client`), and the weight push
(`rollout.workers.weight_push`).

`sampler.workers=K` starts K local `vllm serve` processes (`LocalWorkers`); `sampler.urls`
names servers started elsewhere (`rlcli rollout-server` on another node). A step's prompts
are split over the workers, each asked through vLLM's token-in/token-out route
(`/inference/v1/generate`), so the learner's tokenizer and the engine see the same ids; a
multi-turn episode (env=...) asks there for each of its turns (`turns`).
After each optimiser step `sync` pushes the weights (`WeightPush`).

Every push labels the weights with a version (the pushes so far: 0 at setup) and vLLM tags
each sampled token with the label of the weights that sampled it, so every response comes
with the version of each of its tokens (`Rollout.token_versions`).

With `sampler.max_staleness=k` >= 1 the workers keep generating while the learner trains
(`collect.stream` asks for the next steps' batches ahead), and each push is made in flight:
every worker receives the new weights while it generates (with gloo, on CPU), then pauses
between two decode steps keeping its requests (vLLM's `/pause?mode=keep`), loads them,
recomputes the kept requests' cached keys and values with them
(`/reset_prefix_cache?reset_running_requests=true`) and resumes, so a response may span
several versions and each of its tokens was sampled, given all the tokens before it, by the
weights its version names.

A worker that dies, stops answering or answers nonsense is a `WorkerLost` naming it; the
training loop saves the last completed step before it reports it. Only errors of the path to
the workers become one (`_guard`): a bug of the learner's propagates as itself.
"""

from __future__ import annotations

import contextlib

import torch

from rlcli.config import SamplerConfig
from rlcli.env.episode import Turn
from rlcli.rollout.batch import Rollout, encode_prompts, rollout_from_tokens
from rlcli.rollout.contract import Sampler
from rlcli.rollout.vllm_shared import sampling_settings
from rlcli.rollout.workers.client import WorkerClient, WorkerLost, transport_error, vocab_size
from rlcli.rollout.workers.processes import LocalWorkers, log_dir
from rlcli.rollout.workers.weight_push import WeightPush
from rlcli.runtime import distributed


class WorkerSampler(Sampler):
    """Samples a group per prompt on K rollout workers; `sync(policy)` pushes the weights."""

    def __init__(
        self,
        model_path: str,
        tokenizer,
        eos_ids: set[int],
        cfg: SamplerConfig,
        dtype: str,
        device: torch.device,
        trust_remote_code: bool = False,  # model.init_kwargs': the model ships its own code
    ):
        self.tokenizer, self.eos_ids, self.cfg, self.device = tokenizer, eos_ids, cfg, device
        self.vocab = vocab_size(model_path, tokenizer, trust_remote_code)
        self.local = None
        urls = [url.rstrip("/") for url in cfg.urls]
        if distributed.is_main() and not urls:
            self.local = LocalWorkers(
                cfg.workers, model_path, dtype, cfg, log_dir(), trust_remote_code
            )
            urls = self.local.urls
        self.urls = distributed.from_main(urls)  # under torchrun every rank samples from them
        self.client = WorkerClient(self.urls, cfg.worker_timeout_s, self.local)
        self.in_flight = cfg.max_staleness > 0  # pushes made while the workers generate
        self.calls = 0
        self.version = -1  # the label of the weights pushed last: pushes so far, less one
        if self.local is not None:
            self.local.wait_ready(cfg.worker_timeout_s)
        elif distributed.is_main():
            self.client.check_workers()  # before the first push waits for workers that are none
        # Each tensor is pushed in the dtype the workers hold it in: `dtype` for those started
        # here; workers at URLs are asked (`rlcli rollout-server` computes as the learner
        # does), and one that does not say gets the policy's own dtype, which it casts.
        held = None
        if distributed.is_main():
            held = dtype if self.local is not None else self.client.held_dtype()
        held = distributed.from_main(held)
        self.weights = WeightPush(self.urls, cfg, getattr(torch, held) if held else None)

    # -- the Sampler contract ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def metrics(self) -> dict[str, float]:
        # The share of the time since the last call during which the workers had requests
        # (paused ones not counted), the mean over workers: generation's side of the overlap;
        # and the seconds they spent paused for pushes (with gloo only the load: `WeightPush`).
        busy = self.client.busy
        return {"rollout/generating_share": busy.share(), "rollout/paused_s": busy.paused_seconds()}

    def sync(self, policy: torch.nn.Module) -> None:
        """Push the learner's weights to every worker as the next version (in flight with
        sampler.max_staleness >= 1: the workers' requests pause for it and then go on)."""
        self._guard(self._push, policy, self.version + 1, lost_on=self.weights.transport_error)
        self.version += 1  # once every worker holds it

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
        """`group_size` responses per prompt. `seed` is not passed on: vLLM's per-request
        generators are not reliable on CPU, so worker samples are not reproducible run to run.
        Safe to call from another thread while this one pushes (`collect.stream`)."""
        rollout = self._guard(
            self._sample, prompts, group_size, prompt_ids, answers, temperature, top_p
        )
        self.calls += seed is None
        return rollout

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
        bodies = [
            {"token_ids": ids, "sampling_params": {**settings, "max_tokens": budget}}
            for ids, budget in zip(contexts, budgets, strict=True)
        ]
        turns = []
        for (worker, answer), budget in zip(self.client.generate(bodies), budgets, strict=True):
            [(tokens, cut, logps, versions)] = self.client.read(
                worker, answer, 1, self.vocab, budget
            )
            reason = answer["choices"][0].get("stop_reason")  # the stop string, if one ended it
            end = "length" if cut else "call" if reason in stop else "eos"
            turns.append(Turn(tokens, logps, end, versions))
        return turns

    # -- the work ---------------------------------------------------------------------------
    def _push(self, policy: torch.nn.Module, version: int) -> None:
        main = distributed.is_main()

        def pause() -> None:  # between two decode steps, the requests kept
            if self.in_flight and main:
                self.client.busy.pause()
                for url in self.urls:
                    self.client.post(url, "pause?mode=keep", None)

        # With gloo the workers go on generating while the tensors arrive: only the load pauses.
        self.weights.send(policy, version, pause)
        # Other ranks are done once their gathers are; they must not sample before rank 0
        # has finished the update (the workers' model is half-loaded until then).
        distributed.barrier()
        if main:
            # Cached keys/values came from the old weights; those of requests under way too,
            # which are recomputed with the new ones when they go on.
            reset = "reset_prefix_cache" + (
                "?reset_running_requests=true" if self.in_flight else ""
            )
            for url in self.urls:
                self.client.post(url, reset, None)
        if self.in_flight and main:
            for url in self.urls:
                self.client.post(url, "resume", None)
            self.client.busy.resume()

    def _sample(self, prompts, group_size, prompt_ids, answers, temperature, top_p=None):
        c = self.cfg
        encoded = encode_prompts(self.tokenizer, prompts, c)
        params = sampling_settings(c, group_size, self.eos_ids, temperature, top_p)
        bodies = [{"token_ids": ids, "sampling_params": params} for ids in encoded]
        prompt_tokens, responses, truncated, logps, versions = [], [], [], [], []
        for ids, (worker, answer) in zip(encoded, self.client.generate(bodies), strict=True):
            choices = self.client.read(worker, answer, group_size, self.vocab, c.max_new_tokens)
            for tokens, cut, token_logps, token_versions in choices:
                prompt_tokens.append(ids)
                responses.append(tokens)
                truncated.append(cut)
                logps.append(token_logps)
                versions.append(token_versions)
        return rollout_from_tokens(
            prompt_tokens,
            responses,
            texts=self.tokenizer.batch_decode(responses, skip_special_tokens=True),
            prompt_ids=[p for p in prompt_ids for _ in range(group_size)],
            pad_id=self.tokenizer.pad_token_id,
            device=self.device,
            answers=[a for a in answers for _ in range(group_size)],
            truncated=truncated,
            sampler_logp=logps,
            versions=None if None in versions else versions,
        )

    def _guard(self, call, *args, lost_on=transport_error):
        """`call(*args)`, with the path to a worker breaking reported as WorkerLost: only the
        errors `lost_on` says are the transport's (HTTP and sockets; in the weight push also
        torch.distributed's, `WeightPush.transport_error`). Any other error is the learner's
        own bug and propagates as itself, not as a worker to blame (exit 4)."""
        try:
            return call(*args)
        except Exception as err:
            if isinstance(err, WorkerLost) or not lost_on(err):
                raise
            if self.local is not None:
                # A killed worker breaks the transfer before its process is seen to end: give
                # it a moment to be reaped, so the message can name it.
                self.local.check_all(within=2.0)
            # One paragraph: the first line of what failed (a gloo error runs to many).
            what = next((line for line in str(err).splitlines() if line.strip()), "")
            what = f"{type(err).__name__}: {what.strip()[:300]}"
            raise WorkerLost(self.client.lost(None, f"failed ({what})")) from err
