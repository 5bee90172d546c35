"""The learner on the real tiny model: padding-independent log-probs, and a loss whose
gradient does not depend on how the step is split into micro-batches."""

import copy
import dataclasses

import pytest
import torch

from rlcli.ops.policy_loss import AGGREGATIONS
from rlcli.rollout.batch import response_mask_from
from rlcli.train.forward import batch_logprobs, token_logprobs
from rlcli.train.learner import UpdatePlan, learn
from rlcli.train.objective_config import objective_from_config
from rlcli.train.run import setup
from rlcli.train.train_batch import TrainBatch
from rlcli.validate import compose


@pytest.fixture(scope="module")
def cfg():
    return compose(["model=tiny", "trainer.prompts_per_step=3", "trainer.group_size=4"])


@pytest.fixture(scope="module")
def run(cfg):
    return setup(cfg)


@pytest.fixture(scope="module")
def batch(run):
    problems = run.prompts.take(3)
    # Prompts of different lengths so left padding differs between rows.
    prompts = [f"{'word ' * (5 * i)}{p.question}" for i, p in enumerate(problems)]
    return run.sampler.sample(prompts, 4, [p.id for p in problems], [p.answer for p in problems])


def test_response_mask_stops_after_first_eos():
    tokens = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 9], [5, 6, 7, 8, 9]])
    mask, truncated = response_mask_from(tokens, {2})
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, True]


def test_left_padding_does_not_change_logprobs(run, batch):
    padded = batch_logprobs(run.policy, batch, size=12)  # [B, T]
    row = 0  # the shortest prompt: most left padding
    real = batch.attention_mask[row].bool()
    ids = batch.input_ids[row][real][None]
    alone, _ = token_logprobs(
        run.policy,
        ids,
        torch.ones_like(ids),
        batch.prompt_width - int((~real[: batch.prompt_width]).sum()),
    )
    n = int(batch.response_mask[row].sum())
    assert torch.allclose(padded[row, :n], alone[0, :n], atol=1e-5)


@pytest.mark.parametrize(
    ("aggregation", "per_token"),
    [(a, False) for a in sorted(AGGREGATIONS)] + [("token_mean", True)],
)
def test_micro_batches_give_the_big_batch_gradient(cfg, run, batch, aggregation, per_token):
    torch.manual_seed(0)
    if per_token:
        # Per-token advantages (PPO's GAE) span the batch's longest response; a micro-batch of
        # shorter ones is narrower and must take only its own columns. The tiny model's
        # responses all run to the limit, so they are cut to lengths 4, 8, ..., 48 here.
        keep = torch.arange(batch.response_mask.shape[1]) < 4 * torch.arange(1, 13)[:, None]
        batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)
        advantages = torch.randn(batch.response_mask.shape)
    else:
        advantages = torch.randn(len(batch.texts))
    ref_logp = batch_logprobs(run.policy, batch, 12) + 0.1 * torch.randn(batch.response_mask.shape)
    algo = copy.deepcopy(cfg.algo)
    algo.aggregation, algo.beta = aggregation, 0.1
    objective = objective_from_config(algo, cfg.sampler, norm_len=16)
    train_batch = TrainBatch(batch, torch.zeros(len(batch.texts)), advantages, None, ref_logp)
    grads = []
    for micro in (12, 5, 1):
        policy = copy.deepcopy(run.policy)
        # lr 0: the step leaves the weights alone and the accumulated gradient in .grad.
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
        plan = UpdatePlan(mini_batches=1, micro_batch_size=micro, max_grad_norm=0.0)
        metrics = learn(policy, optimizer, objective, train_batch, plan)
        grads.append(
            (metrics["loss/policy"], torch.cat([p.grad.flatten() for p in policy.parameters()]))
        )
    (loss, grad), others = grads[0], grads[1:]
    assert grad.abs().sum() > 0
    for other_loss, other_grad in others:
        assert other_loss == pytest.approx(loss, rel=1e-5, abs=1e-7)
        assert torch.allclose(other_grad, grad, rtol=1e-4, atol=1e-7)


def test_dr_grpo_weighs_a_response_the_same_when_another_is_masked_out(cfg, run, batch):
    # Dr.GRPO's denominator counts every sampled response: masking one out (failed reward,
    # overlong filter) must give the same gradient as keeping it with zero advantage. Dividing
    # by the responses left instead would scale every other response's weight by 12/11.
    advantages = torch.randn(len(batch.texts), generator=torch.Generator().manual_seed(2))
    advantages[3] = 0.0
    masked = batch.response_mask.clone()
    masked[3] = 0
    algo = copy.deepcopy(cfg.algo)
    algo.aggregation, algo.beta = "seq_mean_token_sum_norm", 0.0
    objective = objective_from_config(algo, cfg.sampler, norm_len=16)
    grads = []
    for mask in (batch.response_mask, masked):
        rollout = dataclasses.replace(batch, response_mask=mask)
        train_batch = TrainBatch(rollout, torch.zeros(len(batch.texts)), advantages, None, None)
        policy = copy.deepcopy(run.policy)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
        plan = UpdatePlan(mini_batches=1, micro_batch_size=5, max_grad_norm=0.0)
        learn(policy, optimizer, objective, train_batch, plan)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[1], grads[0], rtol=1e-4, atol=1e-8)


def test_fast_path_gives_the_plain_paths_loss_and_gradients(cfg, run, batch, monkeypatch):
    # The learner's fast path (issue 22): eager attention, gradient checkpointing, the head's
    # hand-written backward and the whole batch in one pass, against PyTorch's sdpa attention,
    # no checkpointing, the head through plain autograd over full logits and passes of 5 rows:
    # the same loss and gradients in float32. KL, entropy bonus and temperature are on so that
    # every term's gradient is compared.
    import rlcli.train.forward as forward_module
    from rlcli.ops.logprobs import chunked_logprob_entropy, plain_logprob_entropy
    from rlcli.runtime.models import load_causal_lm

    def plain_head(
        hidden, weight, tokens, bias=None, temperature=1.0, with_entropy=True, fused=False
    ):
        logits = hidden @ weight.T + (0 if bias is None else bias)
        logp, entropy = plain_logprob_entropy(logits, tokens, temperature)
        return logp, entropy if with_entropy else None

    torch.manual_seed(0)
    advantages = torch.randn(len(batch.texts))
    ref_logp = batch_logprobs(run.policy, batch, 12) + 0.1 * torch.randn(batch.response_mask.shape)
    algo = copy.deepcopy(cfg.algo)
    algo.beta, algo.entropy_coef = 0.1, 0.01
    sampler = dataclasses.replace(cfg.sampler, temperature=0.8)
    objective = objective_from_config(algo, sampler, norm_len=16)
    train_batch = TrainBatch(batch, torch.zeros(len(batch.texts)), advantages, None, ref_logp)
    results = []
    for fast in (True, False):
        policy = load_causal_lm(run.model_path, "float32", torch.device("cpu"))  # eager on CPU
        if fast:
            policy.gradient_checkpointing_enable({"use_reentrant": False})
            policy.train()
            head, rows = chunked_logprob_entropy, len(batch.texts)
        else:
            policy.set_attn_implementation("sdpa")
            head, rows = plain_head, 5
        monkeypatch.setattr(forward_module, "chunked_logprob_entropy", head)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)  # keeps .grad, moves nothing
        plan = UpdatePlan(mini_batches=1, micro_batch_size=rows, max_grad_norm=0.0)
        metrics = learn(policy, optimizer, objective, train_batch, plan)
        grad = torch.cat([p.grad.flatten() for p in policy.parameters()])
        results.append((metrics["loss/policy"], metrics["actor/entropy"], grad))
    (loss, entropy, grad), (want_loss, want_entropy, want_grad) = results
    assert grad.abs().sum() > 0
    assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    assert entropy == pytest.approx(want_entropy, rel=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)


def test_fused_adamw_makes_the_multi_tensor_kernels_updates(run):
    # rlcli's optimiser (runtime.models.adamw) takes PyTorch's fused kernel; three steps on the
    # same gradients, with weight decay, leave the weights where the multi-tensor kernel does.
    from rlcli.runtime.models import adamw

    torch.manual_seed(0)
    grads = [[torch.randn_like(p) * 1e-3 for p in run.policy.parameters()] for _ in range(3)]
    weights = []
    for fused in (True, False):
        params = [p.detach().clone().requires_grad_() for p in run.policy.parameters()]
        if fused:
            optimizer = adamw(params, lr=1e-3, weight_decay=0.1)
            assert optimizer.defaults["fused"]
        else:
            optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            optimizer.step()
        weights.append(torch.cat([p.detach().flatten() for p in params]))
    start = torch.cat([p.detach().flatten() for p in run.policy.parameters()])
    assert (weights[0] - start).abs().max() > 1e-3  # three steps of lr 1e-3 moved them
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_shared_prompts_give_the_padded_layouts_logprobs_and_gradients(cfg, run, batch, attention):
    # A group's prompt read once, its responses after it under a mask that hides siblings
    # from each other (train.passes), against one padded row per response: the same
    # log-probs, loss and gradients in float32, with prompts of three lengths, responses cut
    # to different lengths, and the batch in one pass or in passes of at most 5 responses.
    from rlcli.runtime.models import load_causal_lm

    full = batch  # every response runs to the length limit
    keep = torch.arange(batch.response_mask.shape[1]) < 4 * torch.arange(1, 13)[:, None]
    batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)
    torch.manual_seed(0)
    advantages = torch.randn(len(batch.texts))
    algo = copy.deepcopy(cfg.algo)
    algo.beta, algo.entropy_coef = 0.0, 0.01
    objective = objective_from_config(algo, cfg.sampler, norm_len=16)
    train_batch = TrainBatch(batch, torch.zeros(len(batch.texts)), advantages, None, None)
    policy = load_causal_lm(run.model_path, "float32", torch.device("cpu"))
    policy.set_attn_implementation(attention)
    padded = batch_logprobs(policy, batch, 12, share_prompts=False)
    results = []
    for share, micro in ((False, 12), (True, 12), (True, 5)):
        shared = batch_logprobs(policy, batch, micro, share_prompts=share)
        in_loss = batch.response_mask.bool()
        torch.testing.assert_close(shared[in_loss], padded[in_loss], rtol=1e-5, atol=1e-5)
        model = copy.deepcopy(policy)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # keeps .grad, moves nothing
        plan = UpdatePlan(1, micro, max_grad_norm=0.0, share_prompts=share)
        metrics = learn(model, optimizer, objective, train_batch, plan)
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((metrics, grad))
    (want, want_grad), *others = results
    assert want_grad.abs().sum() > 0
    for metrics, grad in others:
        assert metrics["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-5, abs=1e-7)
        assert metrics["actor/entropy"] == pytest.approx(want["actor/entropy"], rel=1e-5)
        torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-7)
    # The shared layout reads each of the 3 prompts once instead of 4 times.
    from rlcli.train.passes import passes

    rows = torch.arange(len(full.texts))
    prompt_tokens = int(full.attention_mask[:, : full.prompt_width].sum())
    read = {
        share: sum(
            p.real_tokens for _, p, _ in passes(full, rows, 12, 0, attention if share else None)
        )
        for share in (False, True)
    }
    assert read[False] - read[True] == prompt_tokens * 3 // 4
    # With the responses cut, the two shorter groups fit in the longest one's length: the
    # one-pass case above ran them packed in one row (`pack_rows`), two rows for three groups.
    (_, packed, _), *more = passes(batch, rows, 12, 0, attention)
    assert not more and packed.input_ids.shape[0] == 2


def test_flex_attention_block_mask_gives_the_padded_layouts_logprobs(run, batch):
    # The shared-prompt layout with groups packed in rows, as CUDA runs it under
    # flex_attention's block mask, against one padded row per response (float32). Forward
    # only: PyTorch has no flex_attention backward on CPU, which is why the CPU trains with
    # the dense mask; the block mask's gradients are those of the same attention.
    from rlcli.runtime.models import load_causal_lm
    from rlcli.train.passes import passes

    keep = torch.arange(batch.response_mask.shape[1]) < 4 * torch.arange(1, 13)[:, None]
    batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)
    policy = load_causal_lm(run.model_path, "float32", torch.device("cpu"))
    padded = batch_logprobs(policy, batch, 12, share_prompts=False)
    policy.set_attn_implementation("flex_attention")
    rows = torch.arange(len(batch.texts))
    (_, packed, _), *more = passes(batch, rows, 12, 0, "flex_attention")
    assert not more and packed.input_ids.shape[0] == 1  # the three groups in one row
    flex = batch_logprobs(policy, batch, 12)
    in_loss = batch.response_mask.bool()
    torch.testing.assert_close(flex[in_loss], padded[in_loss], rtol=1e-5, atol=1e-5)


def test_packing_fills_rows_first_fit_within_both_budgets():
    from rlcli.train.passes import pack_rows

    # Longest first: 10 opens a row, 7 another (10 + 7 > 12), 5 joins 7, 2 joins 10.
    assert pack_rows([5, 10, 2, 7], [1, 1, 1, 1], 12, 8) == [[1, 2], [3, 0]]
    # At most 2 responses a row: 2 (of 1 response) no longer fits beside 10 (of 2), nor in
    # the full row of 7 and 5.
    assert pack_rows([5, 10, 2, 7], [1, 2, 1, 1], 12, 2) == [[1], [3, 0], [2]]
    # A group longer than the row stays alone.
    assert pack_rows([20, 3], [1, 1], 12, 8) == [[0], [1]]


def test_shared_rows_group_by_prompt_and_respect_the_row_budget():
    from rlcli.train.passes import plan_shared_passes, plan_shared_rows

    prompts = [(1, 2), (3, 4, 5), (1, 2), (3, 4, 5), (1, 2)]
    lengths = [6, 2, 4, 9, 5]
    # Each prompt's responses in one row, shortest first.
    assert plan_shared_rows(prompts, lengths, row_tokens=100) == [[2, 4, 0], [1, 3]]
    # A row of prompt (2) + 4 + 5 is full at 11 tokens: the response of length 6 starts a new one.
    assert plan_shared_rows(prompts, lengths, row_tokens=11) == [[2, 4], [0], [1], [3]]
    # Passes: rows sorted by length, at most 3 responses or 24 padded tokens each.
    assert plan_shared_passes([17, 14, 8], [3, 2, 1], 3, 0) == [[2, 1], [0]]
    assert plan_shared_passes([17, 14, 8], [3, 2, 1], 9, 24) == [[2], [1], [0]]
