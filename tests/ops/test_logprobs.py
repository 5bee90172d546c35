"""Chunked log-probs and entropy: equal to the plain full-vocabulary computation (values and
gradients), and measurably lighter on memory for a long-vocabulary batch."""

import pytest
import torch

from rlcli.ops.logprobs import chunked_logprob_entropy, plain_logprob_entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_plain_values_and_gradients(temperature):
    torch.manual_seed(0)
    n, hidden_size, vocab = 37, 16, 1000
    hidden = torch.randn(n, hidden_size, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, requires_grad=True)
    bias = torch.randn(vocab, requires_grad=True)
    tokens = torch.randint(vocab, (n,))
    # 4 tokens per chunk: 10 chunks, the last one short.
    got = chunked_logprob_entropy(hidden, weight, tokens, bias, temperature, chunk_elements=4000)
    want = plain_logprob_entropy(hidden @ weight.T + bias, tokens, temperature)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    # Any loss mixing both outputs has the same gradients through the recomputed chunks.
    def grads(logp, entropy):
        return torch.autograd.grad((logp * 0.3 - entropy * 0.1).sum(), (hidden, weight, bias))

    for a, b in zip(grads(*got), grads(*want), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_frozen_head_passes_gradients_to_the_hidden_states_only():
    # LoRA freezes the LM head: its backward skips the weight's gradient, the hidden states'
    # is unchanged.
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(1000, 16)
    tokens = torch.randint(1000, (37,))
    logp, entropy = chunked_logprob_entropy(hidden, weight, tokens, chunk_elements=4000)
    (got,) = torch.autograd.grad((logp - 0.1 * entropy).sum(), hidden)
    logp, entropy = plain_logprob_entropy(hidden @ weight.T, tokens)
    (want,) = torch.autograd.grad((logp - 0.1 * entropy).sum(), hidden)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.abs().sum() > 0 and weight.grad is None


def test_learner_logprobs_equal_the_models_own_logits(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlcli.train.forward import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    ids = torch.randint(model.config.vocab_size, (3, 12))
    att = torch.ones_like(ids)
    att[0, :2] = 0  # left padding, as in a batch
    position_ids = (att.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids).logits
    want = plain_logprob_entropy(logits[:, 4:-1], ids[:, 5:], 0.9)
    got = token_logprobs(model, ids, att, 5, with_entropy=True, temperature=0.9)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def held_for_backward_mib(compute, inputs) -> float:
    """MiB of tensors autograd keeps from the forward for the backward (each storage once,
    the inputs' own not counted): the memory that stays allocated between the two passes, on
    top of which every op's transient output sits. Counted exactly from the tensors, not from
    the process's resident size, which turned out to depend on the machine's state (the same
    chunked computation peaked 534 MiB above its inputs in a fresh process, and 950-1,900 MiB
    once a vLLM engine had started in the test process)."""
    own = {t.untyped_storage().data_ptr() for t in inputs}
    held: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in own:
            held[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logp, entropy = compute()
    (logp.sum() - 0.01 * entropy.sum()).backward()  # the backward works through the chunks
    return sum(held.values()) / 2**20


def test_chunked_path_holds_far_less_memory_for_the_backward():
    torch.manual_seed(0)
    n, hidden_size, vocab = 2048, 64, 49152  # SmolLM2's vocabulary
    hidden = torch.randn(n, hidden_size, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, requires_grad=True)
    tokens = torch.randint(vocab, (n,))
    plain = held_for_backward_mib(
        lambda: plain_logprob_entropy(hidden @ weight.T, tokens), (hidden, weight, tokens)
    )
    chunked = held_for_backward_mib(
        lambda: chunked_logprob_entropy(hidden, weight, tokens), (hidden, weight, tokens)
    )
    print(f"held for the backward: plain {plain:.0f} MiB, chunked {chunked:.1f} MiB")
    # The plain path keeps two [2048, 49152] float32 tensors (384 MiB each: the logits and
    # the log-softmax); the chunked one keeps nothing but its inputs and recomputes each
    # chunk's logits in the backward pass.
    assert plain >= 2 * 384
    assert chunked < 1


@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("chunk_elements", [4000, 10**6])  # 10 chunks, and all rows in one
def test_bfloat16_head_matches_float64_within_bfloat16_rounding(with_entropy, chunk_elements):
    # The learner's working weights are bfloat16: the chunked head's matmuls then run in
    # bfloat16 and its reductions, exponentials and the chosen token's gradient in float32.
    # Against float64 over the same (bfloat16-rounded) inputs, the only error left is the
    # logits' and the gradient's bfloat16 rounding.
    torch.manual_seed(0)
    n, hidden_size, vocab = 37, 16, 1000
    hidden = torch.randn(n, hidden_size).bfloat16().requires_grad_()
    weight = (torch.randn(vocab, hidden_size) / 2).bfloat16().requires_grad_()
    tokens = torch.randint(vocab, (n,))
    logp, entropy = chunked_logprob_entropy(
        hidden,
        weight,
        tokens,
        temperature=0.7,
        chunk_elements=chunk_elements,
        with_entropy=with_entropy,
    )
    hidden64 = hidden.detach().double().requires_grad_()
    weight64 = weight.detach().double().requires_grad_()
    log_probs64 = torch.log_softmax(hidden64 @ weight64.T / 0.7, -1)
    logp64 = log_probs64.gather(-1, tokens[:, None]).squeeze(-1)
    entropy64 = -(log_probs64.exp() * log_probs64).sum(-1)
    torch.testing.assert_close(logp.double(), logp64, rtol=0, atol=0.05)
    loss = logp.sum() * 0.3 + (entropy.sum() * -0.1 if with_entropy else 0)
    loss64 = logp64.sum() * 0.3 + (entropy64.sum() * -0.1 if with_entropy else 0)
    if with_entropy:
        torch.testing.assert_close(entropy.double(), entropy64, rtol=0, atol=0.05)
    got = torch.autograd.grad(loss, (hidden, weight))
    want = torch.autograd.grad(loss64, (hidden64, weight64))
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.bfloat16
        # within 2% of the gradient's size: bfloat16 keeps 8 bits of each value
        assert (a.double() - b).norm() <= 0.02 * b.norm()
