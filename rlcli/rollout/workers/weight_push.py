"""The weight push: the learner's parameters to every rollout worker, through vLLM's
weight-transfer API.

The learner is rank 0 of a transfer group of its own with the workers (`WeightPush.connect`,
on the first push): gloo on CPU (`rollout.workers.gloo_transfer`), NCCL between GPUs. Each push
(`WeightPush.send`) broadcasts the parameters one full tensor at a time (`ParameterSource`),
while vLLM's RL routes load them on every worker at once (`WorkerClients`). A broken path to a
worker is a lost worker; a failure of the learner's own making of the weights propagates as
itself (`WeightPush.transport_error` tells them apart).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from rlcli.config import SamplerConfig
from rlcli.rollout.workers.client import transport_error
from rlcli.rollout.workers.processes import free_port, transfer_backend
from rlcli.runtime import distributed
from rlcli.runtime.lora import sampler_weight_shapes, sampler_weights


class ParameterSource:
    """The learner's parameters, one full tensor at a time (vLLM's `WeightSource`): a sharded
    parameter is gathered when it is reached, so no rank holds more than one extra. With
    `dtype` (the workers'), each is cast to it before it is sent.

    An error while making them (a gather, the LoRA merge, a cast) is the learner's own: it is
    kept in `failure` (and raised as it is), so that the push does not report it as a lost
    worker."""

    def __init__(self, policy: torch.nn.Module, dtype: torch.dtype | None = None):
        self.policy, self.dtype = policy, dtype
        self.failure: Exception | None = None

    def metadata(self):
        from vllm.distributed.weight_transfer import ParamMeta

        try:
            # Those of the merged weights when the policy has LoRA adapters.
            shapes = sampler_weight_shapes(self.policy, self.dtype)
            return [ParamMeta(*meta) for meta in shapes]
        except Exception as err:
            self.failure = err
            raise

    def __iter__(self):
        try:
            yield from sampler_weights(self.policy, self.dtype)
        except Exception as err:
            self.failure = err
            raise


class WorkerClients:
    """vLLM's weight-sync control calls, made on every worker at once (`VLLMWeightSyncClient`,
    over vLLM's RL routes `/start_weight_update`, `/update_weights`, `/finish_weight_update`).

    The learner is rank 0 of the transfer group and worker i's ranks follow: with gloo (one
    rank each) it is told its `rank`; with NCCL its `rank_offset`, after the `ranks_per_worker`
    of the workers before it. These calls are not retried (`worker_session`): each joins or
    feeds the transfer group's collectives, which a second try would join twice."""

    def __init__(self, urls: list[str], timeout: float, ranks_per_worker: int = 1):
        from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient

        self.clients = [HTTPVLLMWeightSyncClient(url, timeout) for url in urls]
        self.pool = ThreadPoolExecutor(max_workers=len(urls))
        self.ranks_per_worker = ranks_per_worker
        # The version the push under way labels the weights with: vLLM tags each token it
        # samples with the label of the weights that sampled it (its `weight_versions`).
        self.label: str | None = None

    def _all(self, call) -> None:
        for f in [self.pool.submit(call, i, c) for i, c in enumerate(self.clients)]:
            f.result()

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        key = "rank_offset" if "rank_offset" in init_info else "rank"
        self._all(
            lambda i, c: c.init_weight_transfer_engine(
                {**init_info, key: 1 + i * self.ranks_per_worker}
            )
        )

    def start_weight_update(self) -> None:
        self._all(lambda i, c: c.start_weight_update())

    def update_weights(self, update_info) -> None:
        self._all(lambda i, c: c.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        label = weight_version if weight_version is not None else self.label
        self._all(lambda i, c: c.finish_weight_update(label))


class WeightPush:
    """The learner's side of the transfer to the workers at `urls`, which hold weights in
    `dtype` (None: the policy's own, sent as it is)."""

    def __init__(self, urls: list[str], cfg: SamplerConfig, dtype: torch.dtype | None):
        self.urls, self.cfg, self.dtype = urls, cfg, dtype
        self.engine = None  # vLLM's learner-side transfer engine, once joined
        self.clients: WorkerClients | None = None  # its control calls
        self.source: ParameterSource | None = None  # that of the latest push

    def send(self, policy: torch.nn.Module, version: int, pause=lambda: None) -> None:
        """Push the policy's weights to every worker, labelled `version`, joining them first
        if not yet joined. `pause` is called once, before any worker's model changes: after the
        tensors have arrived with an engine whose update has a second half (gloo's
        `GlooLearnerEngine.load_weights`), before they are sent with one that loads as they
        arrive (NCCL). So with gloo the workers receive the tensors beside their models while
        they go on generating, and only the load waits for generation to pause; NCCL's workers
        load each tensor as it arrives, so the whole push waits."""
        self.source = ParameterSource(policy, self.dtype)
        if self.engine is None:
            self.engine = self.connect(self.source)
        self.engine.source = self.source
        if self.clients is not None:
            self.clients.label = str(version)
        load = getattr(self.engine, "load_weights", None)
        if load is not None:
            self.engine.send_weights()
            pause()
            load()
        else:
            pause()
            self.engine.send_weights()

    def connect(self, source: ParameterSource):
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
            from rlcli.rollout.workers import gloo_transfer

            gloo_transfer.register()
            init = gloo_transfer.GlooLearnerInit(**where, timeout_s=self.cfg.worker_timeout_s)
        else:
            # CUDA: vLLM's own NCCL backend. No test reaches it: the suite's workers run on CPU,
            # through gloo, and the GPU check (scripts/gpu_check.py) runs without vLLM.
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            init = NCCLTrainerInitInfo(**where)
        self.clients = WorkerClients(self.urls, self.cfg.worker_timeout_s, per_worker)
        return WeightTransferTrainerFactory.trainer_init(init, client=self.clients, source=source)

    def transport_error(self, err: BaseException) -> bool:
        """Whether `err`, raised by a push, is the path to a worker breaking: an HTTP or socket
        error (`workers.client.transport_error`: vLLM's control calls raise requests' errors),
        or a RuntimeError, which is how torch's gloo reports a peer that died mid-broadcast
        ("Connection closed by peer") and how a rendezvous no worker joins ends (DistStoreError,
        as NCCL's DistBackendError a RuntimeError too). Not what the learner raised making the
        weights (`ParameterSource.failure`): a RuntimeError there is a bug of the learner's."""
        if self.source is not None and err is self.source.failure:
            return False
        return transport_error(err) or isinstance(err, RuntimeError)
