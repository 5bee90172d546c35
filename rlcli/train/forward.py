"""The learner's forward pass: a `Pass` (`passes.py`) through a causal LM to the log-probs of
its response tokens and the entropy of each prediction, for the policy's passes in `learner.learn`
and the reference's and old policy's in `batch_logprobs`.

The LM's body runs once over the pass; its head goes through `ops.logprobs`' chunked
log-softmax over the predicting positions only, so the [tokens, vocabulary] logits of a pass
never exist at once (heads that are more than a linear layer take the plain path).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlcli.ops.logprobs import chunked_logprob_entropy, plain_logprob_entropy
from rlcli.rollout.batch import Rollout
from rlcli.train.passes import Pass, micro_batches, passes


class TokenLogprobModel(nn.Module):
    """A causal LM whose forward returns the log-probs (and entropies) of given response tokens.

    The learner calls the policy through this module: the chunked head reads the LM head's
    weight outside the Hugging Face forward, and FSDP2 gathers a module's parameters only in
    that module's own forward, so under torchrun this wrapper is the sharded root
    (`distributed.shard`). Its forward is `lm_token_logprobs`.
    """

    def __init__(self, lm: nn.Module, fused_head: bool = False):
        super().__init__()
        self.lm = lm
        self.fused_head = fused_head  # the head's chunks compiled (`trainer.compile`)

    def forward(self, inputs: Pass, with_entropy=False, temperature=1.0):
        logp, entropy = lm_token_logprobs(
            self.lm, inputs, with_entropy, temperature, self.fused_head
        )
        # Fresh tensors, not views: FSDP2 hooks the root's outputs for its backward.
        return logp.clone(), None if entropy is None else entropy.clone()

    def warm_up(self) -> None:
        """A forward over two tokens (FSDP2 sets itself up on the root's first forward)."""
        ids = torch.zeros(
            1, 2, dtype=torch.long, device=self.lm.get_input_embeddings().weight.device
        )
        self(Pass.padded(ids, torch.ones_like(ids), 1))


def pass_logprobs(model, inputs: Pass, with_entropy=False, temperature=1.0):
    """`lm_token_logprobs` of a causal LM, or of the LM inside a `TokenLogprobModel`."""
    if isinstance(model, TokenLogprobModel):
        return model(inputs, with_entropy, temperature)
    return lm_token_logprobs(model, inputs, with_entropy, temperature)


def token_logprobs(
    model, input_ids, attention_mask, prompt_width, with_entropy=False, temperature=1.0
):
    """`pass_logprobs` of rows in the padded layout (prompts left-padded to `prompt_width`)."""
    inputs = Pass.padded(input_ids, attention_mask, prompt_width)
    return pass_logprobs(model, inputs, with_entropy, temperature)


def attention_of(model) -> str | None:
    """The attention implementation transformers runs `model` (or the LM it wraps) with."""
    lm = model.lm if isinstance(model, TokenLogprobModel) else model
    return getattr(lm.config, "_attn_implementation", None)


# Config fields of heads that are more than `hidden @ weight.T + bias` (Gemma's soft-capping,
# Cohere's and Granite's logit scales): such models take the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def lm_token_logprobs(lm, inputs: Pass, with_entropy=False, temperature=1.0, fused_head=False):
    """Log-prob of each response token of the pass under `lm`, and each prediction's entropy.

    Logits are divided by the sampling temperature, so log-probs are those of the
    distribution the sampler drew from. The body runs once; the LM head is applied to the
    predicting positions only, a chunk of tokens at a time (`ops.logprobs`), so the
    [tokens, vocabulary] logits of the whole pass never exist at once; `fused_head` compiles
    each chunk's element-wise work. Returns ([b, t], [b, t] or None).
    """
    body = {
        "input_ids": inputs.input_ids,
        "attention_mask": inputs.attention_mask,
        "position_ids": inputs.position_ids,
        "use_cache": False,
    }
    head = lm.get_output_embeddings()
    if not isinstance(head, nn.Linear) or any(
        getattr(lm.config, name, None) for name in _LOGIT_TRANSFORMS
    ):
        keep = torch.unique(inputs.cols)  # sorted columns that predict a response token
        logits = lm(**body, logits_to_keep=keep).logits  # [R, K, V]
        logits = logits[inputs.rows, torch.searchsorted(keep, inputs.cols)]  # [b, t, V]
        logp, entropy = plain_logprob_entropy(logits, inputs.tokens, temperature)
        return logp, entropy if with_entropy else None
    hidden = lm.base_model(**body).last_hidden_state[inputs.rows, inputs.cols]  # [b, t, H]
    logp, entropy = chunked_logprob_entropy(
        hidden.reshape(-1, hidden.shape[-1]),
        head.weight,
        inputs.tokens.reshape(-1),
        head.bias,
        temperature,
        with_entropy=with_entropy,
        fused=fused_head,
    )
    tokens = inputs.tokens
    return logp.view_as(tokens), entropy.view_as(tokens) if with_entropy else None


@torch.no_grad()
def per_token_over_batch(fn, batch: Rollout, size: int, max_tokens: int = 0) -> Tensor:
    """`fn(input_ids, attention_mask, prompt_width) -> [b, t]` over the batch in micro-batches."""
    out = torch.zeros(batch.response_mask.shape, device=batch.input_ids.device)
    rows = torch.arange(len(batch.texts), device=batch.input_ids.device)
    for idx, ids, att, width, mask in micro_batches(batch, rows, size, max_tokens):
        out[idx, : mask.shape[1]] = fn(ids, att, width)[:, : mask.shape[1]]
    return out


@torch.no_grad()
def batch_logprobs(
    model,
    batch: Rollout,
    size: int,
    temperature: float = 1.0,
    max_tokens: int = 0,
    share_prompts: bool = True,
) -> Tensor:
    """Log-probs of every response token under `model` (reference or old policy). [B, T]"""
    out = torch.zeros(batch.response_mask.shape, device=batch.input_ids.device)
    rows = torch.arange(len(batch.texts), device=batch.input_ids.device)
    attention = attention_of(model) if share_prompts else None
    for idx, inputs, mask in passes(batch, rows, size, max_tokens, attention):
        t = mask.shape[1]
        out[idx, :t] = pass_logprobs(model, inputs, False, temperature)[0].float()
    return out
