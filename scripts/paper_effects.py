"""The papers' effects, reproduced small (docs/paper-effects.md): one experiment per claim.

Each arm of a claim runs as an `rlcli train -m trainer.seed=0,1,2` sweep on the real
SmolLM2-135M; then, for the metric the claim is about, the script gives each arm's mean and
95% interval over seeds, the paired difference against the first arm (the baseline) by seed
and its interval, a verdict, and the arms' curves with 95% bands.

    .venv/bin/python scripts/paper_effects.py --list
    .venv/bin/python scripts/paper_effects.py gspo_clipping              # 3 seeds
    .venv/bin/python scripts/paper_effects.py gspo_clipping --seeds 5 --out runs/effects
    .venv/bin/python scripts/paper_effects.py gspo_clipping --smoke   # tiny, 1 seed, 2 steps

Verdicts: **reproduced** when the paired difference's 95% interval lies on the side the paper
says; **not reproduced** when it lies on the other side; **inconclusive at this scale** when it
contains 0 (or there are fewer than 2 seeds). A run's value is the metric's mean over its
steps (`over="all"`) or over the second half of them (`over="late"`, for claims about where
training ends up). Writes OUT/CLAIM/{arm}/ (the sweeps), OUT/CLAIM/result.json,
OUT/CLAIM/result.md and OUT/CLAIM/curves.png.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlcli.sweep import mean_interval
from rlcli.tracking.metrics import read_metrics


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


# Clipping acts only when the policy moves away from the one that sampled: 4 updates per batch
# (DAPO and GSPO train with 16 and more), at a learning rate that moves it within a batch.
OFF_POLICY = ["trainer.mini_batches=4", "trainer.lr=2e-5"]

CLAIMS = {
    "clip_higher": Claim(
        claim="With eps_high = 0.28 the policy's entropy does not collapse as it does with "
        "the symmetric 0.2, and accuracy is at least as good.",
        source="DAPO (Yu et al. 2025), Fig. 2",
        arms={"eps 0.2/0.2": ["algo=grpo"], "eps 0.2/0.28": ["algo=grpo", "algo.eps_high=0.28"]},
        metric="actor/entropy",
        direction=+1,
        steps=40,
        base=OFF_POLICY,
        over="late",
        also=("reward/mean", "clip/high"),
    ),
    "dynamic_sampling": Claim(
        claim="Dynamic sampling reaches a given reward in fewer training steps, at the cost "
        "of more generated responses per step.",
        source="DAPO (Yu et al. 2025), Fig. 6",
        arms={
            "grpo": ["algo=grpo"],
            "dynamic sampling": ["algo=grpo", "algo.dynamic_sampling=true"],
        },
        metric="reward/mean",
        direction=+1,
        steps=40,
        base=[],
        also=("batch/gen_batches", "batch/response_utilisation"),
        smoke=("reward=space_rate", "algo.filter_metric=total"),
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
        also=("reward/mean", "response/length_mean"),
    ),
    "entropy_mechanism": Claim(
        claim="Clip-Cov and KL-Cov keep the policy's entropy above GRPO's.",
        source="Cui et al. 2025 (The Entropy Mechanism of RL for Reasoning LMs), Fig. 1",
        arms={"grpo": ["algo=grpo"], "clip_cov": ["algo=clip_cov"], "kl_cov": ["algo=kl_cov"]},
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
        claim="DCPO gives a higher share of responses a gradient than GRPO.",
        source="DCPO (Yang et al. 2025), its response-utilisation metric",
        arms={"grpo": ["algo=grpo"], "dcpo": ["algo=dcpo"]},
        metric="batch/response_utilisation",
        direction=+1,
        steps=20,
        base=OFF_POLICY,
        also=("clip/frac", "reward/mean"),
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
}

# Overrides that turn an experiment into its smoke test: the tiny model, two short steps.
SMOKE = ["model=tiny", "sampler.max_new_tokens=16", "trainer.max_steps=2"]


def run_arm(claim: Claim, arm: list[str], seeds: int, out: Path, smoke: bool) -> None:
    steps = [] if smoke else [f"trainer.max_steps={claim.steps}"]
    cmd = [
        sys.executable, "-m", "rlcli", "train", "-m",
        f"trainer.seed={','.join(str(s) for s in range(seeds))}",
        "logger.progress=false", "trainer.save_every=0",
        *claim.base, *arm, *steps, *((*SMOKE, *claim.smoke) if smoke else ()),
        f"hydra.sweep.dir={out}",
    ]  # fmt: skip
    done = subprocess.run(cmd, check=False)
    if done.returncode:
        sys.exit(f"paper_effects: `{' '.join(cmd[2:])}` exited {done.returncode}")


def runs_by_seed(sweep: Path) -> dict[int, list[dict]]:
    """Each job's metrics rows under a sweep directory, by its trainer.seed."""
    runs = {}
    for overrides in sorted(sweep.glob("*/.hydra/overrides.yaml")):
        job = overrides.parent.parent
        seed = next(
            int(o.split("=", 1)[1])
            for o in yaml.safe_load(overrides.read_text())
            if o.startswith("trainer.seed=")
        )
        runs[seed] = read_metrics(job)
    return runs


def run_value(rows: list[dict], metric: str, over: str) -> float:
    values = [r[metric] for r in rows if metric in r and math.isfinite(r[metric])]
    if over == "late":
        values = values[len(values) // 2 :]
    return sum(values) / len(values) if values else math.nan


def verdict(diffs: list[float], direction: int) -> str:
    if len(diffs) < 2:
        return "inconclusive at this scale"
    mean, half = mean_interval(diffs)
    low, high = sorted((direction * (mean - half), direction * (mean + half)))
    if low > 0:
        return "reproduced"
    if high < 0:
        return "not reproduced"
    return "inconclusive at this scale"


def summarise(claim: Claim, runs: dict[str, dict[int, list[dict]]]) -> dict:
    """Per arm the metric's per-seed values, mean and 95% half-width; per other arm the paired
    differences with the baseline and the verdict; the same for the metrics reported beside."""
    baseline = next(iter(claim.arms))
    result = {"claim": claim.claim, "source": claim.source, "metric": claim.metric, "arms": {}}
    for metric in (claim.metric, *claim.also):
        for arm, by_seed in runs.items():
            values = {s: run_value(rows, metric, claim.over) for s, rows in by_seed.items()}
            mean, half = mean_interval(list(values.values()))
            entry = result["arms"].setdefault(arm, {})
            entry[metric] = {"by_seed": values, "mean": mean, "half_width": half}
            if arm != baseline:
                base = result["arms"][baseline][metric]["by_seed"]
                diffs = [values[s] - base[s] for s in values if s in base]
                d_mean, d_half = mean_interval(diffs) if diffs else (math.nan, math.nan)
                entry[metric]["paired_diff"] = {"by_seed": diffs, "mean": d_mean,
                                                "half_width": d_half}  # fmt: skip
                if metric == claim.metric:
                    entry["verdict"] = verdict(diffs, claim.direction)
    return result


def cell(mean: float, half: float) -> str:
    if math.isnan(mean):
        return ""
    return f"{mean:.4g}" if math.isnan(half) else f"{mean:.4g} ± {half:.2g}"


def markdown(key: str, claim: Claim, result: dict, seeds: int) -> str:
    baseline = next(iter(claim.arms))
    lines = [
        f"### {key}: {claim.source}",
        "",
        f"*{claim.claim}*",
        "",
        f"`.venv/bin/python scripts/paper_effects.py {key}` ({seeds} seeds, {claim.steps} "
        f"steps per run; a run's value: mean over {'the second half of ' if claim.over == 'late' else ''}its steps)",  # noqa: E501
        "",
        "| arm | " + " | ".join((claim.metric, *claim.also)) + " | verdict |",
        "|---|" + "---|" * (len(claim.also) + 2),
    ]
    for arm, entry in result["arms"].items():
        cells = []
        for metric in (claim.metric, *claim.also):
            m = entry[metric]
            text = cell(m["mean"], m["half_width"])
            if "paired_diff" in m:
                d = m["paired_diff"]
                text += f" (vs {baseline}: {cell(d['mean'], d['half_width'])})"
            cells.append(text)
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {entry.get('verdict', 'baseline')} |")
    return "\n".join(lines) + "\n"


def plot(claim: Claim, runs: dict[str, dict[int, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (claim.metric, *claim.also)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.3), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for arm, by_seed in runs.items():
            steps = sorted({r["step"] for rows in by_seed.values() for r in rows if metric in r})
            means, lows, highs = [], [], []
            for step in steps:
                values = [r[metric] for rows in by_seed.values() for r in rows
                          if r["step"] == step and metric in r]  # fmt: skip
                mean, half = mean_interval(values)
                half = 0.0 if math.isnan(half) else half
                means.append(mean), lows.append(mean - half), highs.append(mean + half)
            ax.plot(steps, means, label=arm)
            ax.fill_between(steps, lows, highs, alpha=0.2)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(f"{claim.source}: mean over seeds, 95% band", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("claim", nargs="?", choices=sorted(CLAIMS))
    parser.add_argument("--list", action="store_true", help="the claims and their commands")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/paper_effects"))
    parser.add_argument("--smoke", action="store_true", help="tiny model, one seed, two steps")
    args = parser.parse_args()
    if args.list or args.claim is None:
        for key, claim in CLAIMS.items():
            print(f"{key:18} {claim.source}: {claim.claim}")
        return
    claim, seeds = CLAIMS[args.claim], 1 if args.smoke else args.seeds
    out = (args.out / args.claim).resolve()
    runs: dict[str, dict[int, list[dict]]] = {}
    for i, (arm, overrides) in enumerate(claim.arms.items()):
        sweep = out / f"arm{i}"
        steps = 2 if args.smoke else claim.steps
        done = runs_by_seed(sweep) if sweep.is_dir() else {}
        # An arm whose every seed ran to the end is not run again (a later claim reuses it).
        if sorted(done) != list(range(seeds)) or any(len(r) < steps for r in done.values()):
            run_arm(claim, overrides, seeds, sweep, args.smoke)
        runs[arm] = runs_by_seed(sweep)
    result = summarise(claim, runs)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    text = markdown(args.claim, claim, result, seeds)
    (out / "result.md").write_text(text)
    plot(claim, runs, out / "curves.png")
    print(text + f"\nwritten to {out}")


if __name__ == "__main__":
    main()
