"""Log-probs of chosen tokens and the entropy of each prediction, computed a chunk of tokens at
a time so that the [tokens, vocabulary] logits never exist for the whole batch at once.

With vocabularies of 49k-150k entries the full-batch logits (and their log-softmax, and the
gradient of both) are the learner's largest tensors by far: 4 x 8 sequences of 1,000 tokens
over 150k entries is 18 GiB in float32. Here each chunk's logits are made, reduced to two
numbers per token and dropped; under autograd each chunk is recomputed in the backward pass
(activation checkpointing), so the memory held is one chunk's logits, not the batch's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# Logit elements per chunk (2^24 float32 = 64 MiB): 341 tokens at SmolLM2's 49,152 entries.
CHUNK_ELEMENTS = 2**24


def _chunk_logprob_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_normaliser = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, tokens[:, None]).squeeze(-1) - log_normaliser
    if not with_entropy:
        return logp, None
    # H = -sum p log p over this chunk's rows (the same formula as the plain path).
    log_probs = logits - log_normaliser[:, None]
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def chunked_logprob_entropy(
    hidden: Tensor,  # [N, H] final hidden states that predict `tokens`
    weight: Tensor,  # [V, H] the LM head
    tokens: Tensor,  # [N] the tokens whose log-probs are wanted
    bias: Tensor | None = None,  # [V]
    temperature: float = 1.0,
    chunk_elements: int = CHUNK_ELEMENTS,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """(log p(token), entropy) per position, each [N] float32, equal to log_softmax over the
    full logits / temperature, with at most `chunk_elements` logits alive at a time; the
    entropy is None when `with_entropy` is false (the reference and old policies need none)."""
    size = max(1, chunk_elements // weight.shape[0])
    keep_graph = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], size):
        args = (hidden[start : start + size], weight, bias, tokens[start : start + size])
        if keep_graph:
            logp, entropy = checkpoint(
                _chunk_logprob_entropy, *args, temperature, with_entropy, use_reentrant=False
            )
        else:
            logp, entropy = _chunk_logprob_entropy(*args, temperature, with_entropy)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:  # no tokens
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_entropy else None
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None


def plain_logprob_entropy(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The same from full logits [..., V] in one piece: the reference the chunked path is
    tested against, and the path for heads that are not a plain linear layer."""
    logits = logits.float()
    log_probs = torch.log_softmax(logits / temperature if temperature != 1 else logits, -1)
    logp = log_probs.gather(-1, tokens[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy
