"""Shared fixtures. Tests run on CPU with the tiny random model (SmolLM2's tokenizer), which
is built once into rlcli's model cache; the first run also converts SmolLM2 from GGUF."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("WANDB_MODE", "offline")

# Settings under which the tiny model learns `reward=space_rate` within ~25 steps, with any
# algo (each keeps its own KL setting).
TINY_ANY_ALGO = [
    "model=tiny",
    "reward=space_rate",
    "trainer.lr=1e-2",
    "trainer.prompts_per_step=8",
    "trainer.group_size=8",
    "trainer.micro_batch_size=64",
    "sampler.max_new_tokens=16",
    "logger.progress=false",
]
TINY_LEARNS = [*TINY_ANY_ALGO, "algo.beta=0"]


@pytest.fixture(scope="session")
def tiny_overrides():
    return list(TINY_LEARNS)
