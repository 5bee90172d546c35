"""The learner on a CUDA GPU, in one script of a few minutes (GPU machines here have torch,
transformers and peft but no vLLM, so sampling is `sampler=hf`):

1. calibration: the card's bfloat16 matmul rate, copy bandwidth and one layer's attention
   (forward and backward, dense shared-prompt mask and flex_attention's block mask) at the
   reference shape of scripts/roofline.py, which then predicts each configuration below on
   this card;
2. throughput: rlcli's learner (`train.learner.learn` over bfloat16 working weights and
   float32 masters, as rlcli runs on one GPU: no FSDP on one rank) on a model of
   Qwen2.5-1.5B's shape built from its config with random weights (no download), in
   configurations that each turn one of issue 56's levers on or off (`LEVERS`). Each reports
   tokens/s, model FLOP utilisation against the card's bfloat16 peak, peak memory, and the
   roofline's prediction beside the measurement; default also its 10 top kernels;
3. two GRPO steps end to end with `sampler=hf` on the tiny model (a dense reward), and one
   LoRA step;
4. CUDA's loss and gradients against the CPU's on the tiny model (float32), with each lever
   on on the CUDA side against the plain path on the CPU.

    python scripts/gpu_check.py                   # on the GPU: prints GPU CHECK PASSED and JSON
    python scripts/gpu_check.py --device cpu --small   # the same code, tiny shapes, on CPU
    python scripts/gpu_check.py --levers default,compile --shape 3b   # some, another shape
    python scripts/gpu_check.py --no-predict --out r.json --deadline 400   # a GPU lease's run
    python scripts/gpu_check.py --predict-from r.json   # then the predictions, on any machine

Model FLOPs count 6 per parameter per token of useful work (each group's prompt once and its
responses; forward and backward; the LM head on the response tokens only), none for attention
scores or checkpointing's recompute, so the utilisation is a lower bound, and padded's shows
what reading each prompt again costs. `--small` (for CPU and the test suite) swaps the 1.5B
shape for a 2-layer one, runs default, autocast and padded only, and skips the calibration,
the predictions and the CUDA-against-CPU comparison.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import time

import torch

from rlcli.rollout.batch import rollout_from_tokens
from rlcli.runtime.models import adamw
from rlcli.train.forward import TokenLogprobModel
from rlcli.train.learner import UpdatePlan, learn
from rlcli.train.objective_config import objective_from_config
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.train.train_batch import TrainBatch
from rlcli.validate import compose

# Qwen2.5-1.5B's config.json, the fields that set its shape and cost.
QWEN25_15B = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
}
# Qwen2.5-3B's: the same vocabulary, wider and deeper.
QWEN25_3B = {**QWEN25_15B, "hidden_size": 2048, "intermediate_size": 11008,
             "num_hidden_layers": 36, "num_attention_heads": 16}  # fmt: skip
SMALL = {**QWEN25_15B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}  # fmt: skip

# Dense bfloat16 tensor-core peaks from the vendor's data sheets, FLOP/s.
PEAKS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def card_peak(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAKS.items():  # "H100 PCIe" before "H100"
        if all(part in name for part in key.split()):
            return name, peak
    return name, None


def synthetic_batch(vocab: int, prompts: int, group: int, prompt_len: int, response_len: int,
                    device) -> TrainBatch:  # fmt: skip
    """Groups of `group` responses sharing a prompt, random tokens (a pass's cost does not
    depend on which tokens it reads), random advantages."""
    g = torch.Generator().manual_seed(0)
    prompt_tokens, responses = [], []
    for _ in range(prompts):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        for _ in range(group):
            prompt_tokens.append(prompt)
            responses.append(torch.randint(3, vocab, (response_len,), generator=g).tolist())
    n = len(responses)
    rollout = rollout_from_tokens(
        prompt_tokens, responses, [""] * n, [str(i // group) for i in range(n)], 0, device
    )
    advantages = torch.randn(n, generator=g).to(device)
    return TrainBatch(rollout, torch.zeros(n, device=device), advantages)


# What each configuration changes from "default": rlcli on one GPU with the head's chunks sized
# for it and selective recompute, eager (what `auto` picked at this shape on an 80 GB card or
# larger before trainer.compile=auto; compiled, on an H200, it picks `all_no_recompute` but
# for flex_attention). "before" is issue 56's starting point: the CPU's head chunks and full
# recompute.
LEVERS = {
    "default": {},
    "before": {"chunk": "cpu", "recompute": "full"},
    "full_recompute": {"recompute": "full"},
    "no_recompute": {"recompute": "none"},
    "flex_attention": {"attention": "flex_attention"},
    "compile": {"compile": True},
    "all": {"attention": "flex_attention", "compile": True},
    "autocast": {"bf16_weights": False},
    "padded": {"share_prompts": False},
    "all_no_recompute": {"attention": "flex_attention", "compile": True, "recompute": "none"},
}
SHAPES = {"1.5b": QWEN25_15B, "3b": QWEN25_3B}
SMALL_LEVERS = "default,autocast,padded"  # --small's: the CPU test stays short


def roofline_setup(lever: dict):
    """The roofline's `Setup` for a configuration of LEVERS, or None where the model has none
    (autocast, padded)."""
    from roofline import Setup

    if not lever.get("bf16_weights", True) or not lever.get("share_prompts", True):
        return None
    return Setup(
        chunk=lever.get("chunk", "device"),
        checkpointing=lever.get("recompute", "selective"),
        attention="flex" if lever.get("attention") == "flex_attention" else "sdpa",
        fused=("body", "head") if lever.get("compile") else (),
    )


def measure(
    device: torch.device,
    small: bool,
    shape: dict,
    tokens: int,
    passes: int,
    bf16_weights: bool = True,
    attention: str | None = None,
    recompute: str = "selective",
    chunk: str = "device",
    compile: bool = False,
    share_prompts: bool = True,
    profile: bool = False,
) -> dict:
    """Three timed optimiser steps of the learner, after a warm-up, with the levers as given
    (`attention` None: sdpa on CUDA, eager on the CPU); with `profile`, one more step under
    the profiler for its top kernels."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcli.ops import logprobs
    from rlcli.runtime.precision import WorkingWeights

    config = AutoConfig.for_model("qwen2", **shape)
    torch.manual_seed(0)
    with device:
        lm = AutoModelForCausalLM.from_config(
            config,
            dtype=torch.float32,
            attn_implementation=attention or ("sdpa" if device.type == "cuda" else "eager"),
        )
    params = sum(p.numel() for p in lm.parameters())
    head = lm.get_output_embeddings().weight.numel()
    body = params - head  # the embedding is tied to the head: its lookup costs nothing
    optimizer = adamw(list(lm.parameters()), lr=1e-6)
    working = WorkingWeights(lm) if bf16_weights else None  # as `train.run.setup` on one GPU
    if working is not None:
        working.follow(optimizer)
    policy = working.model if working is not None else lm
    policy.train()
    lever = {"recompute": recompute} if recompute != "none" else {}
    model = with_lever(policy, {**lever, "compile": compile})
    # Each shared-prompt row: a 256-token prompt and its 4 responses of 192 tokens (1,024).
    prompt_len, response_len, group = (32, 24, 4) if small else (256, 192, 4)
    row = prompt_len + group * response_len
    prompts = max(tokens // row, 1) * passes
    batch = synthetic_batch(shape["vocab_size"], prompts, group, prompt_len, response_len, device)
    cfg = compose(["algo=grpo", "algo.beta=0"])
    objective = objective_from_config(cfg.algo, cfg.sampler, norm_len=response_len)
    plan = UpdatePlan(1, 10**6, tokens, max_grad_norm=1.0, share_prompts=share_prompts)
    chunks = dict(logprobs.CHUNK_ELEMENTS)

    def step():
        if chunk == "cpu":  # the CPU's chunk size on this device
            logprobs.CHUNK_ELEMENTS[device.type] = chunks["cpu"]
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not bf16_weights):
                return learn(model, optimizer, objective, batch, plan)
        finally:
            logprobs.CHUNK_ELEMENTS.update(chunks)

    step()  # warm-up: kernels chosen (flex_attention's and compile's compiled), allocator grown
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        metrics = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    # The useful work, whatever the layout: padded reads each prompt `group` times, and that
    # repetition shows as a lower utilisation.
    read = prompts * row
    trained = prompts * group * response_len
    flops = 6 * (body * read + head * trained)
    best = min(seconds)
    name, peak = card_peak(device)
    learner_state = params * 16  # float32 weights, gradients, AdamW's two moments
    peak_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    result = {
        "card": name,
        "parameters": params,
        "tokens_per_pass": row * max(tokens // row, 1),
        "passes_per_step": passes,
        "step_seconds": [round(s, 3) for s in seconds],
        "tokens_per_s": round(read / best, 1),
        "model_tflop_per_s": round(flops / best / 1e12, 2),
        "mfu": None if peak is None else round(flops / best / peak, 4),
        "peak_memory_gib": None if peak_memory is None else round(peak_memory / 2**30, 2),
        "learner_state_gib": round(learner_state / 2**30, 2),
        "activations_gib": None
        if peak_memory is None
        else round((peak_memory - learner_state) / 2**30, 2),
        "loss_finite": math.isfinite(metrics["loss/policy"]),
        "padding_frac": round(metrics["batch/padding_frac"], 4),
    }
    if profile:
        result["top_kernels"] = top_kernels(step, device)
    return result


def top_kernels(step, device: torch.device, count: int = 10) -> list[dict]:
    """The `count` kernels with the most self time in one run of `step` (on the CPU, the
    operators), each with its share of the summed self time and its milliseconds."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize(device)
    if cuda:
        # The kernels' own entries only: an operator's self device time is that of the kernels
        # it launched, which would count them twice.
        times = {
            e.key: e.self_device_time_total
            for e in prof.key_averages()
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        }
    else:
        times = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(times.values()) or 1
    top = sorted(times.items(), key=lambda item: -item[1])[:count]
    # The profiler's times are in microseconds.
    return [{"name": k, "share": round(t / total, 3), "ms": round(t / 1e3, 3)} for k, t in top]


def throughput_one(
    device: torch.device, small: bool, shape: dict, tokens: int, passes: int, name: str
):
    """`measure` of configuration `name` of LEVERS on a fresh model; "default" also profiled."""
    if LEVERS[name].get("attention") == "flex_attention" and device.type != "cuda":
        return {"skipped": "no flex_attention backward on CPU"}
    try:
        return measure(
            device, small, shape, tokens, passes, profile=name == "default", **LEVERS[name]
        )
    except torch.OutOfMemoryError:
        if LEVERS[name].get("recompute") != "none":
            raise
        return {"skipped": "out of memory"}
    finally:
        # The model, its optimiser state and the allocator's blocks gone before the next.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def calibrate(device: torch.device) -> dict:
    """This card's figures for the roofline (`roofline.Card`): bfloat16 matmul FLOP/s, copy
    bytes/s, and one reference layer's attention, forward and backward, under the dense
    shared-prompt mask (sdpa) and flex_attention's block mask (compiled)."""
    from torch.nn.attention.flex_attention import flex_attention

    from rlcli.train.passes import flex_block_mask, segment_mask

    def timed(fn, repeats=10):
        fn()
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / repeats

    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    matmul = 2 * 8192**3 / timed(lambda: a @ a)
    big = torch.empty(2**28, device=device)  # 1 GiB, copied: read and written
    bandwidth = 2 * big.nbytes / timed(lambda: big.clone())
    # The reference layer: 16 rows of a 256-token prompt and 4 responses of 192 tokens.
    segment = torch.tensor([0] * 256 + [k for k in range(1, 5) for _ in range(192)], device=device)
    segment, doc = segment.expand(16, -1), torch.zeros(16, 1024, dtype=torch.long, device=device)
    q = torch.randn(16, 12, 1024, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(16, 2, 1024, 128, device=device, dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))  # fmt: skip
    dense = segment_mask(doc, segment)[:, None]
    block = flex_block_mask(doc, segment)
    flex = torch.compile(flex_attention)

    def layer(attend):
        def run():
            attend().sum().backward()

        return run

    sdpa = torch.nn.functional.scaled_dot_product_attention
    dense_s = timed(layer(lambda: sdpa(q, k, v, attn_mask=dense, enable_gqa=True)))
    flex_s = timed(layer(lambda: flex(q, k, v, block_mask=block, enable_gqa=True)))
    name, peak = card_peak(device)
    return {"name": name, "peak": peak or 989e12, "matmul": matmul, "bandwidth": bandwidth,
            "dense_layer_s": dense_s, "flex_layer_s": flex_s}  # fmt: skip


def predictions(card: dict, shape: str, tokens: int, passes: int, names) -> dict:
    """The roofline's seconds and MFU for each configuration on the calibrated `card`."""
    from concurrent.futures import ThreadPoolExecutor

    from roofline import predicted

    setups = {name: roofline_setup(LEVERS[name]) for name in names}
    wanted = {name: setup for name, setup in setups.items() if setup is not None}
    # One process each, four at a time: seven at once on a 2-core, 24 GiB machine lost one.
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: pool.submit(predicted, shape, tokens, passes, setup, card)
            for name, setup in wanted.items()
        }
    return {name: future.result()["this card"] for name, future in futures.items()}


def tiny_steps(device: torch.device) -> dict:
    """Two GRPO steps with sampler=hf, then one LoRA step, on the tiny model."""
    base = [
        "model=tiny",
        "reward=space_rate",  # dense, so that every step has a gradient
        "sampler=hf",
        f"trainer.device={device.type}",
        "trainer.prompts_per_step=4",
        "trainer.group_size=4",
        "sampler.max_new_tokens=16",
        "logger.progress=false",
    ]
    run = setup(compose(base))
    grpo = [train_step(run) for _ in range(2)]
    lora = setup(compose([*base, "model.lora.rank=8"]))
    lora_step = train_step(lora)
    keys = ("loss/policy", "actor/grad_norm", "reward/mean")
    return {
        "grpo": [{k: round(m[k], 5) for k in keys} for m in grpo],
        "lora": {k: round(lora_step[k], 5) for k in keys},
        "finite": all(math.isfinite(m["loss/policy"]) for m in [*grpo, lora_step]),
    }


# The levers compared with the CPU's plain path (eager attention, nothing recomputed, nothing
# compiled) on the tiny model, each on the device side alone.
COMPARED = {
    "plain": {},
    "sdpa": {"attention": "sdpa"},
    "selective_recompute": {"recompute": "selective"},
    "full_recompute": {"recompute": "full"},
    "flex_attention": {"attention": "flex_attention"},
    "compile": {"compile": True},
}


def with_lever(policy, lever: dict):
    """`policy` with one of COMPARED's levers on, wrapped as the learner calls it."""
    from rlcli.runtime.memory import checkpointing_kwargs
    from rlcli.runtime.models import compile_layers

    if "attention" in lever:
        policy.set_attn_implementation(lever["attention"])
    if "recompute" in lever:
        policy.gradient_checkpointing_enable(checkpointing_kwargs(lever["recompute"]))
        policy.train()
    if lever.get("compile"):
        compile_layers(policy)
    return TokenLogprobModel(policy, fused_head=bool(lever.get("compile")))


def cuda_against_cpu(device: torch.device, names=tuple(COMPARED)) -> dict:
    """The loss and gradients of one learner update on the device with each lever of `names`
    against the CPU's plain path, float32."""
    cfg = compose(["model=tiny", "sampler=hf", "trainer.bf16_autocast=false", "algo.beta=0"])
    run = setup(cfg)
    batch = synthetic_batch(run.policy.config.vocab_size, 3, 4, 7, 9, torch.device("cpu"))
    objective = objective_from_config(cfg.algo, cfg.sampler, norm_len=16)
    plan = UpdatePlan(1, 16, 0, max_grad_norm=0.0)

    def update(where, lever):
        policy = copy.deepcopy(run.policy).to(where)
        moved = TrainBatch(
            rollout=type(batch.rollout)(**{
                k: v.to(where) if torch.is_tensor(v) else v
                for k, v in vars(batch.rollout).items()
            }),
            rewards=batch.rewards.to(where),
            advantages=batch.advantages.to(where),
        )  # fmt: skip
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)  # keeps .grad, moves nothing
        metrics = learn(with_lever(policy, lever), optimizer, objective, moved, plan)
        return metrics["loss/policy"], torch.cat(
            [p.grad.flatten().cpu() for p in policy.parameters()]
        )

    loss, grad = update("cpu", {})
    results = {}
    for name in names:
        if COMPARED[name].get("attention") == "flex_attention" and device.type != "cuda":
            continue  # no flex_attention backward on the CPU
        lever_loss, lever_grad = update(device.type, COMPARED[name])
        results[name] = {
            "loss_cpu": loss,
            "loss_device": lever_loss,
            "grad_max_abs_diff": float((grad - lever_grad).abs().max()),
            "grad_norm": float(grad.norm()),
            "match": math.isclose(loss, lever_loss, rel_tol=1e-4, abs_tol=1e-6)
            and torch.allclose(grad, lever_grad, rtol=1e-3, atol=1e-5),
        }
    return results


def with_predictions(report: dict, tokens: int = 16384, passes: int = 2) -> dict:
    """`report` with the roofline's seconds for each measured configuration on the report's
    calibrated card and at its tokens and passes (`tokens` and `passes` only for reports that
    do not record them), and measured over predicted. The model runs on the CPU, so a report
    from a GPU machine can be predicted after the lease, on any machine (`--predict-from`)."""
    tokens, passes = report.get("tokens", tokens), report.get("passes", passes)
    levers = report["levers"]
    names = [name for name, lever in levers.items() if "skipped" not in lever]
    predicted = predictions(report["card"], report.get("shape", "1.5b"), tokens, passes, names)
    for name, seconds in predicted.items():
        levers[name]["predicted_seconds"] = seconds["seconds"]
        levers[name]["measured_over_predicted"] = round(
            min(levers[name]["step_seconds"]) / seconds["seconds"], 3
        )
    return report


def sections(
    device: torch.device, args, tokens: int, names: list[str]
) -> list[tuple[str, callable]]:
    """What the check runs, in order: the card's calibration, the configurations, the tiny
    model's steps and CUDA against the CPU, and the compiled configurations last (their
    compilation is the slowest part, so a deadline cuts them first)."""
    shape = SMALL if args.small else SHAPES[args.shape]

    def lever(name):
        return lambda: throughput_one(device, args.small, shape, tokens, args.passes, name)

    cuda = device.type == "cuda"
    compiled = [n for n in names if LEVERS[n].get("compile")]
    return [
        *([("card", lambda: calibrate(device))] if cuda else []),
        *[(f"levers.{n}", lever(n)) for n in names if n not in compiled],
        ("tiny_steps", lambda: tiny_steps(device)),
        *([("cuda_against_cpu", lambda: cuda_against_cpu(device))] if cuda else []),
        *[(f"levers.{n}", lever(n)) for n in compiled],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU, tests)")
    parser.add_argument("--shape", choices=SHAPES, default="1.5b", help="the model's shape")
    parser.add_argument("--tokens", type=int, default=16384, help="most tokens per pass")
    parser.add_argument("--passes", type=int, default=2, help="passes per optimiser step")
    parser.add_argument(
        "--levers",
        help=f"comma-separated configurations of the throughput part, of {','.join(LEVERS)} "
        f"(default all; with --small {SMALL_LEVERS}); default always runs",
    )
    parser.add_argument("--out", help="write the report here after every section")
    parser.add_argument(
        "--deadline", type=float, help="seconds after which no section starts (skipped)"
    )
    parser.add_argument(
        "--no-predict", action="store_true", help="leave the roofline's predictions out"
    )
    parser.add_argument(
        "--predict-from", help="a report (JSON) from a GPU: add its predictions and print it"
    )
    args = parser.parse_args()
    if args.predict_from:
        report = json.loads(open(args.predict_from).read())
        print(json.dumps(with_predictions(report, args.tokens, args.passes), indent=1))
        return
    chosen = (args.levers or (SMALL_LEVERS if args.small else ",".join(LEVERS))).split(",")
    if unknown := set(chosen) - set(LEVERS):
        parser.error(f"unknown levers {sorted(unknown)}; they are {', '.join(LEVERS)}")
    # In LEVERS' order, and always "default": the one the others are read against.
    names = [name for name in LEVERS if name in chosen or name == "default"]
    device = torch.device(args.device)
    report = {"torch": torch.__version__, "shape": "small" if args.small else args.shape,
              "tokens": min(args.tokens, 512) if args.small else args.tokens,
              "passes": args.passes, "levers": {}}  # fmt: skip
    began, cut = time.perf_counter(), []
    for key, run_section in sections(device, args, report["tokens"], names):
        elapsed = time.perf_counter() - began
        if args.deadline is not None and elapsed > args.deadline:
            result = {"skipped": f"deadline ({elapsed:.0f} s > {args.deadline:.0f} s)"}
            cut.append(key)
        else:
            result = run_section()
        if key.startswith("levers."):
            report["levers"][key.removeprefix("levers.")] = result
        else:
            report[key] = result
        print(f"gpu_check: {key} done at {time.perf_counter() - began:.0f} s", flush=True)
        if args.out:
            with open(args.out, "w") as out:
                json.dump(report, out, indent=1)
    report["levers"] = {name: report["levers"][name] for name in names}  # LEVERS' order
    report["throughput"] = report["levers"]["default"]
    if device.type == "cuda" and not args.no_predict:
        with_predictions(report)
    report["seconds"] = round(time.perf_counter() - began, 1)
    print(json.dumps(report, indent=1))
    if cut:
        print(f"GPU CHECK INCOMPLETE: the deadline cut {', '.join(cut)}")
        raise SystemExit(1)
    measured = [lever for lever in report["levers"].values() if "skipped" not in lever]
    ok = (
        all(lever["loss_finite"] for lever in measured)
        and report["tiny_steps"]["finite"]
        and all(c["match"] for c in report.get("cuda_against_cpu", {}).values())
    )
    print("GPU CHECK PASSED" if ok else "GPU CHECK FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
