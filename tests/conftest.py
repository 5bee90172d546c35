"""Shared fixtures. Tests run on CPU with the tiny random model (SmolLM2's tokenizer), which
is built once into rlcli's model cache; the first run also converts SmolLM2 from GGUF."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The repository's root and the test fixtures, for the tests in tests/<room>/ to find them.
REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"

os.environ.setdefault("WANDB_MODE", "offline")
# Nothing can be downloaded here: a hub id fails at once instead of after retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Settings under which the tiny model learns `reward=space_rate` within ~25 steps, with any
# algo (each keeps its own KL setting). Runs are deterministic for a seed, but with 8 prompts
# per step how fast the reward rose varied a lot from seed to seed and with tiny numerical
# differences (GRPO, lr 1e-2: 0.2-0.8 after 25 steps over seeds 0-2); with 16 prompts and
# lr 2e-2 GRPO, Dr.GRPO, DAPO and DCPO all passed 0.9 by step 22.
TINY_ANY_ALGO = [
    "model=tiny",
    "reward=space_rate",
    "trainer.lr=2e-2",
    "trainer.prompts_per_step=16",
    "trainer.group_size=8",
    "trainer.micro_batch_size=64",
    "sampler.max_new_tokens=16",
    "logger.progress=false",
]
TINY_LEARNS = [*TINY_ANY_ALGO, "algo.beta=0"]


def tiny(*overrides: str, sampler="hf", reward="space_rate", new_tokens=8) -> list[str]:
    """The overrides of a short, quiet run on the tiny random model (transformers' sampler,
    the space-rate reward, 8 new tokens unless told otherwise; None leaves a group at its
    default), then `overrides`."""
    base = ["model=tiny", f"sampler={sampler}", f"reward={reward}", "logger.progress=false",
            f"sampler.max_new_tokens={new_tokens}"]  # fmt: skip
    return [o for o in base if not o.endswith("=None")] + list(overrides)


@pytest.fixture(scope="session")
def tiny_overrides():
    return list(TINY_LEARNS)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The tiny model's directory in the cache (built on first use)."""
    from rlcli.runtime.models import resolve_model_path
    from rlcli.validate import compose

    cfg = compose(["model=tiny"])
    return resolve_model_path(cfg.model, cfg.trainer.seed)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The docs site built from the working tree with `mkdocs build --strict` (once a session:
    the site's and the layout's tests read the same build)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
         "-d", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return out
