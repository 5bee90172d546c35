"""The learner's bfloat16 working weights over float32 masters (`runtime.precision`)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlcli.runtime.models import load_causal_lm
from rlcli.runtime.precision import WorkingWeights
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose

CPU = torch.device("cpu")


def lm_loss(model, ids):
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def test_working_weights_sum_bf16_gradients_into_float32_masters(tiny_model_dir):
    master = load_causal_lm(str(tiny_model_dir), "float32", CPU)
    working = WorkingWeights(master)
    params = list(working.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    assert len(params) == len(list(master.parameters()))  # tied weights stay tied
    # Buffers (the rotary frequencies) are not parameters: they keep their float32.
    buffers = dict(working.model.named_buffers())
    assert buffers and all(b.dtype == torch.float32 for b in buffers.values())
    torch.manual_seed(0)
    batches = [torch.randint(master.config.vocab_size, (2, 9)) for _ in range(2)]
    # What the two backwards make in bfloat16, one at a time on a plain bfloat16 copy.
    plain = copy.deepcopy(master)
    for p in plain.parameters():
        p.data = p.data.to(torch.bfloat16)
    each = []
    for ids in batches:
        plain.zero_grad(set_to_none=True)
        lm_loss(plain, ids).backward()
        each.append([p.grad.float() for p in plain.parameters()])
    for ids in batches:
        lm_loss(working.model, ids).backward()
    assert all(p.grad is None for p in params)  # handed over to the masters
    for main, first, second in zip(master.parameters(), *each, strict=True):
        assert main.grad.dtype == torch.float32
        torch.testing.assert_close(main.grad, first + second, rtol=0, atol=0)
    # An optimiser step moves the masters in float32, and the working copy follows.
    optimizer = torch.optim.SGD(master.parameters(), lr=1.0)
    working.follow(optimizer)
    before = [p.detach().clone() for p in master.parameters()]
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, master.parameters(), strict=True))
    for w, p in zip(params, master.parameters(), strict=True):
        assert torch.equal(w, p.detach().to(torch.bfloat16))


def test_bf16_working_gradient_points_where_the_float32_one_does(tiny_model_dir):
    # The bfloat16 passes' gradient against the exact float32 one, and against autocast's
    # over float32 weights (what rlcli ran before): the same direction within bfloat16's
    # rounding, and as close to float32's as autocast's is.
    torch.manual_seed(1)
    ids = torch.randint(1000, (4, 24))

    def gradient(kind):
        master = load_causal_lm(str(tiny_model_dir), "float32", CPU)
        model = WorkingWeights(master).model if kind == "bf16_weights" else master
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "autocast"):
            lm_loss(model, ids).backward()
        return torch.cat([p.grad.flatten() for p in master.parameters()])

    exact, autocast, working = (gradient(k) for k in ("float32", "autocast", "bf16_weights"))
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(working, exact, dim=0) > 0.999
    assert (working - exact).norm() < 2 * (autocast - exact).norm() + 1e-6


def computing_in_bf16(patch: pytest.MonkeyPatch) -> None:
    """The run computes in bfloat16 whatever this CPU's choice (`runtime.cpu_bf16`): a CPU that
    multiplies bfloat16 slower than float32, or only emulates it, still runs the tiny model."""
    import rlcli.runtime.models

    patch.setattr(rlcli.runtime.models, "has_fast_bf16", lambda device: True)


@pytest.fixture(scope="module")
def bf16_run():
    with pytest.MonkeyPatch.context() as patch:
        computing_in_bf16(patch)
        run = setup(compose(["model=tiny", "sampler=hf", "reward=space_rate", "trainer.lr=1e-3"]))
    assert run.compute_dtype == "bfloat16"
    return run


def test_a_bf16_run_trains_float32_masters_through_bf16_passes(bf16_run):
    run = bf16_run
    assert not run.learner_autocast
    assert all(p.dtype == torch.bfloat16 for p in run.learner.parameters())
    optimised = [p for group in run.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimised} == {id(p) for p in run.policy.parameters()}
    assert all(p.dtype == torch.float32 for p in optimised)
    before = [p.detach().clone() for p in run.policy.parameters()]
    metrics = train_step(run)
    assert metrics["actor/grad_norm"] > 0
    moved = [not torch.equal(b, p) for b, p in zip(before, run.policy.parameters(), strict=True)]
    assert all(moved)
    for w, p in zip(run.learner.parameters(), run.policy.parameters(), strict=True):
        assert torch.equal(w, p.detach().to(torch.bfloat16))


@pytest.mark.parametrize("override", ["trainer.bf16_weights=false", "model.lora.rank=4"])
def test_autocast_where_bf16_weights_are_off_or_the_policy_is_lora(override, monkeypatch):
    computing_in_bf16(monkeypatch)
    run = setup(compose(["model=tiny", "sampler=hf", override]))
    assert run.compute_dtype == "bfloat16"
    assert run.learner_autocast
    assert all(p.dtype == torch.float32 for p in run.learner.parameters())
