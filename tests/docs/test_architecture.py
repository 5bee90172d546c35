"""The house plan holds (docs/ARCHITECTURE.md): the import rules, vLLM left alone unless it is
chosen, and shared objects left as they were."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_no_import_circle_no_upward_import_no_long_module():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "import_graph.py")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "import circles: 0" in done.stdout
    assert "imports from a lower layer to a higher one: 0" in done.stdout
    assert "functions over 60 lines in train/, collect/, rollout/: 0" in done.stdout


def test_importing_rlcli_and_training_with_hf_leave_vllm_alone(tmp_path):
    # A fresh interpreter: this test process may have started an engine already.
    script = """
import os, sys
from pathlib import Path
import rlcli.cli, rlcli.commands.evaluate, rlcli.commands.filter, rlcli.commands.make_pairs
import rlcli.train.loop
from rlcli.validate import compose
from rlcli.train.loop import train
train(compose(["model=tiny", "sampler=hf", "trainer.max_steps=1", "trainer.prompts_per_step=2",
               "trainer.group_size=2", "sampler.max_new_tokens=4", "logger.progress=false"]),
      Path(sys.argv[1]))
print("vllm imported:", "vllm" in sys.modules)
print("vllm variables:", sorted(k for k in os.environ if k.startswith("VLLM_")))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "vllm imported: False" in done.stdout
    assert "vllm variables: []" in done.stdout


def test_sampling_and_the_ptx_loss_leave_the_shared_tokenizer_as_it_was(tiny_model_dir):
    import torch

    from rlcli.rollout.hf import HFSampler
    from rlcli.runtime.models import load_causal_lm, load_tokenizer
    from rlcli.train.learner import lm_loss

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, "float32", torch.device("cpu"))
    # Each use pads as it needs (generation on the left, the LM loss on the right) without
    # setting the tokenizer's own padding side, which other users of it rely on.
    tokenizer.padding_side = "right"
    sampler = HFSampler(model, tokenizer, temperature=1.0, top_p=1.0, max_new_tokens=3)
    batch = sampler.sample(["a", "a longer prompt"], 2, ["0", "1"], ["", ""])
    assert batch.attention_mask[0, 0] == 0  # the shorter prompt is padded on the left
    assert batch.attention_mask[0, batch.prompt_width - 1] == 1
    assert tokenizer.padding_side == "right"
    tokenizer.padding_side = "left"
    loss = lm_loss(model, tokenizer, ["some text", "a much longer piece of plain text"])
    assert torch.isfinite(loss) and tokenizer.padding_side == "left"
