"""Log-probs of chosen tokens and the entropy of each prediction, computed a chunk of tokens at
a time so that the [tokens, vocabulary] logits never exist for the whole batch at once.

With vocabularies of 49k-150k entries the full-batch logits (and their log-softmax, and the
gradient of both) are the learner's largest tensors by far: 4 x 8 sequences of 1,000 tokens
over 150k entries is 18 GiB in float32. Here each chunk's logits are made, reduced to two
numbers per token and dropped; the backward pass remakes them (`_ChunkedHead`).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

# Logit elements per chunk, by device type. CPU: 2^24 float32 (64 MiB), 341 tokens at SmolLM2's
# 49,152 entries, chunks that stay near the caches. CUDA: 2^28 (1 GiB), 1,766 tokens at Qwen's
# 151,936: every chunk adds its [V, H] weight-gradient product into the float32 sum, a pass over
# 2.3 GB of memory at Qwen2.5-1.5B's size, so a 16k-token pass in 110-row chunks spent more time
# there than in the head's matmuls (docs/performance.md, "A roofline model of the GPU step").
CHUNK_ELEMENTS = {"cpu": 2**24, "cuda": 2**28}


def chunk_elements_for(device: torch.device) -> int:
    """Logit elements per chunk on `device` (other accelerators take CUDA's size)."""
    return CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"])


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the head's matmuls run in: autocast's when it is on (as for any linear
    layer), else the inputs' own."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _scaled(products: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """A chunk's logits / temperature from its products `hidden @ weight.T`, in float32
    (float64 for float64 inputs)."""
    logits = products.to(torch.promote_types(products.dtype, torch.float32))
    if bias is not None:
        logits += bias.to(logits.dtype)
    if temperature != 1.0:
        logits /= temperature
    return logits


def chunk_statistics(products, bias, tokens, temperature: float, with_entropy: bool):
    """(z[token], logsumexp(z), entropy or None) per row of one chunk, z its scaled logits."""
    z = _scaled(products, bias, temperature)
    normaliser = torch.logsumexp(z, dim=-1)
    picked = z.gather(-1, tokens[:, None]).squeeze(-1)
    # H = logsumexp(z) - sum softmax(z) * z
    entropy = normaliser - (torch.softmax(z, -1) * z).sum(-1) if with_entropy else None
    return picked, normaliser, entropy


def chunk_logit_gradient(
    products, bias, tokens, temperature: float, normaliser, entropy, g_logp, g_entropy, dtype
):
    """The gradient of the loss with respect to one chunk's logits (before / temperature), in
    `dtype` for the two matmuls that read it, and its sum over rows (the bias's share, float32)
    when there is a bias. g_logp, normaliser [rows, 1]; entropy, g_entropy [rows, 1] or None."""
    log_p = _scaled(products, bias, temperature).sub_(normaliser)
    if g_entropy is not None:
        # -p * (g_logp + g_H (log p + H)), formed in log_p's memory
        factor = log_p.add(entropy).mul_(g_entropy)
        grad_z = factor.add_(g_logp).mul_(log_p.exp_()).neg_()
    else:
        grad_z = log_p.exp_().mul_(g_logp).neg_()
    grad_z.scatter_add_(-1, tokens[:, None], g_logp)
    if temperature != 1.0:
        grad_z /= temperature
    bias_part = grad_z.sum(0) if bias is not None else None
    return grad_z.to(dtype), bias_part


# The two functions compiled (`fused=True`): each chunk's element-wise work and reductions in a
# few kernels that read the [rows, vocabulary] products once or twice, instead of one kernel
# and one pass over them per operator. Made on first use (compiling costs seconds). The rows
# of a pass's last chunk vary from pass to pass: PyTorch compiles a second, shape-generic
# graph at the first change, rather than one graph per row count.
@functools.cache
def _compiled(fn):
    return torch.compile(fn)


class _ChunkedHead(torch.autograd.Function):
    """(log p(token), entropy) per row of `hidden`, chunk by chunk, with a hand-written backward.

    With z the logits / T, log p = z - logsumexp(z) and H = -sum p log p, the gradient of a
    loss L with respect to z_j is  g_logp * (1[j = token] - p_j) - g_H * p_j (log p_j + H),
    then divided by T. The backward remakes a chunk's logits from the saved inputs and the
    per-row logsumexp and entropy, and turns that gradient into those of hidden, weight and bias.
    So the memory held between the passes is the inputs and two numbers per token, and each
    chunk's logits are walked a handful of times rather than once per op of a generic autograd
    graph.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, rows, with_entropy, fused):
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, no work
        dtype = _matmul_dtype(hidden, weight)
        w = weight.to(dtype)
        statistics = _compiled(chunk_statistics) if fused else chunk_statistics
        logps, normalisers, entropies = [], [], []
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], rows):
                part = slice(start, start + rows)
                products = hidden[part].to(dtype) @ w.T
                picked, normaliser, entropy = statistics(
                    products, bias, tokens[part], temperature, with_entropy
                )
                logps.append(picked)
                normalisers.append(normaliser)
                entropies.append(entropy)
        normaliser = torch.cat(normalisers)
        logp = torch.cat(logps) - normaliser
        entropy = torch.cat(entropies) if with_entropy else None
        ctx.save_for_backward(hidden, weight, bias, tokens, normaliser, entropy)
        ctx.settings = (temperature, rows, dtype, fused)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, tokens, normaliser, entropy = ctx.saved_tensors
        temperature, rows, dtype, fused = ctx.settings
        w = weight.to(dtype)
        gradient = _compiled(chunk_logit_gradient) if fused else chunk_logit_gradient
        # A frozen head (LoRA) or frozen hidden states get no gradient and cost no matmul.
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        wants_weight = ctx.needs_input_grad[1]
        # Summed over chunks in float32 at least (float64 for float64 weights).
        wide = torch.promote_types(weight.dtype, torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=wide) if wants_weight else None
        wants_bias = bias is not None and ctx.needs_input_grad[2]
        grad_bias = torch.zeros_like(bias, dtype=wide) if wants_bias else None
        if grad_logp is None:
            grad_logp = torch.zeros_like(normaliser)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], rows):
                part = slice(start, start + rows)
                h = hidden[part].to(dtype)
                grad_z, bias_part = gradient(
                    h @ w.T,
                    bias,
                    tokens[part],
                    temperature,
                    normaliser[part, None],
                    None if grad_entropy is None else entropy[part, None],
                    grad_logp[part, None],
                    None if grad_entropy is None else grad_entropy[part, None],
                    dtype,
                )
                if grad_bias is not None:
                    grad_bias += bias_part
                if grad_hidden is not None:
                    grad_hidden[part] = grad_z @ w
                if grad_weight is not None:
                    grad_weight.add_(grad_z.T @ h)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def chunked_logprob_entropy(
    hidden: Tensor,  # [N, H] final hidden states that predict `tokens`
    weight: Tensor,  # [V, H] the LM head
    tokens: Tensor,  # [N] the tokens whose log-probs are wanted
    bias: Tensor | None = None,  # [V]
    temperature: float = 1.0,
    chunk_elements: int | None = None,
    with_entropy: bool = True,
    fused: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log p(token), entropy) per position, each [N] float32, equal to log_softmax over the
    full logits / temperature, with at most `chunk_elements` logits alive at a time (None: the
    device's `chunk_elements_for`); the entropy is None when `with_entropy` is false (the
    reference and old policies need none). `fused`: each chunk's element-wise work compiled
    (`torch.compile`) into a few kernels, the same numbers up to rounding."""
    if hidden.shape[0] == 0:  # no tokens
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_entropy else None
    chunk_elements = chunk_elements or chunk_elements_for(hidden.device)
    rows = max(1, chunk_elements // weight.shape[0])
    return _ChunkedHead.apply(hidden, weight, bias, tokens, temperature, rows, with_entropy, fused)


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
