"""Bad input to the real `rlcli train`: each case exits with code 2 and one message naming the
bad value and what would be valid, and prints no Python traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
TINY = ["model=tiny", "reward=space_rate", "trainer.max_steps=1"]


def rlcli_train(tmp_path: Path, *overrides: str, env: dict | None = None):
    command = [sys.executable, "-m", "rlcli", "train", *overrides, f"hydra.run.dir={tmp_path}/run"]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def no_vllm_env(tmp_path: Path) -> dict:
    """An environment in which vLLM looks uninstalled. This is the one simulated case: vLLM is
    installed on this machine, so a `sitecustomize` puts None in sys.modules["vllm"], which
    makes importlib report it missing, as on a machine without it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["vllm"] = None\n')
    return {**os.environ, "PYTHONPATH": str(site)}


CASES = {
    "unknown group choice": (
        ["algo=nope"],
        "algo=nope is not one of the valid choices for algo: dapo, dcpo, dpo, dr_grpo, dupo, "
        "grpo, gspo, gspo_token, ppo, rloo.",
    ),
    "unknown key": (
        ["trainer.max_stpes=3"],
        "trainer.max_stpes is not a config key: trainer has no 'max_stpes'. Did you mean "
        "trainer.max_steps?",
    ),
    "wrong type": (
        ["trainer.max_steps=ten"],
        "Invalid config value at trainer.max_steps: Value 'ten' of type 'str' could not be "
        "converted to Integer",
    ),
    "missing data file": (
        ["data=jsonl", "data.path=/nonexistent/train.jsonl"],
        "data.path=/nonexistent/train.jsonl: no such file.",
    ),
    "empty data file": (
        ["data=jsonl", "data.path={tmp}/empty.jsonl"],
        "data.path={tmp}/empty.jsonl holds no records: the file is empty.",
    ),
    "records missing the configured fields": (
        ["data=jsonl", "data.path={tmp}/fields.jsonl"],
        "There is no field 'question' in",
    ),
    "model path that does not exist": (
        ["model.path=/nonexistent/model"],
        "model.path=/nonexistent/model does not exist.",
    ),
    "prompt longer than allowed": (
        ["sampler.max_prompt_tokens=20"],
        "prompts of data=arith are longer than sampler.max_prompt_tokens=20",
    ),
    "group size 1 for a group-based algorithm": (
        ["algo=grpo", "trainer.group_size=1"],
        "trainer.group_size=1 is too small for algo.advantage=grpo",
    ),
    "vLLM asked for but not installed": (
        ["sampler=vllm"],
        "sampler=vllm needs vLLM, which is not installed.",
    ),
    "CUDA asked for but absent": (
        ["trainer.device=cuda"],
        "trainer.device=cuda was asked for but this machine has no CUDA GPU",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_a_message_and_no_traceback(tmp_path, case):
    if case == "CUDA asked for but absent" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so asking for it is not an error here")
    write_jsonl(tmp_path / "empty.jsonl", [])
    write_jsonl(tmp_path / "fields.jsonl", [{"problem": "1+1?", "answer": "2"}] * 3)
    overrides, expected = CASES[case]
    overrides = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    env = no_vllm_env(tmp_path) if case.startswith("vLLM") else None
    sampler = [] if any(o.startswith("sampler=") for o in overrides) else ["sampler=hf"]
    out = rlcli_train(tmp_path, *TINY, *sampler, *overrides, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    message = out.stderr.strip().splitlines()[-1]
    assert message.startswith("rlcli: error: ")
    assert expected.replace("{tmp}", str(tmp_path)) in message
    # Nothing was trained or written but the resolved config.
    assert not (tmp_path / "run" / "checkpoints").exists()
