"""`gloo`: a CPU backend for vLLM's weight-transfer API, so rollout workers on CPU take the
learner's weights the way CUDA workers take them over NCCL.

vLLM's RL API moves weights from a trainer to inference engines in four calls and leaves the
transport to a backend from a registry; the built-in ones (`nccl`, `ipc`, ...) need CUDA. This
module registers `gloo` on both sides of that registry: the worker side (`GlooWorkerEngine`,
inside each vLLM engine) and the learner side (`GlooLearnerEngine`). vLLM imports it in every
process it starts through the `vllm.general_plugins` entry point in pyproject.toml (`register`),
so a `vllm serve` in the same environment accepts `--weight-transfer-config '{"backend": "gloo"}'`.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import ClassVar

import torch
from vllm.distributed.utils import (
    stateless_destroy_torch_distributed_process_group,
    stateless_init_torch_distributed_process_group,
)
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

from rlcli.rollout.vllm_shared import expected_reload_notices, repack_tied_head, weightless_layers

BACKEND = "gloo"


def register() -> None:
    """Add `gloo` to vLLM's two weight-transfer registries (once per process); in the server
    of a worker rlcli started, also watch for the learner's end (`watch_learner`: vLLM runs
    its plugins in every process it starts, and this is rlcli's one plugin)."""
    from rlcli.rollout.workers.processes import watch_learner

    watch_learner()
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWorkerEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, GlooLearnerEngine)


def _group(address: str, port: int, rank: int, world_size: int, timeout_s: float):
    # vLLM's helper: a gloo group that leaves torch's default group (torchrun's) alone. Under
    # torchrun, torch's tcp:// rendezvous would join the launcher's store instead of hosting
    # this group's own, which the workers are waiting at.
    agent_store = os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        return stateless_init_torch_distributed_process_group(
            address, port, rank, world_size, backend="gloo", timeout=timedelta(seconds=timeout_s)
        )
    finally:
        if agent_store is not None:
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store


@dataclass
class GlooWorkerInit(WeightTransferInitInfo):
    """What a worker needs to join the learner's group."""

    master_address: str
    master_port: int
    rank: int  # this worker's rank in the group (the learner is 0)
    world_size: int  # the learner and every worker
    timeout_s: float = 600.0  # a peer silent this long fails the transfer instead of hanging


@dataclass
class GlooUpdate(WeightTransferUpdateInfo):
    """One of an update's two calls: receive the parameters that follow, in broadcast order,
    while the model goes on generating; or (`load`) load what was received."""

    names: list[str] = field(default_factory=list)
    dtype_names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    load: bool = False


class GlooWorkerEngine(WeightTransferEngine[GlooWorkerInit, GlooUpdate]):
    """Inside a vLLM engine: receive the broadcast tensors on a thread of their own, so that
    the engine goes on generating meanwhile, then load them when told to."""

    init_info_cls = GlooWorkerInit
    update_info_cls = GlooUpdate
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.weightless: set[str] = set()  # layers an update leaves empty (`weightless_layers`)
        self.arriving: Future | None = None  # the tensors being received, in broadcast order

    def init_transfer_engine(self, init_info: GlooWorkerInit) -> None:
        self.group = _group(
            init_info.master_address,
            init_info.master_port,
            init_info.rank,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        pass  # the reload starts when the received tensors are loaded: the model is whole till then

    def receive_weights(self, update_info: GlooUpdate) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer used before init_weight_transfer_engine")
        if not update_info.load:
            self.arriving = self.receive_in_background(update_info)
            return
        if self.arriving is None:
            raise RuntimeError("gloo weight update loaded before any was received")
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        weights, self.arriving = self.arriving.result(), None
        self.weightless = weightless_layers(self.model)  # before the reload sets tensors aside
        initialize_layerwise_reload(self.model)
        # One `load_weights` call for the whole update: each call walks every module of the
        # model first, which with one call per tensor was most of a push's time on CPU (see
        # docs/scaling.md, "Streaming, measured").
        self.model.load_weights(weights)

    def receive_in_background(self, update_info: GlooUpdate) -> Future:
        """The update's tensors, received from the learner's broadcasts on a daemon thread (one
        stuck on a dead learner must not hold the engine's exit), in a list once all came."""
        arriving: Future = Future()

        def receive() -> None:
            try:
                received = []
                for name, dtype_name, shape in zip(
                    update_info.names, update_info.dtype_names, update_info.shapes, strict=True
                ):
                    tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
                    self.group.broadcast(tensor, 0).wait()
                    received.append((name, tensor))
                arriving.set_result(received)
            except BaseException as err:  # raised in the engine by the load that waits for it
                arriving.set_exception(err)

        threading.Thread(target=receive, name="rlcli-gloo-receive", daemon=True).start()
        return arriving

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with expected_reload_notices(self.weightless):
            finalize_layerwise_reload(self.model, self.model_config)
        repack_tied_head(self.model)

    def shutdown(self) -> None:
        if self.group is not None:
            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


@dataclass
class GlooLearnerInit(TrainerInitInfo):
    """The learner's side of the rendezvous: it hosts the group's store at this address."""

    backend: ClassVar[str] = BACKEND
    master_address: str
    master_port: int
    world_size: int  # the learner and every worker
    timeout_s: float = 600.0  # a worker silent this long fails the transfer instead of hanging


class GlooLearnerEngine(TrainerWeightTransferEngine[GlooLearnerInit]):
    """In the learner: broadcast the source's tensors to every worker, one at a time.

    The learner is rank 0 of a process group of its own with the K workers at ranks 1..K, which
    vLLM's four calls drive (`init_weight_transfer_engine`, then per update
    `start_weight_update`, `update_weights`, `finish_weight_update`). An update has two halves,
    so that generation stops only for the second: the learner broadcasts the parameters, which
    each worker receives into a copy beside its model while it goes on generating
    (`send_weights`); then, generation paused if under way, each worker loads that copy with
    vLLM's layerwise reload (`load_weights`). A worker holds a second copy of the weights
    meanwhile, the learner never more than one extra tensor.

    `client` fans the control calls out to the workers; its `init_weight_transfer_engine`
    takes the group's rank of each worker itself (`WorkerClients.init_weight_transfer_engine`).
    Every learner rank under torchrun iterates the source (gathering a sharded parameter is
    a collective); only rank 0 sends.
    """

    init_info_cls = GlooLearnerInit

    @classmethod
    def trainer_init(cls, init_info: GlooLearnerInit, *, client, source=None):
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        engine.group = None
        if not engine.is_sender:
            return engine
        worker = {
            "master_address": init_info.master_address,
            "master_port": init_info.master_port,
            "world_size": init_info.world_size,
            "timeout_s": init_info.timeout_s,
        }
        # Workers block in their rendezvous until the learner joins it too.
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, worker)
            engine.group = _group(
                init_info.master_address,
                init_info.master_port,
                0,
                init_info.world_size,
                init_info.timeout_s,
            )
            joined.result()
        return engine

    def send_weights(self) -> None:
        """An update's first half: start it and broadcast every parameter, which the workers
        receive beside their models, generating meanwhile. `load_weights` is the second."""
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # join the gathers of sharded parameters
                pass
            return
        update = GlooUpdate(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        self.client.update_weights(asdict(update))  # returns once every worker is receiving
        for (name, tensor), m in zip(self.source, meta, strict=True):
            if name != m.name:
                raise RuntimeError(f"weight source yielded {name!r}, expected {m.name!r}")
            tensor = tensor.detach().to("cpu").contiguous()
            self.group.broadcast(tensor, 0).wait()

    def load_weights(self) -> None:
        """An update's second half: every worker loads what it received and finishes the
        update (the caller pauses generation for it, if any is under way)."""
        if self.is_sender:
            self.client.update_weights(asdict(GlooUpdate(load=True)))
            self.client.finish_weight_update()

    def shutdown(self) -> None:
        if self.group is not None:
            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None
