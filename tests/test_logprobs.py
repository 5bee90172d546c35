"""Chunked log-probs and entropy: equal to the plain full-vocabulary computation (values and
gradients), and measurably lighter on memory for a long-vocabulary batch."""

import json
import subprocess
import sys

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


def test_learner_logprobs_equal_the_models_own_logits(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlcli.learner import token_logprobs

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


# Runs in a fresh process so that its peak resident memory is this computation's alone.
PEAK_SCRIPT = """
import json, resource, sys, torch
from rlcli.ops.logprobs import chunked_logprob_entropy, plain_logprob_entropy
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
torch.manual_seed(0)
n, hidden_size, vocab = 2048, 64, 49152  # SmolLM2's vocabulary
hidden = torch.randn(n, hidden_size, requires_grad=True)
weight = torch.randn(vocab, hidden_size, requires_grad=True)
tokens = torch.randint(vocab, (n,))
before = rss_kib()
if sys.argv[1] == "chunked":
    logp, entropy = chunked_logprob_entropy(hidden, weight, tokens)
else:
    logp, entropy = plain_logprob_entropy(hidden @ weight.T, tokens)
(logp.sum() - 0.01 * entropy.sum()).backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"extra_mib": (peak - before) / 1024}))
"""


def test_chunked_path_peak_memory_is_measurably_lower():
    def extra_mib(path: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", PEAK_SCRIPT, path], capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.splitlines()[-1])["extra_mib"]

    plain, chunked = extra_mib("plain"), extra_mib("chunked")
    print(f"peak memory above the inputs: plain {plain:.0f} MiB, chunked {chunked:.0f} MiB")
    # The plain path holds [2048, 49152] float32 logits (384 MiB) several times over.
    assert plain > 800
    assert chunked < plain / 3
