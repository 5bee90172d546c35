"""Greedy accuracy of a model on the held-out split of a dataset, scored by the reward.

    .venv/bin/python scripts/heldout_accuracy.py [overrides...]
    e.g. scripts/heldout_accuracy.py model.path=runs/dpo/checkpoints/step_20 data.num_test=200

Composes the config `rlcli train OVERRIDES` would run, samples one greedy reply (temperature
0, vLLM) per test problem, scores it with the configured reward, and prints the share of
replies whose reward is above 0.5 (for the 0/1 `math` reward: the share answered correctly).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch

from rlcli.collect.sampling import sample_and_score
from rlcli.data import load_splits
from rlcli.data.problems import PromptRenderer
from rlcli.rewards.scorer import Scorer
from rlcli.rollout.batch import eos_token_ids
from rlcli.rollout.vllm_engine import VLLMSampler
from rlcli.runtime.models import load_causal_lm, load_tokenizer, pick_device, resolve_model_path
from rlcli.validate import compose


def main(overrides: list[str]) -> None:
    cfg = compose(["sampler=vllm", *overrides])
    t = cfg.trainer
    device = pick_device(t.device)
    _, test = load_splits(cfg.data)
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path)
    render = PromptRenderer(tokenizer, cfg.data.system_prompt)  # no tools: env=none
    policy = load_causal_lm(model_path, t.dtype, device, trainable=False)
    greedy = dataclasses.replace(cfg.sampler, temperature=0.0)
    sampler = VLLMSampler(
        model_path, tokenizer, eos_token_ids(tokenizer, policy), greedy, t.dtype, device, t.seed
    )
    scorer = Scorer(cfg.reward, cfg.sampler.max_new_tokens, device, t.dtype)
    start, scores = time.perf_counter(), []
    for first in range(0, len(test), 64):
        chunk = test[first : first + 64]
        _, scored = sample_and_score(sampler, scorer, render, chunk, 1)
        scores.append(scored.total)
    total = torch.cat(scores)
    accuracy = (total > 0.5).float().mean().item()
    print(
        f"{model_path}: held-out accuracy {accuracy:.3f} ({int((total > 0.5).sum())} of "
        f"{len(test)}, greedy, reward={cfg.reward.name}) in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
