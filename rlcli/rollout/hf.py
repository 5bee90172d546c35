"""The transformers sampler: `generate` on the learner's own weights (`sampler=hf`)."""

from __future__ import annotations

import contextlib

import torch

from rlcli.env.episode import Turn
from rlcli.rollout.batch import Rollout, eos_token_ids, response_mask_from
from rlcli.rollout.contract import Sampler


class HFSampler(Sampler):
    """Samples with `model.generate` on the learner's own weights, so it never needs a sync."""

    # Nothing for a checkpoint to keep (the base's `state_dict`): sampling draws from torch's
    # generator, which checkpoints save.

    @property
    def device(self):
        return self.model.device

    def sync(self, policy) -> None:
        """Nothing to push: generate() runs on the policy being trained."""

    def __init__(
        self,
        model,
        tokenizer,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        gather=None,
        *,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
    ):
        # `gather()`: a context in which a sharded model's own weights are whole (torchrun).
        self.gather = gather or contextlib.nullcontext
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        # sampler.top_k's -1 means off, as 0 does; transformers takes only 0.
        self.top_k, self.min_p = max(top_k, 0), min_p
        self.repetition_penalty = repetition_penalty
        self.eos_ids = eos_token_ids(tokenizer, model)

    def _sampling(self, temperature: float | None, top_p: float | None) -> dict:
        """generate()'s sampling arguments, each given even when off: a model's own
        generation_config.json (top_k 50 by transformers' default; some set a repetition
        penalty) must not change what rlcli samples."""
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        if temperature == 0:  # the policy's argmax (evaluation's accuracy): nothing reshapes it
            return {"do_sample": False, "repetition_penalty": 1.0}
        return {
            "do_sample": True,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }

    @contextlib.contextmanager
    def seeded(self, seed: int | None = None):
        """Draws from the global generator, or from `seed` leaving it as it was."""
        devices = [self.model.device.index or 0] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            yield

    @torch.no_grad()
    def turns(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        stop: list[str],
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[Turn]:
        """One reply per token context (left-padded together), each cut at its budget, its
        first EOS or the end of its first `stop` string (an episode's next turn)."""
        pad, width = self.tokenizer.pad_token_id, max(len(c) for c in contexts)
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        with self.gather():
            out = self.model.generate(
                input_ids=ids.to(self.model.device),
                attention_mask=mask.to(self.model.device),
                **self._sampling(temperature, top_p),
                max_new_tokens=max(budgets),
                pad_token_id=pad,
                eos_token_id=sorted(self.eos_ids),
                stop_strings=stop,
                tokenizer=self.tokenizer,
            )
        rows = out[:, width:].tolist()
        return [self._cut(row, b, stop) for row, b in zip(rows, budgets, strict=True)]

    def _cut(self, row: list[int], budget: int, stop: list[str]) -> Turn:
        """The turn in a generated row: up to its first EOS, or the shortest prefix whose text
        holds a stop string (found by bisection: holding one only grows with the prefix)."""
        eos = next((i + 1 for i, t in enumerate(row) if t in self.eos_ids), None)
        row = row[: min(eos or budget, budget)]

        def holds(n: int) -> bool:
            text = self.tokenizer.decode(row[:n])
            return any(s in text for s in stop)

        if holds(len(row)):
            low, high = 1, len(row)
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if holds(mid) else (mid + 1, high)
            return Turn(row[:low], None, "call")
        return Turn(row, None, "eos" if eos is not None and eos <= budget else "length")

    @torch.no_grad()
    def sample(
        self,
        prompts: list[str],
        group_size: int,
        prompt_ids: list[str],
        answers: list[str],
        temperature: float | None = None,
        seed: int | None = None,
        top_p: float | None = None,
    ) -> Rollout:
        """`group_size` responses per prompt; `temperature` (0 = greedy), `seed` and `top_p`
        replace the training ones for one call (evaluation), leaving the global generator as it
        was."""
        enc = self.tokenizer(
            prompts,
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            padding_side="left",
        )
        enc = enc.to(self.model.device)
        with self.gather(), self.seeded(seed):
            out = self.model.generate(
                **enc,
                **self._sampling(temperature, top_p),
                max_new_tokens=self.max_new_tokens,
                num_return_sequences=group_size,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=sorted(self.eos_ids),
            )
        width = enc.input_ids.shape[1]
        response = out[:, width:]
        response_mask, truncated = response_mask_from(response, self.eos_ids)
        prompt_mask = enc.attention_mask.repeat_interleave(group_size, 0)
        return Rollout(
            input_ids=out,
            attention_mask=torch.cat([prompt_mask, response_mask], 1),
            response_mask=response_mask,
            prompt_width=width,
            texts=self.tokenizer.batch_decode(response, skip_special_tokens=True),
            truncated=truncated.cpu(),
            prompt_ids=[p for p in prompt_ids for _ in range(group_size)],
            answers=[a for a in answers for _ in range(group_size)],
        )
