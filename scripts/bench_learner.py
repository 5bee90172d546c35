"""The learner's levers one at a time: seconds of a forward and backward of the default GRPO
batch's shape through SmolLM2-135M (16 rows of 96 tokens, 46 of them response tokens, under
bfloat16 autocast as rlcli trains), with and without each of the speed-ups rlcli uses.

    .venv/bin/python scripts/bench_learner.py              # median (range) of 5 runs each
    .venv/bin/python scripts/bench_learner.py --repeats 9
    .venv/bin/python scripts/bench_learner.py --profile    # where rlcli's pass spends its time

- attention: transformers' eager attention against PyTorch's sdpa kernel;
- gradient checkpointing on and off, and the batch in one pass against four;
- the LM head: rlcli's hand-written backward (`ops.logprobs`) against autograd through the
  same chunks recomputed by `torch.utils.checkpoint` (the code before issue 22);
- AdamW: the fused kernel against the multi-tensor (foreach) one.
Token ids are random: the time of a pass does not depend on which tokens it reads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM

from rlcli.ops.logprobs import chunked_logprob_entropy
from rlcli.runtime.models import resolve_model_path
from rlcli.validate import compose

ROWS, PROMPT, RESPONSE = 16, 50, 46


def timed(fn, repeats: int) -> str:
    fn()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return f"{statistics.median(seconds):.3f} ({min(seconds):.3f}-{max(seconds):.3f})"


def autograd_head(hidden, weight, tokens, chunk_rows=341):
    """The head before issue 22: each chunk's log-softmax under activation checkpointing."""

    def chunk(h, t):
        log_probs = torch.log_softmax((h @ weight.T).float(), -1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, t[:, None]).squeeze(-1), entropy

    parts = [
        checkpoint(
            chunk, hidden[i : i + chunk_rows], tokens[i : i + chunk_rows], use_reentrant=False
        )
        for i in range(0, hidden.shape[0], chunk_rows)
    ]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--profile", action="store_true", help="only PyTorch's profile of rlcli's own pass"
    )
    args = parser.parse_args()
    path = resolve_model_path(compose([]).model, 0)
    torch.manual_seed(0)
    ids = torch.randint(0, 49152, (ROWS, PROMPT + RESPONSE))
    mask = torch.ones_like(ids)
    mask[: ROWS // 2, :5] = 0  # some left padding, as in a batch
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    def model(attention: str, checkpointing: bool):
        lm = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention)
        if checkpointing:
            lm.gradient_checkpointing_enable({"use_reentrant": False})
            lm.train()
        return lm

    def body_pass(lm, passes: int, head=chunked_logprob_entropy):
        def run():
            lm.zero_grad(set_to_none=True)
            for rows in torch.arange(ROWS).tensor_split(passes):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    hidden = lm.model(
                        input_ids=ids[rows],
                        attention_mask=mask[rows],
                        position_ids=positions[rows],
                        use_cache=False,
                    ).last_hidden_state[:, PROMPT - 1 : -1]
                    tokens = ids[rows, PROMPT:].reshape(-1)
                    logp, entropy = head(
                        hidden.reshape(-1, hidden.shape[-1]), lm.lm_head.weight, tokens
                    )
                (logp.sum() + 0.01 * entropy.sum()).backward()

        return run

    if args.profile:  # rlcli's defaults: eager attention, checkpointing, one pass
        run = body_pass(model("eager", True), 1)
        run()
        with torch.profiler.profile() as profile:
            run()
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return
    print("forward + backward of 16 x 96 tokens, seconds: median (range)")
    for attention in ("eager", "sdpa"):
        for checkpointing in (True, False):
            lm = model(attention, checkpointing)
            for passes in (1, 4):
                took = timed(body_pass(lm, passes), args.repeats)
                print(
                    f"  {attention:5s} checkpointing={checkpointing!s:5s} passes={passes}: {took}"
                )
    lm = model("eager", True)
    print("the LM head inside it (eager, checkpointing, one pass):")
    print(f"  hand-written backward: {timed(body_pass(lm, 1), args.repeats)}")
    took = timed(body_pass(lm, 1, autograd_head), args.repeats)
    print(f"  autograd through checkpointed chunks: {took}")
    body_pass(lm, 1)()
    print("AdamW step over SmolLM2's 135M float32 parameters:")
    for kind in ("fused", "foreach"):
        optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-6, **{kind: True})
        print(f"  {kind}: {timed(optimizer.step, args.repeats)}")


if __name__ == "__main__":
    main()
