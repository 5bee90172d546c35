"""LoRA and vLLM: push merged weights after each step, or hand vLLM the adapter (LoRARequest)?

    .venv/bin/python scripts/bench_lora_sync.py [--steps 6] [--rank 16]

Runs each way in a process of its own on SmolLM2-135M with rank-`--rank` adapters on every
linear layer, the default demo's batch (4 prompts x 4 samples x <= 48 tokens, bfloat16 engine),
and changes the adapters before every step as an optimiser step would:
- merged: rlcli's path. W + (alpha/r)BA for every adapted matrix goes into the engine
  (`reload_weights`), then the batch is sampled from plain weights.
- adapter: the engine starts with `enable_lora=True`; each step saves the adapters (PEFT
  files) and samples with a new `LoRARequest`, which vLLM loads and applies at every layer.
Prints, per way, the median and range of each phase and of their sum over the counted steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def setup(rank: int):
    from rlcli.data import load_splits
    from rlcli.data.problems import render_prompt
    from rlcli.runtime.lora import add_adapters
    from rlcli.runtime.models import load_causal_lm, load_tokenizer, resolve_model_path
    from rlcli.validate import compose

    cfg = compose([f"model.lora.rank={rank}"])
    path = resolve_model_path(cfg.model, 0)
    tokenizer = load_tokenizer(path)
    policy = load_causal_lm(path, "float32", torch.device("cpu"))
    add_adapters(policy, cfg.model.lora)
    train, _ = load_splits(cfg.data)
    prompts = [render_prompt(tokenizer, p.question, cfg.data.system_prompt) for p in train[:4]]
    return cfg, path, policy, prompts


def nudge(policy, step: int) -> None:
    """A change of every adapter, as an optimiser step makes (B starts at 0: no change)."""
    generator = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 1e-3)


def run(way: str, steps: int, rank: int) -> dict[str, list[float]]:
    from vllm import SamplingParams

    cfg, path, policy, prompts = setup(rank)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=cfg.sampler.max_new_tokens, seed=0)
    times: dict[str, list[float]] = {}
    if way == "merged":
        from rlcli.rollout.vllm_engine import _load_weights, engine
        from rlcli.runtime.lora import sampler_weights

        llm = engine(path, "bfloat16", cfg.sampler, torch.device("cpu"))
    else:
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        s = cfg.sampler
        llm = LLM(model=path, dtype="bfloat16", max_model_len=s.max_model_len,
                  enforce_eager=True, enable_prefix_caching=True,
                  kv_cache_memory_bytes=int(s.cpu_kv_cache_gb * 2**30),
                  enable_lora=True, max_lora_rank=rank, max_loras=1)  # fmt: skip
        folder = Path(tempfile.mkdtemp(prefix="rlcli-lora-"))
    for step in range(steps + 1):  # the first is not counted
        nudge(policy, step)
        begin = time.perf_counter()
        if way == "merged":
            llm.collective_rpc(_load_weights, args=(sampler_weights(policy),))
            llm.reset_prefix_cache()
            request = None
        else:
            policy.save_pretrained(folder / f"step_{step}")
            request = LoRARequest(f"step_{step}", step + 1, str(folder / f"step_{step}"))
        ready = time.perf_counter()
        outs = llm.generate(prompts, params, lora_request=request, use_tqdm=False)
        done = time.perf_counter()
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        if step:
            for key, value in (("push", ready - begin), ("generate", done - ready),
                               ("total", done - begin), ("tokens", tokens)):  # fmt: skip
                times.setdefault(key, []).append(value)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--way", choices=["merged", "adapter"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:  # one way, in this process: print its times as JSON
        print("RESULT " + json.dumps(run(args.way, args.steps, args.rank)))
        return
    for way in ("merged", "adapter"):
        out = subprocess.run(
            [sys.executable, __file__, "--way", way, f"--steps={args.steps}",
             f"--rank={args.rank}"], capture_output=True, text=True,
        )  # fmt: skip
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{way}: failed\n{out.stderr[-3000:]}")
            continue
        times = json.loads(line.removeprefix("RESULT "))
        cells = [
            f"{k} {statistics.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})"
            for k, v in times.items()
            if k != "tokens"
        ]
        print(f"{way:8s} " + ", ".join(cells) + f"; tokens/step {statistics.mean(times['tokens'])}")


if __name__ == "__main__":
    main()
