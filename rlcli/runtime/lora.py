"""LoRA adapters on a model (`model.lora.rank > 0`), through transformers' PEFT integration.

The adapters are injected into the Hugging Face model itself (`add_adapter`), so the learner,
`generate` and the chunked head call it exactly as they call a fully trained model; only the
adapters' parameters require gradients. What LoRA changes elsewhere goes through here: the
reference is the same model with its adapters off (`adapters_off`), vLLM receives the merged
weights (`sampler_weights`), a checkpoint holds the adapter only (`load_adapters` reads it
back), and `export_merged` writes one plain Hugging Face model (`rlcli export`).
docs/lora.md says what a user sees.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rlcli.config import ConfigError, LoraConfig
from rlcli.runtime import distributed

ADAPTER_CONFIG = "adapter_config.json"
# peft's name for "every linear layer but the output head": the attention and MLP projections
# of any transformer LM, whatever each architecture calls them.
ALL_LINEAR = "all-linear"


def check_settings(lora: LoraConfig) -> None:
    """The ranges of `model.lora.*` (a ConfigError naming the bad value)."""
    if lora.rank < 0:
        raise ConfigError(f"model.lora.rank={lora.rank} must be >= 0 (0 = no LoRA).")
    if not lora.rank:
        return
    if not lora.alpha > 0:
        raise ConfigError(f"model.lora.alpha={lora.alpha} must be > 0 (scale = alpha / rank).")
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"model.lora.dropout={lora.dropout} must be in [0, 1).")
    if not lora.target_modules:
        raise ConfigError(
            f"model.lora.target_modules is empty: name the layers to adapt (module names such "
            f"as [q_proj,v_proj]) or [{ALL_LINEAR}] (every linear layer but the output head)."
        )
    names = list(lora.target_modules)
    if ALL_LINEAR in names and len(names) > 1:
        # peft reads a list as module names, where all-linear names nothing: it would adapt
        # the other names only.
        raise ConfigError(
            f"model.lora.target_modules=[{','.join(names)}] mixes {ALL_LINEAR} with layer "
            f"names: {ALL_LINEAR} already adapts every linear layer but the output head. Give "
            f"[{ALL_LINEAR}] alone, or only the names of the layers to adapt (such as "
            "[q_proj,v_proj])."
        )


def _peft_config(lora: LoraConfig, keep: tuple[str, ...] = ()):
    from peft import LoraConfig as PeftLoraConfig

    targets = list(lora.target_modules)
    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
        # Trained whole beside the adapters and saved with them (PPO's new value head).
        modules_to_save=list(keep) or None,
    )


def _is_linear(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    return isinstance(module, (nn.Linear, Conv1D))


def _linear_names(model: nn.Module, keep: tuple[str, ...]) -> str:
    """The short names of the layers a user may adapt: linear ones, not the output head."""
    head = model.get_output_embeddings()
    layers = [n for n, m in model.named_modules() if _is_linear(m) and m is not head]
    names = {n.rsplit(".", 1)[-1] for n in layers}
    return ", ".join(sorted(names - {"lm_head", *keep}))


def _check_targets(model: nn.Module, lora: LoraConfig, keep: tuple[str, ...]) -> None:
    """Every name in `model.lora.target_modules` must match a layer (as peft matches: the whole
    module name or its last parts), each a linear or embedding layer with a weight of its own.
    A layer tied to another (a tied `lm_head` or `embed_tokens`) is refused: the one merged copy
    of its weight that vLLM and the export load could not match the trained model, which adapts
    only one use of it. Untied embeddings and output heads merge exactly."""
    names = list(lora.target_modules)
    if names == [ALL_LINEAR]:
        return  # peft picks the linear layers itself, never the output head
    given = f"model.lora.target_modules=[{','.join(names)}]"
    layers = f"its linear layers are {_linear_names(model, keep)}; or use [{ALL_LINEAR}]."
    modules = dict(model.named_modules())
    users: dict[int, list[str]] = {}  # a weight -> the modules holding it (tied: several)
    for name, module in modules.items():
        for param in module.parameters(recurse=False):
            users.setdefault(id(param), []).append(name)
    for target in names:
        which = "" if len(names) == 1 else f": {target}"
        found = [n for n in modules if n == target or n.endswith(f".{target}")]
        if not found:
            raise ConfigError(f"{given}{which} matches no layer of this model: {layers}")
        for name in found:
            module = modules[name]
            shared = [n for n in users.get(id(getattr(module, "weight", None)), []) if n != name]
            if shared:
                # vLLM and the exported model get one merged copy of a tied weight, while the
                # trained model adapts only this use of it: they would differ from it.
                raise ConfigError(
                    f"{given}: {name} is tied: it shares its weight with {shared[0]}. An "
                    "adapter on a tied layer cannot be merged into the one copy of that weight "
                    "vLLM and `rlcli export` load without changing the model that was trained. "
                    f"Adapt other layers instead: {layers}"
                )
            if not _is_linear(module) and not isinstance(module, nn.Embedding):
                raise ConfigError(
                    f"{given}: {name} is a {type(module).__name__}, not a linear layer; name "
                    f"the linear layers inside it instead: {layers}"
                )


def _check_rank(model: nn.Module, lora: LoraConfig) -> None:
    """A rank above a layer's smaller side adds parameters but no capacity: refused."""
    adapted = [(n, m.base_layer) for n, m in model.named_modules() if hasattr(m, "lora_A")]
    if not adapted:
        return
    name, layer = min(adapted, key=lambda item: min(item[1].weight.shape))
    limit = min(layer.weight.shape)
    if lora.rank > limit:
        shape = "x".join(str(d) for d in layer.weight.shape)
        raise ConfigError(
            f"model.lora.rank={lora.rank} is larger than the layer {name} ({shape}): an "
            f"adapter's rank can be at most its smaller side, {limit}. Use "
            f"model.lora.rank={limit} or less, or leave that layer out of "
            "model.lora.target_modules."
        )


def add_adapters(model: nn.Module, lora: LoraConfig, keep: tuple[str, ...] = ()) -> None:
    """Inject fresh adapters (B = 0, so the model's outputs are unchanged) and freeze the rest;
    the modules named in `keep` stay trainable whole."""
    _check_targets(model, lora, keep)
    try:
        model.add_adapter(_peft_config(lora, keep))
    except ValueError as err:  # what peft refuses beyond the checks above
        raise ConfigError(
            f"model.lora.target_modules=[{','.join(lora.target_modules)}]: {err}"
        ) from None
    _check_rank(model, lora)
    dropout_off(model)


def load_adapters(model: nn.Module, directory: Path) -> None:
    """Put the adapters saved in `directory` (a checkpoint) on the base `model`, trainable. A
    checkpoint's `save_pretrained` wrote the adapter only (PEFT's `adapter_model.safetensors`
    and `adapter_config.json`, naming the base model)."""
    model.load_adapter(str(directory), is_trainable=True)
    dropout_off(model)


def has_adapters(model: nn.Module) -> bool:
    return bool(getattr(model, "_hf_peft_config_loaded", False))


def is_adapter_dir(path: Path) -> bool:
    """A directory holding a PEFT adapter (a LoRA checkpoint) rather than a whole model."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


@contextlib.contextmanager
def adapters_off(model: nn.Module):
    """The base model inside the block: the reference of a LoRA run, so no second copy of the
    weights is held. A no-op for a model without adapters (a separately loaded reference)."""
    if not has_adapters(model):
        yield
        return
    model.disable_adapters()
    try:
        yield
    finally:
        model.enable_adapters()


def _dropout_layers(model: nn.Module) -> list[nn.Module]:
    return [m for n, m in model.named_modules() if n.endswith("lora_dropout")]


def dropout_off(model: nn.Module) -> None:
    """LoRA's dropout inactive, whatever mode the model is in: new adapters are made in training
    mode, and gradient checkpointing puts the whole model in it."""
    for layer in _dropout_layers(model):
        layer.eval()


@contextlib.contextmanager
def dropout_on(model: nn.Module):
    """LoRA's dropout active inside the block: the learner's passes that take gradients.
    Elsewhere it is off (`dropout_off`), so sampling, the reference and old log-probs see no
    dropout (an unchanged policy's ratio stays 1 there)."""
    layers = _dropout_layers(model)
    for layer in layers:
        layer.train()
    try:
        yield
    finally:
        for layer in layers:
            layer.eval()


def _merged(model: nn.Module, deltas: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter of the model as it would be merged, under the base model's
    names: W + ΔW, ΔW = (alpha/r)·B·A, for each adapted layer, one matrix at a time (a new tensor;
    the model itself is never merged in place), the other parameters as they are, tied ones once,
    the adapters' own parameters never. Without `deltas`, W alone: the same names, dtypes and
    shapes, nothing computed."""
    seen: set[int] = set()
    inside: tuple[str, ...] = ()  # prefixes of the adapted layers already yielded
    for name, module in model.named_modules():
        if inside and name.startswith(inside):
            continue
        prefix = f"{name}." if name else ""
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            inside = (*inside, prefix)
            base = module.base_layer
            for pname, param in base.named_parameters(recurse=False):
                tensor = param.detach()
                if deltas and pname == "weight" and not module.disable_adapters:
                    for adapter in module.active_adapters:
                        tensor = tensor + module.get_delta_weight(adapter).to(tensor.dtype)
                yield prefix + pname, tensor
            continue
        for pname, param in module.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                yield prefix + pname, param.detach()


def _sent_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor is sent to the engine in: the engine's for floating-point weights."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


@torch.no_grad()
def sampler_weights(
    model: nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """What an inference engine loads after a step: the merged weights of a LoRA model, else
    every parameter (gathered one at a time when sharded). With `dtype` (the engine's), each
    floating-point tensor is cast to it here, once, after merging: the engine then copies it
    as it is, and a worker receives half the bytes of float32 when it runs in bfloat16."""
    tensors = _merged(model) if has_adapters(model) else distributed.full_parameters(model)
    for name, tensor in tensors:
        yield name, tensor.to(_sent_dtype(tensor, dtype))


def sampler_weight_shapes(
    model: nn.Module, dtype: torch.dtype | None = None
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of each tensor `sampler_weights(model, dtype)` yields, without
    computing any."""
    tensors = _merged(model, deltas=False) if has_adapters(model) else model.named_parameters()
    return [(name, _sent_dtype(t, dtype), tuple(t.shape)) for name, t in tensors]


def base_model_path(directory: Path) -> str:
    """The model a saved adapter was trained on (PEFT's `base_model_name_or_path`)."""
    return json.loads((directory / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def export_merged(checkpoint: Path, out: Path, dtype: str = "float32") -> None:
    """Write the checkpoint's model as one plain Hugging Face directory: a LoRA checkpoint's
    adapters merged into its base model (PEFT's `merge_and_unload`), a full one as it is."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load = {"dtype": getattr(torch, dtype)}
    if is_adapter_dir(checkpoint):
        base = AutoModelForCausalLM.from_pretrained(base_model_path(checkpoint), **load)
        model = PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), **load)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(checkpoint)).save_pretrained(out)
