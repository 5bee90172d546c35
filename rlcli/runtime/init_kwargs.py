"""`model.init_kwargs`, the policy's own from_pretrained arguments (TRL's model_init_kwargs):
what rlcli refuses in them (`check_init_kwargs`) and what the tokenizer and vLLM take of them
(`trusts_remote_code`). `runtime.models.load_causal_lm` passes them on; the reference model,
the same model again, gets them too; a reward model (another model) does not.
"""

from __future__ import annotations

import torch

from rlcli.config import ConfigError

# from_pretrained's arguments that rlcli sets itself, and the field a user sets instead.
_DTYPE = "trainer.dtype (the reference and vLLM compute in bfloat16 where trainer.bf16_autocast)"
SET_BY_RLCLI = {
    "dtype": _DTYPE,
    "torch_dtype": _DTYPE,
    "device_map": "trainer.device (one device a process; torchrun for several, FSDP2 shards)",
    "pretrained_model_name_or_path": "model.path",
}
# Quantised weights can be neither trained in full nor pushed into the sampler's engine.
QUANTISED = ("quantization_config", "load_in_4bit", "load_in_8bit")


def check_init_kwargs(kwargs: dict, attention: str, device: torch.device) -> None:
    """A ConfigError for model.init_kwargs that rlcli sets itself or quantise the model, a
    trust_remote_code that is no boolean, or an attn_implementation that transformers lacks,
    that cannot run on `device`, or that trainer.attention (`attention`) contradicts."""
    for name, value in kwargs.items():
        if name in SET_BY_RLCLI:
            raise ConfigError(
                f"model.init_kwargs.{name}={value} is not allowed: rlcli sets {name} itself, "
                f"from {SET_BY_RLCLI[name]}. Set that instead, and drop this one "
                f"(~model.init_kwargs.{name})."
            )
        if name in QUANTISED:
            raise ConfigError(
                f"model.init_kwargs.{name}={value} is not supported: rlcli trains, and pushes "
                "to its sampler, unquantised weights (no 4-bit QLoRA). Drop it "
                f"(~model.init_kwargs.{name}); model.lora.rank=R trains adapters only."
            )
    remote = kwargs.get("trust_remote_code", False)
    if not isinstance(remote, bool):
        raise ConfigError(
            f"model.init_kwargs.trust_remote_code={remote} is not allowed: it is true (run the "
            "code the model ships, in the learner, its tokenizer and vLLM) or false."
        )
    chosen = kwargs.get("attn_implementation")
    if chosen is None:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kernels = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    # A name with a "/" is a kernel from the hub (org/name), which transformers checks itself.
    known = isinstance(chosen, str) and ("/" in chosen or chosen in kernels)
    cuda_only = known and chosen.startswith(("flash_attention", "flex_attention"))
    if not known or (cuda_only and device.type != "cuda"):
        raise ConfigError(
            f"model.init_kwargs.attn_implementation={chosen} cannot be used"
            f"{' on ' + device.type if known else ''}: transformers' kernels are "
            f"{', '.join(kernels)} (flash_attention_* and flex_attention need CUDA), or a hub "
            "kernel org/name. Leave it out for rlcli's choice (eager on CPU, sdpa on CUDA)."
        )
    if attention != "auto":
        raise ConfigError(
            f"model.init_kwargs.attn_implementation={chosen} and trainer.attention={attention} "
            "both choose the policy's attention kernel: set only one (trainer.attention=auto "
            "leaves the choice to model.init_kwargs)."
        )


def trusts_remote_code(init_kwargs: dict | None) -> bool:
    """Whether model.init_kwargs lets the model's own code run: then its tokenizer's and the
    vLLM engine's too, which read the same repository."""
    return bool((init_kwargs or {}).get("trust_remote_code", False))
