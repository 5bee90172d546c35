"""The transformers sampler: `generate` on the learner's own weights (`sampler=hf`)."""

from __future__ import annotations

import contextlib

import torch

from rlcli.rollout.batch import Rollout, eos_token_ids, response_mask_from


class HFSampler:
    """Samples with `model.generate` on the learner's own weights, so it never needs a sync."""

    def sync(self, policy) -> None:
        """Nothing to push: generate() runs on the policy being trained."""

    def state_dict(self) -> dict:
        """Nothing to keep: sampling draws from torch's generator, which checkpoints save."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def __init__(
        self,
        model,
        tokenizer,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        gather=None,
    ):
        # `gather()`: a context in which a sharded model's own weights are whole (torchrun).
        self.gather = gather or contextlib.nullcontext
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.eos_ids = eos_token_ids(tokenizer, model)

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
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        devices = [self.model.device.index or 0] if self.model.device.type == "cuda" else []
        with self.gather(), torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                **enc,
                **(sampling if temperature > 0 else {"do_sample": False}),
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
