"""A checkpoint resumes on another number of torchrun ranks: the optimiser's state is saved
whole and by parameter name (`runtime.distributed.full_optimizer_state`), and each rank's
random numbers and sampler state beside it."""

import shutil
import subprocess
import sys

import torch

from rlcli.runtime.distributed import full_optimizer_state, load_optimizer_state
from rlcli.tracking.metrics import read_metrics
from tests.conftest import REPO

TRAIN = ["-m", "rlcli", "train", "model=tiny", "reward=space_rate", "sampler=hf",
         "sampler.max_new_tokens=8", "trainer.prompts_per_step=4", "trainer.group_size=2",
         "trainer.save_every=1", "logger.progress=false"]  # fmt: skip
COMPARED = ("loss/policy", "actor/grad_norm", "reward/mean", "response/length_mean")


def train(processes: int, run_dir, *overrides: str) -> subprocess.CompletedProcess:
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [*launch, *TRAIN, f"hydra.run.dir={run_dir}", *overrides]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def step_row(run_dir, step: int) -> dict:
    [row] = [r for r in read_metrics(run_dir) if r["step"] == step]
    return row


def test_two_ranks_resume_on_one_and_on_two_and_one_on_two(tmp_path):
    saved = tmp_path / "two"
    train(2, saved, "trainer.max_steps=2")
    ones = [tmp_path / "one_a", tmp_path / "one_b"]
    for run_dir in ones:
        shutil.copytree(saved, run_dir)
        out = train(1, run_dir, "trainer.max_steps=3")
        assert "was written by 2 process(es) and this run has 1" in out.stdout
        assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    # Two one-process resumes of the same checkpoint take the same step.
    first, second = (step_row(run_dir, 3) for run_dir in ones)
    assert {k: first[k] for k in COMPARED} == {k: second[k] for k in COMPARED}
    # The two ranks resume on two, saying nothing of a change, and take the step that two
    # ranks take without a stop: each rank draws from its own saved random numbers.
    out = train(2, saved, "trainer.max_steps=3")
    assert "process(es) and this run has" not in out.stdout
    assert [r["step"] for r in read_metrics(saved)] == [1, 2, 3]
    straight = tmp_path / "straight"
    train(2, straight, "trainer.max_steps=3")
    resumed, unbroken = step_row(saved, 3), step_row(straight, 3)
    assert {k: resumed[k] for k in COMPARED} == {k: unbroken[k] for k in COMPARED}
    # And the one-process run's checkpoint resumes on two ranks.
    out = train(2, ones[0], "trainer.max_steps=4")
    assert "was written by 1 process(es) and this run has 2" in out.stdout
    assert [r["step"] for r in read_metrics(ones[0])] == [1, 2, 3, 4]
    assert torch.isfinite(torch.tensor(step_row(ones[0], 4)["loss/policy"]))


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 3)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def _moments(optimizer) -> list[torch.Tensor]:
    return [optimizer.state[p]["exp_avg_sq"] for g in optimizer.param_groups for p in g["params"]]


def test_optimizer_state_by_name_and_the_layouts_before_it_load_alike():
    model, optimizer = _model_and_optimizer(0)
    by_name = full_optimizer_state(model, optimizer)
    assert set(by_name["state"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    layouts = {
        "by name": by_name,
        "numbered (one process before)": optimizer.state_dict(),
        "with the root's lm. (torchrun before)": {
            "state": {f"lm.{k}": v for k, v in by_name["state"].items()},
            "param_groups": [
                {**g, "params": [f"lm.{n}" for n in g["params"]]} for g in by_name["param_groups"]
            ],
        },
    }
    for layout, state in layouts.items():
        _, fresh = _model_and_optimizer(1)
        assert not torch.equal(_moments(fresh)[0], _moments(optimizer)[0])
        other, fresh = _model_and_optimizer(1)
        load_optimizer_state(other, fresh, state)
        for got, want in zip(_moments(fresh), _moments(optimizer), strict=True):
            assert torch.equal(got, want), layout
