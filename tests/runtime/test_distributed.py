"""Micro-batching and data parallelism: the learner's step does not depend on how the batch is
cut, into micro-batches by a token budget or across torchrun ranks (FSDP2 on gloo)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlcli.runtime.models import load_causal_lm
from rlcli.tracking.metrics import read_metrics
from rlcli.train.forward import TokenLogprobModel
from rlcli.train.learner import UpdatePlan, learn
from rlcli.train.objective_config import objective_from_config
from rlcli.train.passes import plan_micro_batches
from rlcli.train.train_batch import TrainBatch
from rlcli.validate import section
from tests.conftest import REPO
from tests.runtime.dp_step import fixed_batch

# Run as a script (`python` and `torchrun`) from the repository's root.
DP_STEP = "tests/runtime/dp_step.py"


def torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", *args]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_micro_batches_follow_the_token_budget_over_length_sorted_rows():
    prompts = [10, 10, 10, 10, 10, 10]
    responses = [30, 2, 28, 3, 29, 1]
    # Sorted by response length (rows 5, 1, 3, then 2, 4, 0), the short rows share a pass of
    # 3 x (10 + 3) tokens and the long ones one of 3 x (10 + 30) = 120: 159 tokens in all,
    # where rows in their own order, 3 at a time, would each be padded to 40 (240 tokens).
    assert plan_micro_batches(prompts, responses, max_rows=8, max_tokens=120) == [
        [5, 1, 3], [2, 4, 0],
    ]  # fmt: skip
    assert plan_micro_batches(prompts, responses, max_rows=2, max_tokens=0) == [
        [5, 1], [3, 2], [4, 0],
    ]  # fmt: skip
    # A row longer than the budget still gets a pass of its own.
    assert plan_micro_batches(prompts, responses, max_rows=8, max_tokens=30) == [
        [5, 1], [3], [2], [4], [0],
    ]  # fmt: skip


def one_step(model_dir: str, micro_batch_size: int, max_tokens: int) -> dict:
    policy = load_causal_lm(model_dir, "float32", torch.device("cpu"))
    learner = TokenLogprobModel(policy)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-3)
    batch, advantages, old_logp = fixed_batch(policy.config.vocab_size)
    algo, sampler = section("algo", "grpo", beta=0.0), section("sampler", "hf")
    objective = objective_from_config(algo, sampler, norm_len=16)
    train_batch = TrainBatch(batch, torch.zeros(len(batch.texts)), advantages, old_logp)
    plan = UpdatePlan(1, micro_batch_size, max_tokens, max_grad_norm=1.0)
    metrics = learn(learner, optimizer, objective, train_batch, plan)
    grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
    return {"loss": metrics["loss/policy"], "grad_norm": metrics["actor/grad_norm"], "grads": grads}


def test_the_step_does_not_depend_on_the_micro_batch_plan(tiny_model_dir):
    whole = one_step(tiny_model_dir, micro_batch_size=64, max_tokens=0)  # one pass
    for size, budget in [(3, 0), (8, 40), (1, 0)]:
        cut = one_step(tiny_model_dir, size, budget)
        assert abs(cut["loss"] - whole["loss"]) < 1e-6
        assert abs(cut["grad_norm"] - whole["grad_norm"]) < 1e-6 * whole["grad_norm"]
        for name, grad in whole["grads"].items():
            torch.testing.assert_close(cut["grads"][name], grad, rtol=1e-4, atol=1e-10)


def test_two_gloo_processes_take_the_same_step_as_one(tmp_path, tiny_model_dir):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    single = subprocess.run(
        [sys.executable, DP_STEP, tiny_model_dir, str(one)],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr
    pair = torchrun(DP_STEP, tiny_model_dir, str(two))
    assert pair.returncode == 0, pair.stderr[-3000:]
    a, b = torch.load(one), torch.load(two)
    # The loss and the gradient norm before clipping are those of the whole batch (a rank
    # that averaged instead of summing would halve the norm)...
    assert abs(a["loss"] - b["loss"]) < 1e-6
    assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * a["grad_norm"]
    assert a["grad_norm"] > 1e-4  # so the clipping (max_grad_norm 1e-4) was applied
    # ...and so are the clipped gradients and the parameters after the AdamW step.
    for name, grad in a["grads"].items():
        torch.testing.assert_close(b["grads"][name], grad, rtol=1e-4, atol=1e-10)
    moved = max((a["params"][n] - b["params"][n]).abs().max().item() for n in a["params"])
    assert moved < 1e-5
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert any(not torch.equal(a["params"][f"lm.{n}"], initial[n]) for n in initial), (
        "the step did not change the parameters"
    )


def test_torchrun_trains_with_one_log_and_one_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    out = torchrun(
        "-m", "rlcli", "train", "model=tiny", "reward=space_rate", "sampler=hf",
        "sampler.max_new_tokens=8", "trainer.max_steps=2", "trainer.prompts_per_step=4",
        "trainer.group_size=2", "trainer.save_every=1", "logger.progress=false",
        f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("rlcli: training") == 1 and "in 2 processes" in out.stdout
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]  # logged once, by rank 0
    assert all(isinstance(r["step"], int) for r in rows)  # not averaged over the ranks
    saved = load_file(run_dir / "checkpoints" / "step_2" / "model.safetensors")
    model = load_causal_lm(str(run_dir / "checkpoints" / "step_2"), "float32", "cpu")
    assert set(saved) <= set(model.state_dict())
    before = load_file(run_dir / "checkpoints" / "step_1" / "model.safetensors")
    assert any(not torch.equal(saved[k], before[k]) for k in saved)


@pytest.mark.parametrize(
    "shape", [["sampler=vllm"], ["sampler.workers=1"]], ids=["colocated", "worker"]
)
def test_two_gloo_ranks_sample_with_the_weights_they_just_learned(tmp_path, shape):
    # Colocated: every rank runs its own vLLM engine and streams its gathered parameters into
    # it. Worker: rank 0 starts one vLLM server that both ranks sample from, and the weights
    # go to it over the gloo weight-transfer backend. Either way, in float32 the engine's
    # log-probs must match the learner's to rounding at every step while a high learning rate
    # moves the policy far from where it started (the KL to the reference), so an engine
    # left with older weights fails.
    run_dir = tmp_path / "run"
    out = torchrun(
        "-m", "rlcli", "train", "model=tiny", "reward=space_rate", *shape,
        "trainer.max_steps=3", "trainer.lr=5e-2", "trainer.bf16_autocast=false",
        "trainer.dtype=float32", "trainer.prompts_per_step=8", "sampler.max_new_tokens=16",
        "trainer.save_every=0", "logger.progress=false", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/logp_abs_diff"] < 1e-3 for r in rows), rows
    # Worker samples are not seeded, so how far the policy moves varies (KL 0.07-0.7 seen);
    # a KL of 0.01 already means log-probs about 0.1 apart, 100x the tolerance above.
    assert rows[-1]["loss/kl"] > 1e-2


# Slow (about a minute): streaming under torchrun, each rank with its own rounds ahead and
# rank 0 pausing the shared worker for every push.
@pytest.mark.slow
def test_two_gloo_ranks_stream_from_one_worker_within_max_staleness(tmp_path):
    run_dir = tmp_path / "run"
    out = torchrun(
        "-m", "rlcli", "train", "model=tiny", "reward=space_rate", "sampler.workers=1",
        "sampler.max_staleness=1", "trainer.max_steps=4", "trainer.lr=5e-2",
        "trainer.prompts_per_step=8", "sampler.max_new_tokens=16", "trainer.save_every=0",
        "logger.progress=false", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
    assert rows[0]["rollout/staleness_max"] == 0
    assert max(r["rollout/staleness_max"] for r in rows[1:]) == 1
    assert rows[-1]["loss/kl"] > 1e-3  # the policy moved, and the worker kept sampling
