"""The papers' claims that scripts/paper_effects.py tests (docs/paper-effects.md): for each, what
the paper says, its arms as `rlcli train` overrides, the metric that judges it and the
direction the paper says it moves, and the files an arm needs written first."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Claim:
    claim: str  # what the paper says, in one sentence
    source: str  # the paper and the figure or table it shows it in
    arms: dict[str, list[str]]  # arm name -> its overrides; the first arm is the baseline
    metric: str  # the metrics.jsonl key the verdict reads
    direction: int  # +1: the paper says the other arms' value is higher than the baseline's
    steps: int  # training steps of each run
    base: list[str]  # overrides of every arm
    over: str = "all"  # a run's value: mean over all steps, or "late" (the second half)
    also: tuple[str, ...] = ()  # metrics reported beside it, not judged
    # What the smoke test (the tiny model) adds: e.g. a dense reward where the claim needs
    # groups whose rewards differ, which the tiny model's answers never are.
    smoke: tuple[str, ...] = ()
    # Writes, before any arm runs, the files the arms' overrides name as {data} (OUT/CLAIM/data).
    prepare: Callable[[Path, bool], None] | None = None
    # The arms the verdict judges against the baseline (empty: every other arm); the rest are
    # measured beside them, as DAPO is beside DCPO.
    judged: tuple[str, ...] = ()
    # Measures a finished run further: the model's greedy held-out accuracy (`rlcli eval`).
    evaluate_after: bool = False
    # Also plots the metric against the generation rounds sampled so far (batch/gen_batches
    # summed), the cost axis of a claim whose arms sample different amounts per step.
    by_rounds: bool = False


def rlcli(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "rlcli", *args], check=False)
    if done.returncode:
        sys.exit(f"paper_effects: `rlcli {' '.join(args)}` exited {done.returncode}")


# How every smoke test samples (tests/scripts/test_paper_effects.py): with transformers, since
# starting a vLLM engine would take most of the test's time, and only 16 tokens.
TINY_SAMPLING = ["sampler=hf", "sampler.max_new_tokens=16"]


def path_override(key: str, path: Path) -> str:
    """KEY=PATH as one Hydra override. Quoted: a sweep's job directory holds an = (0_seed=0),
    which Hydra's grammar would otherwise read as a second key=value."""
    return f"{key}='{path}'"


def evaluate_args(run_dir: Path, smoke: bool, *model: str) -> list[str]:
    """`rlcli eval`'s arguments: greedy accuracy on 100 held-out arithmetic problems."""
    tiny = [*TINY_SAMPLING, "eval.max_problems=8"] if smoke else []
    return [
        "eval", "data=arith", "eval.max_problems=100", "eval.k=1", "logger.progress=false",
        *model, *tiny, path_override("hydra.run.dir", run_dir),
    ]  # fmt: skip


def evaluate_on_arith(run_dir: Path, smoke: bool, *model: str) -> None:
    """`rlcli eval`: a model's greedy accuracy on 100 held-out arithmetic problems, into
    RUN_DIR/eval.json (skipped when it is there); `model` names it (default: SmolLM2)."""
    if not (run_dir / "eval.json").exists():
        rlcli(*evaluate_args(run_dir, smoke, *model))


def dpo_pairs(data: Path, smoke: bool) -> None:
    """Claim 9's two sets of pairs over the same prompts. On-policy: `rlcli pairs`, the best and
    the worst of the model's own 8 replies to each of 384 arithmetic prompts (ties skipped).
    Offline: pairs nobody sampled, written for the same prompts: "A op B = answer" chosen
    against the same sum with a wrong answer (off by 1 to 10) rejected."""
    onpolicy, offline = data / "onpolicy.jsonl", data / "offline.jsonl"
    evaluate_on_arith(data / "before", smoke, *(["model=tiny"] if smoke else []))  # the start
    if not onpolicy.exists():
        # The tiny model's replies are all wrong alike: a dense reward gives it pairs.
        tiny = ["model=tiny", *TINY_SAMPLING, "reward=space_rate"] if smoke else []
        rlcli(
            "pairs", "data=arith", "reward=math", "pairs.k=8", "logger.progress=false",
            f"data.num_train={16 if smoke else 384}", *tiny,
            f"pairs.out={onpolicy}", f"hydra.run.dir={data / 'pairs_run'}",
        )  # fmt: skip
    rng, rows = random.Random(0), []
    for line in onpolicy.read_text().splitlines():
        record = json.loads(line)
        expression = re.match(r"What is (.+?)\?", record["prompt"]).group(1)
        wrong = int(record["answer"]) + rng.choice([-1, 1]) * rng.randint(1, 10)
        rows.append({"prompt": record["prompt"], "chosen": f"{expression} = {record['answer']}",
                     "rejected": f"{expression} = {wrong}"})  # fmt: skip
    offline.write_text("".join(json.dumps(row) + "\n" for row in rows))


# Clipping acts only when the policy moves away from the one that sampled: 4 updates per batch
# (DAPO and GSPO train with 16 and more), at a learning rate that moves it within a batch.
OFF_POLICY = ["trainer.mini_batches=4", "trainer.lr=2e-5"]
# At lr 2e-5 GRPO clipped about 1 token in 10,000 (gspo_clipping), too few for a change of the
# clip's upper bound to act; at 1e-4 the policy moves five times as far within a batch.
CLIPPING = ["trainer.mini_batches=4", "trainer.lr=1e-4"]
# Dynamic sampling draws more groups until 4 have rewards that differ. At the start about 1 in 5
# groups does (the model answers about 5% right), so 3 draws, the default, run short.
DRAW_MORE = "algo.max_gen_batches=16"

# DPO as docs/data-and-reward.md runs it: 8 pairs a step at lr 1e-5, 8 pairs held out.
DPO_BASE = ["algo=dpo", "data=pairs", "data.num_test=8", "trainer.prompts_per_step=8"]
DPO_BASE += ["trainer.lr=1e-5"]

CLAIMS = {
    "clip_higher": Claim(
        claim="With eps_high = 0.28 the policy's entropy does not collapse as it does with "
        "the symmetric 0.2, and accuracy is at least as good.",
        source="DAPO (Yu et al. 2025), Fig. 2",
        arms={
            "eps 0.2/0.2": ["algo=grpo"],
            # eps_high is read by the decoupled clip only; the symmetric one ignores it.
            "eps 0.2/0.28": ["algo=grpo", "algo.clip=decoupled", "algo.eps_high=0.28"],
        },
        metric="actor/entropy",
        direction=+1,
        steps=40,
        base=CLIPPING,
        over="late",
        also=("reward/mean", "clip/high"),
    ),
    "dynamic_sampling": Claim(
        claim="Dynamic sampling reaches a given reward in fewer training steps, at the cost "
        "of more generated responses per step.",
        source="DAPO (Yu et al. 2025), Fig. 6",
        arms={
            "grpo": ["algo=grpo"],
            "dynamic sampling": ["algo=grpo", "algo.dynamic_sampling=true", DRAW_MORE],
        },
        metric="reward/mean",
        direction=+1,
        steps=40,
        base=[],
        also=("batch/gen_batches", "batch/response_utilisation"),
        smoke=("reward=space_rate", "algo.filter_metric=total"),
        by_rounds=True,
    ),
    "overlong_shaping": Claim(
        claim="The soft overlong punishment and the overlong filter lower the share of "
        "truncated responses.",
        source="DAPO (Yu et al. 2025), Fig. 5",
        arms={
            "grpo": ["algo=grpo"],
            "soft punishment": ["algo=grpo", "reward=dapo"],
            "overlong filter": ["algo=grpo", "algo.overlong_filter=true"],
        },
        metric="response/truncated_frac",
        direction=-1,
        steps=40,
        base=["sampler.max_new_tokens=32"],
        over="late",
        # reward/mean is not comparable across arms: reward=dapo scores -1/+1 and punishes.
        also=("reward/math", "reward/mean", "response/length_mean"),
    ),
    "length_bias": Claim(
        claim="Under GRPO's per-response normalisation the wrong responses keep growing longer; "
        "under Dr.GRPO they do not, at similar reward.",
        source="Dr.GRPO (Liu et al. 2025, Understanding R1-Zero-Like Training), the length-bias "
        "figure",
        arms={"grpo": ["algo=grpo", "algo.beta=0"], "dr_grpo": ["algo=dr_grpo"]},
        metric="samples/wrong_length",
        direction=-1,
        steps=40,
        base=["sampler.max_new_tokens=96"],
        over="late",
        also=("samples/right_length", "reward/mean"),
    ),
    "entropy_mechanism": Claim(
        claim="Clip-Cov and KL-Cov keep the policy's entropy above GRPO's.",
        source="Cui et al. 2025 (The Entropy Mechanism of RL for Reasoning LMs), Fig. 1",
        # GRPO's KL in every arm, as measured; the configs' own beta is now their paper's, 0.
        arms={
            "grpo": ["algo=grpo"],
            "clip_cov": ["algo=clip_cov", "algo.beta=0.04"],
            "kl_cov": ["algo=kl_cov", "algo.beta=0.04"],
        },
        metric="actor/entropy",
        direction=+1,
        steps=40,
        base=OFF_POLICY,
        over="late",
        also=("reward/mean",),
    ),
    "gspo_clipping": Claim(
        claim="GSPO clips a far larger share of tokens than GRPO (about two orders of "
        "magnitude) and still learns at least as well.",
        source="GSPO (Zheng et al. 2025), the clipping-fraction figure",
        arms={"grpo": ["algo=grpo"], "gspo": ["algo=gspo"]},
        metric="clip/frac",
        direction=+1,
        steps=20,
        base=OFF_POLICY,
        also=("reward/mean",),
    ),
    "dcpo_utilisation": Claim(
        claim="DCPO gives a higher share of responses a gradient than GRPO and DAPO, and "
        "clips a lower share of tokens.",
        source="DCPO (Yang et al. 2025), its response-utilisation and clipping metrics",
        arms={"grpo": ["algo=grpo"], "dapo": ["algo=dapo", DRAW_MORE], "dcpo": ["algo=dcpo"]},
        metric="batch/response_utilisation",
        direction=+1,
        steps=20,
        base=OFF_POLICY,
        also=("clip/frac", "reward/mean"),
        smoke=("reward=space_rate", "algo.filter_metric=total"),  # as dynamic_sampling's
        judged=("dcpo",),
    ),
    "critic_cost": Claim(
        claim="Dropping the critic (GRPO against PPO) lowers the step time at comparable reward.",
        source="DeepSeekMath (Shao et al. 2024), section 4.1",
        arms={
            "ppo": ["algo=ppo", "trainer.group_size=1", "trainer.prompts_per_step=16"],
            "grpo": ["algo=grpo"],
        },  # fmt: skip
        metric="time/step",
        direction=-1,
        steps=10,
        base=[],
        also=("reward/mean",),
    ),
    "dpo_pairs": Claim(
        claim="DPO raises the implicit reward margin and preference accuracy on held-out pairs; "
        "on-policy pairs teach the task more than offline pairs of the same number and steps.",
        source="DPO (Rafailov et al. 2023); on-policy against offline pairs: Tajwar et al. 2024 "
        "(Preference Fine-Tuning of LLMs Should Leverage Suboptimal, On-Policy Data)",
        arms={
            "offline": ["data.path={data}/offline.jsonl"],
            "on-policy": ["data.path={data}/onpolicy.jsonl"],
        },
        metric="eval/accuracy",
        direction=+1,
        steps=20,
        base=DPO_BASE,
        also=("eval/reward/accuracy", "eval/reward/margin"),
        prepare=dpo_pairs,
        evaluate_after=True,
    ),
}
