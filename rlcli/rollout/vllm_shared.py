"""What the engine in the learner's process (`vllm_engine`) and the rollout workers (`workers/`)
share of vLLM: a call's sampling settings (`sampling_settings`), the re-pack of a tied LM head
after a weight load (`repack_tied_head`), and which of vLLM's warnings are routine.

Routine warnings are logged on every run about nothing a user or rlcli can change; they are
written at INFO instead, so that a WARNING in train.log (`tracking.console`) is one worth
reading; nothing is dropped. `ROUTINE_NOTICES` are lowered for the rest of the process; two
others only while what raises them runs (`checkpoint_casts_expected`,
`expected_reload_notices`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch

from rlcli.config import SamplerConfig

# (logger, part of the message) of the warnings vLLM logs on every run in this process that
# neither a user nor rlcli can act on; they are logged at INFO instead (`quiet_routine_notices`).
ROUTINE_NOTICES = (
    # Optional kernels the CPU build lacks, and what vLLM falls back to.
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend"),
    ("vllm.platforms.cpu", "Triton is not installed"),
    ("vllm.platforms.cpu", "Reset SSM cache type to float32"),
    ("vllm.config.vllm", "Model Runner V2 requires Triton"),
    ("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD"),
    ("vllm.v1.worker.cpu_worker", "libiomp is not found in LD_PRELOAD"),
    # The CPU worker replaces torch.set_num_threads by this warning, then calls it itself.
    ("vllm.v1.worker.cpu_worker", "doesn't allow to use `torch.set_num_threads`"),
    # sampler.enforce_eager (eager by default on CPU), and what follows from it.
    ("vllm.config.vllm", "Enforce eager set"),
    ("vllm.config.vllm", "Inductor compilation was disabled"),
    # The engine seeds the process's generators as it starts; `engine` restores them.
    ("vllm.engine.arg_utils", "The global random seed is set"),
    # Raised by vLLM looking through torch.distributed's attributes at import.
    ("py.warnings", "`torch.distributed.reduce_op` is deprecated"),
    # Raised only when a second engine starts in this process (the next job of a sweep, a run
    # on another model): the first engine's CPU worker put VLLM_DIST_IDENT in the environment,
    # a name missing from vLLM's own list of its variables; and the CPU platform registers its
    # kernels in place of Triton's again, one line per kernel.
    ("vllm.platforms.interface", "Unknown vLLM environment variable detected: VLLM_DIST_IDENT"),
    ("vllm.triton_utils.dispatcher", "is already registered. Overwriting."),
)
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
WEIGHTS_LOGGER = "vllm.model_executor.models.utils"


class LowerToInfo(logging.Filter):
    """Turns the WARNING records whose message `matches` into INFO records (kept, not dropped)."""

    def __init__(self, matches: Callable[[str], bool]):
        super().__init__()
        self.matches = matches

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and self.matches(record.getMessage()):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_quieted = False  # whether this process's loggers have the filters of `quiet_routine_notices`


def quiet_routine_notices() -> None:
    """Log `ROUTINE_NOTICES` at INFO from now on in this process (before vLLM's import, which
    logs the first of them; once, however many engines start)."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    for name in dict.fromkeys(name for name, _ in ROUTINE_NOTICES):
        parts = [part for owner, part in ROUTINE_NOTICES if owner == name]
        routine = LowerToInfo(lambda message, parts=parts: any(p in message for p in parts))
        logging.getLogger(name).addFilter(routine)


def weightless_layers(model: torch.nn.Module) -> set[str]:
    """Class names of the layers that a weight update fills with nothing, by design: those with
    buffers but no parameter (a rotary embedding's cos/sin table, computed when the engine
    starts) and those whose every parameter belongs to a layer before them (an output head tied
    to the embedding: it is updated with it). A class with any instance that does take weights
    is left out."""
    owners: set[int] = set()
    empty, loaded = set(), set()
    for module in model.modules():
        own = [p for p in module._parameters.values() if p is not None]
        if not own and not module._buffers:
            continue
        name = type(module).__name__
        (empty if all(id(p) in owners for p in own) else loaded).add(name)
        owners.update(id(p) for p in own)
    return empty - loaded


@contextlib.contextmanager
def lowered(logger_name: str, matches: Callable[[str], bool]):
    """Inside: the WARNING records of `logger_name` whose message `matches` are INFO records."""
    notice = LowerToInfo(matches)
    logger = logging.getLogger(logger_name)
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def expected_reload_notices(weightless: set[str]):
    """Inside: vLLM's "<layer>: Failed to load weights", which its reload logs for every layer
    that received nothing, is INFO for the `weightless` layers (`weightless_layers` of the model
    before the reload moves its tensors aside: their tensors are kept as they were, which is
    right for them); for any other layer it stays a warning."""
    expected = {f"{name}: Failed to load weights" for name in weightless}
    return lowered(RELOAD_LOGGER, lambda message: message in expected)


def checkpoint_casts_expected():
    """Inside (the engine's start): vLLM's "Attempted to load weight ... with dtype X into
    parameter with dtype Y", one line per weight of a checkpoint saved in another dtype than
    the engine's (float32 files, an engine in bfloat16 under trainer.bf16_autocast), is INFO:
    that cast is the one rlcli asked for. A weight push is cast before it is sent
    (`lora.sampler_weights`), so there the warning would still mean something."""
    return lowered(WEIGHTS_LOGGER, lambda message: message.startswith("Attempted to load weight "))


def repack_tied_head(model: torch.nn.Module) -> None:
    """vLLM's CPU backend packs the LM head's weight for its GEMM kernel at load time. A head
    tied to the embedding receives no weight of its own in an update, so its packed copy
    would keep the old values: re-pack it from the (now updated) shared tensor."""
    head = getattr(model, "lm_head", None)
    if head is not None and hasattr(head, "cpu_linear"):
        head.quant_method.process_weights_after_loading(head)


def sampling_settings(
    cfg: SamplerConfig,
    group_size: int,
    eos_ids: set[int],
    temperature: float | None,
    top_p: float | None = None,
) -> dict:
    """vLLM's sampling parameters for one call, as keyword arguments of `SamplingParams` (the
    engine in this process) or the JSON `sampling_params` of a worker's generate route;
    `temperature` and `top_p`, when given, replace the sampler's (evaluation). A greedy call
    (temperature 0) is the policy's argmax: top_k and min_p cannot change it, and the
    repetition penalty, which would, is left off."""
    temperature = cfg.temperature if temperature is None else temperature
    return {
        "n": group_size,
        "temperature": temperature,
        "top_p": cfg.top_p if top_p is None else top_p,
        "top_k": max(cfg.top_k, 0),  # sampler.top_k=-1 is off, as 0 is
        "min_p": cfg.min_p,
        "repetition_penalty": cfg.repetition_penalty if temperature > 0 else 1.0,
        "max_tokens": cfg.max_new_tokens,
        "stop": list(cfg.stop) or None,
        "include_stop_str_in_output": True,  # the text must match the trained tokens
        "stop_token_ids": sorted(eos_ids),
        "logprobs": 0,  # the sampled token's own log-prob only
    }
