"""The batch that passes from sampler to reward to learner, and the transformers sampler.

Layout of every tensor batch (B = prompts x group size responses):
prompts are left-padded to a common width P and responses right-padded to a width T, so
`input_ids[:, P:]` are the response tokens and `response_mask` marks the ones that count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlcli.config import ConfigError, SamplerConfig


@dataclass
class Rollout:
    """Sampled responses for one step. Shapes: B responses, P prompt width, T response width."""

    input_ids: Tensor  # [B, P+T] left-padded prompt, then right-padded response
    attention_mask: Tensor  # [B, P+T] 1 on real prompt and response tokens
    response_mask: Tensor  # [B, T] 1 on response tokens up to and including EOS
    prompt_width: int  # P
    texts: list[str]  # decoded responses, special tokens removed
    truncated: Tensor  # [B] bool: hit max_new_tokens without EOS
    prompt_ids: list[str]  # [B] id of the problem each response answers (a group shares one)
    answers: list[str]  # [B] ground truth of that problem
    # [B, T] log-prob of each response token as the sampler computed it (vLLM); None when the
    # sampler is the learner itself (sampler=hf)
    sampler_logp: Tensor | None = None
    # [B] tool calls each episode made (env=...); None for single-turn sampling. With tools,
    # response_mask is 0 on the tool turns inside a response (attention_mask is 1 there).
    tool_calls: Tensor | None = None
    # What scoring adds for the advantage estimator, by `ops.advantages.AdvantageInputs`
    # field: [B] per response or [B, T] per token, NaN where there is none (a process reward's
    # `step_rewards` at the tokens where steps end, ReMax's `greedy_scores`). Kept with the
    # responses so that shaping's row selection carries them; empty unless one is needed.
    estimator_inputs: dict[str, Tensor] = field(default_factory=dict)
    # [B] each episode's transcript (env=...; `env.episode.Episode.transcript`: its turns,
    # calls and token counts), for samples.jsonl; None for single-turn sampling
    episodes: list[dict] | None = None
    # [B, T] the weight version (pushes of the run's sampler, `WorkerSampler.version`) that
    # sampled each response token, -1 on padding and tool turns; None unless rollout workers
    # label them (sampler.workers, sampler.urls)
    token_versions: Tensor | None = None

    @property
    def finish_reasons(self) -> list[str]:  # why each response ended, in vLLM's words
        return ["length" if t else "stop" for t in self.truncated.tolist()]

    @property
    def response_ids(self) -> Tensor:  # [B, T]
        return self.input_ids[:, self.prompt_width :]

    @property
    def lengths(self) -> Tensor:  # [B]
        return self.response_mask.sum(-1)

    @property
    def spanned_versions(self) -> list[list[int]] | None:
        """The weight versions each response's tokens were sampled by, oldest first; None
        without `token_versions`."""
        if self.token_versions is None:
            return None
        return [sorted(set(row[row >= 0].tolist())) for row in self.token_versions.cpu()]


def rollout_from_tokens(
    prompts: list[list[int]],
    responses: list[list[int]],
    texts: list[str],
    prompt_ids: list[str],
    pad_id: int,
    device,
    answers: list[str] | None = None,
    truncated: list[bool] | None = None,
    sampler_logp: list[list[float]] | None = None,
    own_masks: list[list[int]] | None = None,
    tool_calls: list[int] | None = None,
    episodes: list[dict] | None = None,
    versions: list[list[int]] | None = None,
) -> Rollout:
    """Token lists laid out as a Rollout: prompts left-padded, responses right-padded.
    `own_masks` (multi-turn episodes): 1 on the model's tokens, 0 on tool turns; `versions`:
    the weight version of each response token (-1 on tool turns)."""
    width = max(len(p) for p in prompts)
    span = max(max(len(r) for r in responses), 1)
    n = len(responses)
    input_ids = torch.full((n, width + span), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width + span), dtype=torch.long)
    logp = torch.zeros((n, span))
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        input_ids[row, width - len(prompt) : width] = torch.tensor(prompt, dtype=torch.long)
        input_ids[row, width : width + len(response)] = torch.tensor(response, dtype=torch.long)
        attention_mask[row, width - len(prompt) : width + len(response)] = 1
        if sampler_logp is not None:
            logp[row, : len(response)] = torch.tensor(sampler_logp[row])
    response_mask = attention_mask[:, width:].clone()
    for row, own in enumerate(own_masks or []):
        response_mask[row, : len(own)] = torch.tensor(own, dtype=torch.long)
    token_versions = None
    if versions is not None:
        token_versions = torch.full((n, span), -1, dtype=torch.long)
        for row, labels in enumerate(versions):
            token_versions[row, : len(labels)] = torch.tensor(labels, dtype=torch.long)
        token_versions = token_versions.to(device)
    return Rollout(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        response_mask=response_mask.to(device),
        prompt_width=width,
        texts=texts,
        truncated=torch.tensor(truncated if truncated is not None else [False] * n),
        prompt_ids=prompt_ids,
        answers=answers if answers is not None else [""] * n,
        sampler_logp=None if sampler_logp is None else logp.to(device),
        tool_calls=None if tool_calls is None else torch.tensor(tool_calls),
        episodes=episodes,
        token_versions=token_versions,
    )


def response_mask_from(tokens: Tensor, eos_ids: set[int]) -> tuple[Tensor, Tensor]:
    """Mask of response tokens up to and including the first EOS; and which never hit EOS."""
    is_eos = torch.zeros_like(tokens, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= tokens == eos
    # Tokens strictly after the first EOS are padding: cumulative count of EOS seen before them.
    seen_before = (is_eos.cumsum(-1) - is_eos.long()) > 0
    return (~seen_before).long(), ~is_eos.any(-1)


def eos_token_ids(tokenizer, model) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids]) - {None}
    return ids | {tokenizer.eos_token_id}


def _pad_to(x: Tensor, width: int, value: float, left: bool) -> Tensor:
    pad = width - x.shape[1]
    if pad == 0:
        return x
    filler = torch.full((x.shape[0], pad), value, dtype=x.dtype, device=x.device)
    return torch.cat([filler, x] if left else [x, filler], 1)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Join rollouts sampled separately, re-padding prompts (left) and responses (right)."""
    if len(parts) == 1:
        return parts[0]
    p = max(r.prompt_width for r in parts)
    t = max(r.response_mask.shape[1] for r in parts)

    def join(get, prompt_value, response_value):
        return torch.cat(
            [
                torch.cat(
                    [
                        _pad_to(get(r)[:, : r.prompt_width], p, prompt_value, left=True),
                        _pad_to(get(r)[:, r.prompt_width :], t, response_value, left=False),
                    ],
                    1,
                )
                for r in parts
            ]
        )

    return Rollout(
        input_ids=join(lambda r: r.input_ids, pad_id, pad_id),
        attention_mask=join(lambda r: r.attention_mask, 0, 0),
        response_mask=torch.cat([_pad_to(r.response_mask, t, 0, left=False) for r in parts]),
        prompt_width=p,
        texts=[x for r in parts for x in r.texts],
        truncated=torch.cat([r.truncated for r in parts]),
        prompt_ids=[x for r in parts for x in r.prompt_ids],
        answers=[x for r in parts for x in r.answers],
        sampler_logp=None
        if parts[0].sampler_logp is None
        else torch.cat([_pad_to(r.sampler_logp, t, 0, left=False) for r in parts]),
        tool_calls=None
        if parts[0].tool_calls is None
        else torch.cat([r.tool_calls for r in parts]),
        estimator_inputs={
            name: torch.cat([_response_width(r.estimator_inputs[name], t) for r in parts])
            for name in parts[0].estimator_inputs
        },
        episodes=None if parts[0].episodes is None else [x for r in parts for x in r.episodes],
        token_versions=None
        if any(r.token_versions is None for r in parts)
        else torch.cat([_pad_to(r.token_versions, t, -1, left=False) for r in parts]),
    )


def _response_width(value: Tensor, t: int) -> Tensor:
    """A per-token estimator input padded with NaN to `t` response tokens; a per-response one
    as it is."""
    return _pad_to(value, t, math.nan, left=False) if value.dim() == 2 else value


def select_rows(batch: Rollout, rows: list[int]) -> Rollout:
    """The responses at `rows`, in that order (repeats allowed: DUPO duplicates groups)."""
    index = torch.tensor(rows, dtype=torch.long)
    dev = index.to(batch.input_ids.device)
    return Rollout(
        input_ids=batch.input_ids[dev],
        attention_mask=batch.attention_mask[dev],
        response_mask=batch.response_mask[dev],
        prompt_width=batch.prompt_width,
        texts=[batch.texts[i] for i in rows],
        truncated=batch.truncated[index],
        prompt_ids=[batch.prompt_ids[i] for i in rows],
        answers=[batch.answers[i] for i in rows],
        sampler_logp=None if batch.sampler_logp is None else batch.sampler_logp[dev],
        tool_calls=None if batch.tool_calls is None else batch.tool_calls[index],
        estimator_inputs={k: v[index.to(v.device)] for k, v in batch.estimator_inputs.items()},
        episodes=None if batch.episodes is None else [batch.episodes[i] for i in rows],
        token_versions=None if batch.token_versions is None else batch.token_versions[dev],
    )


def encode_prompts(
    tokenizer, prompts: list[str], cfg: SamplerConfig, budget: tuple[str, int] | None = None
) -> list[list[int]]:
    """The token ids a vLLM engine samples from, each checked to fit its context with room
    for the response: `budget` (its key, its tokens), by default sampler.max_new_tokens (a
    multi-turn episode passes env.max_tokens)."""
    key, tokens = budget or ("sampler.max_new_tokens", cfg.max_new_tokens)
    encoded = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    for ids in encoded:
        if len(ids) + tokens > cfg.max_model_len:
            raise ConfigError(
                f"A prompt of {len(ids)} tokens plus {key}={tokens} exceeds "
                f"sampler.max_model_len={cfg.max_model_len}; raise sampler.max_model_len, "
                f"lower {key} or shorten the prompts."
            )
    return encoded
