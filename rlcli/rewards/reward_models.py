"""Learned rewards: an outcome reward model (ORM) and a process reward model (PRM).

- `OutcomeRewardModel` scores a whole response with a sequence-classification model.
- `ProcessRewardModel` scores each reasoning step with a token-classification model, read at
  a step tag inserted after every step (Qwen2.5-Math-PRM's `<extra_0>` convention).
- `split_steps`, `token_index_at_char` and `step_reward_tensors` turn the PRM's per-step
  scores, which live in character offsets of the response text, into the per-token
  `step_rewards` / `step_end_mask` that `ops.advantages.grpo_process_advantages` takes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcli.config import ConfigError
from rlcli.runtime.models import check_model_path, load_pretrained, load_tokenizer

_KEY = "reward.model_path"  # the config field both models are loaded from


def _load_frozen(auto_class, path: str, device: torch.device, dtype: str):
    """A model and its tokenizer, frozen, set up so a row scores the same alone or batched;
    a path or hub id that holds no readable model is a ConfigError naming reward.model_path."""
    path = check_model_path(path, _KEY)
    tokenizer = load_tokenizer(path, _KEY)  # a tokenizer with no padding token pads with EOS
    # Right padding: a causal model never attends to the padding after a row, and positions
    # need no correction. Left truncation: keep the end of the response.
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    model = load_pretrained(
        auto_class, path, _KEY, "the reward model", dtype=getattr(torch, dtype)
    ).to(device)
    # Sequence-classification heads read the rightmost token that is not config.pad_token_id:
    # that must be the id we pad with, or a padded row is read at a padding position.
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.eval().requires_grad_(False)
    return model, tokenizer


def _render(tokenizer, question: str, response: str) -> str:
    """What both models see: the conversation [user: question, assistant: response] rendered
    with their own chat template when they have one, else `question + "\\n\\n" + response`."""
    if not tokenizer.chat_template:
        return question + "\n\n" + response
    messages = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": response},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _encode(tokenizer, texts: list[str], max_length: int, device: torch.device):
    """`texts` tokenized and truncated from the left (the tokenizer's truncation side, set at
    load) to `max_length` tokens, so the end of the response, which matters most, is kept."""
    # A chat template writes its own BOS; plain text gets the tokenizer's special tokens
    # (added after truncation, so a left cut never removes them).
    return tokenizer(
        texts,
        add_special_tokens=not tokenizer.chat_template,
        truncation=True,
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    ).to(device)


class OutcomeRewardModel:
    """One score per (question, response): the logit of a 1-label head, else P(last label)."""

    def __init__(
        self, path: str, device: torch.device, dtype: str, batch_size: int, max_length: int
    ):
        from transformers import AutoModelForSequenceClassification

        self.model, self.tokenizer = _load_frozen(
            AutoModelForSequenceClassification, path, device, dtype
        )
        self.device, self.batch_size, self.max_length = device, batch_size, max_length

    @torch.no_grad()
    def score(self, questions: list[str], responses: list[str]) -> list[float]:
        texts = [_render(self.tokenizer, q, r) for q, r in zip(questions, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = _encode(
                self.tokenizer, texts[start : start + self.batch_size], self.max_length, self.device
            )
            logits = self.model(**batch).logits.float()  # [b, num_labels]
            if logits.shape[-1] == 1:
                scores += logits[:, 0].tolist()
            else:
                scores += logits.softmax(-1)[:, -1].tolist()
        return scores


class ProcessRewardModel:
    """Scores every step of a response: P(last label) at the step tag after it (a sigmoid of
    the logit for a 1-label head).

    The assistant turn the PRM sees is `step_1 + tag + step_2 + tag + ...`, the steps being
    the non-empty pieces of the response between `step_separator`s, stripped of surrounding
    whitespace, and of any copy of the tag so that every tag in the input marks a step end.
    """

    def __init__(
        self,
        path: str,
        device: torch.device,
        dtype: str,
        batch_size: int,
        max_length: int,
        step_separator: str,
        step_tag: str,
    ):
        from transformers import AutoModelForTokenClassification

        self.model, self.tokenizer = _load_frozen(
            AutoModelForTokenClassification, path, device, dtype
        )
        tag_ids = self.tokenizer.encode(step_tag, add_special_tokens=False)
        if len(tag_ids) != 1:
            raise ConfigError(
                f"reward.step_tag={step_tag!r} is not a single token of the process reward "
                f"model {path} (it encodes to {len(tag_ids)} tokens), so step scores cannot be "
                "read at it. Set reward.step_tag to the step token that model was trained with "
                "(e.g. '<extra_0>' for Qwen2.5-Math-PRM)."
            )
        self.tag, self.tag_id = step_tag, tag_ids[0]
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self.step_separator = step_separator

    def _text(self, question: str, response: str, spans: list[tuple[int, int]]) -> str:
        steps = "".join(response[a:b].replace(self.tag, "") + self.tag for a, b in spans)
        return _render(self.tokenizer, question.replace(self.tag, ""), steps)

    @torch.no_grad()
    def score_steps(
        self, questions: list[str], responses: list[str]
    ) -> list[list[tuple[int, float]]]:
        """For each response, `(char_end, score)` per step, `char_end` being the offset in the
        response where the step's text ends.

        When left truncation cut off the tags of early steps, only the steps whose tag is
        still in the input are scored: those steps are missing from the list, which keeps its
        last entries (the response's end is never cut).
        """
        spans = [split_steps(r, self.step_separator) for r in responses]
        texts = [self._text(q, r, s) for q, r, s in zip(questions, responses, spans, strict=True)]
        results: list[list[tuple[int, float]]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = _encode(
                self.tokenizer, texts[start : start + self.batch_size], self.max_length, self.device
            )
            logits = self.model(**batch).logits.float()  # [b, L, num_labels]
            if logits.shape[-1] == 1:
                probs = logits[..., 0].sigmoid()  # [b, L]
            else:
                probs = logits.softmax(-1)[..., -1]  # [b, L]
            at_tag = (batch.input_ids == self.tag_id) & batch.attention_mask.bool()
            for row, row_spans in enumerate(spans[start : start + self.batch_size]):
                tag_scores = probs[row][at_tag[row]].tolist()
                kept = min(len(tag_scores), len(row_spans))  # the last `kept` steps survive
                ends = [end for _, end in row_spans[len(row_spans) - kept :]]
                results.append(list(zip(ends, tag_scores[len(tag_scores) - kept :], strict=True)))
        return results


def split_steps(response: str, separator: str) -> list[tuple[int, int]]:
    """`(start, end)` character spans of the steps of `response`, split at `separator`.

    Whitespace around a step is not part of its span; empty or whitespace-only pieces (from
    leading, trailing or repeated separators) are no steps.
    """
    if not separator:
        raise ValueError("the step separator must not be empty")
    spans, offset = [], 0
    for piece in response.split(separator):
        content = piece.strip()
        if content:
            start = offset + len(piece) - len(piece.lstrip())
            spans.append((start, start + len(content)))
        offset += len(piece) + len(separator)
    return spans


def token_index_at_char(tokenizer, token_ids: list[int], char_end: int) -> int:
    """Index of the token whose decoded text holds character `char_end - 1`: the token where
    a step ending at `char_end` of the decoded response ends.

    Binary search for the shortest prefix whose decoded text (skip_special_tokens, as the
    response text was made) reaches `char_end` characters: O(log T) decodes. Offsets past
    the end give the last token.
    """
    if not token_ids:
        raise ValueError("no tokens to search")
    lo, hi = 0, len(token_ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(token_ids[: mid + 1], skip_special_tokens=True)) >= char_end:
            hi = mid
        else:
            lo = mid + 1
    return lo


def step_reward_tensors(
    tokenizer, response_ids: Tensor, response_mask: Tensor, step_scores: list[list[tuple]]
) -> tuple[Tensor, Tensor]:
    """Place each step's score at the response token where the step ends.

    response_ids, response_mask: ``[B, T]``; step_scores: per row, `(char_end, score)` as
    `ProcessRewardModel.score_steps` gives them for the decoded response texts ->
    (step_rewards ``[B, T]`` float32, step_end_mask ``[B, T]`` bool, True only inside the
    mask). Two steps ending in the same token keep the later step's score.
    """
    step_rewards = torch.zeros(response_ids.shape, dtype=torch.float32, device=response_ids.device)
    step_end_mask = torch.zeros(response_ids.shape, dtype=torch.bool, device=response_ids.device)
    for row, steps in enumerate(step_scores):
        positions = response_mask[row].nonzero().squeeze(-1)  # [n] columns of response tokens
        if positions.numel() == 0:
            continue
        ids = response_ids[row, positions].tolist()
        for char_end, score in steps:
            col = positions[token_index_at_char(tokenizer, ids, char_end)]
            step_rewards[row, col], step_end_mask[row, col] = score, True
    return step_rewards, step_end_mask
