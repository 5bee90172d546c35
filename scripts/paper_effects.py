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
training ends up). Writes OUT/CLAIM/{arm}/ (the sweeps; each run's checkpoint is removed once
it is measured, unless --keep-checkpoints), OUT/CLAIM/result.json, OUT/CLAIM/result.md and
OUT/CLAIM/curves.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import sys
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from paper_claims import CLAIMS, TINY_SAMPLING, Claim, evaluate_on_arith, path_override, rlcli

from rlcli.commands.sweep import mean_interval
from rlcli.tracking.metrics import read_metrics


def jobs(sweep: Path) -> list[Path]:
    """A sweep's job directories. Not `rlcli.commands.sweep.job_dirs`: that one searches every
    depth and would count a job's own `rlcli eval` (JOB/after) as a job."""
    return [p.parent.parent for p in sorted(sweep.glob("*/.hydra/overrides.yaml"))]


def overrides_of(job: Path) -> list[str]:
    return yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())


def evaluate_run(job: Path, smoke: bool) -> None:
    """The greedy accuracy of a run's last checkpoint, into JOB/after/eval.json."""
    if (job / "after" / "eval.json").exists():  # checked first: the checkpoint goes once measured
        return
    last = max((job / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    evaluate_on_arith(job / "after", smoke, path_override("model.path", last))


# Overrides that turn an experiment into its smoke test: the tiny model, two short steps.
SMOKE = ["model=tiny", *TINY_SAMPLING, "trainer.max_steps=2"]


def arm_overrides(claim: Claim, arm: list[str], out: Path, smoke: bool) -> list[str]:
    """What every seed of an arm runs with, the seed and the sweep's directory aside."""
    steps = [] if smoke else [f"trainer.max_steps={claim.steps}"]
    arm = [o.replace("{data}", str(out.parent / "data")) for o in arm]
    return [
        "logger.progress=false", "trainer.save_every=0",
        *claim.base, *arm, *steps, *((*SMOKE, *claim.smoke) if smoke else ()),
    ]  # fmt: skip


def ran_with(sweep: Path) -> list[str] | None:
    """The overrides an existing sweep's first job ran with, its seed left out."""
    found = jobs(sweep)
    if not found:
        return None
    return [o for o in overrides_of(found[0]) if not o.startswith("trainer.seed=")]


def same_overrides(a: list[str], b: list[str]) -> bool:
    """Whether two override lists set the same values (Hydra writes `2e-5` back as `2e-05`)."""
    parse = OverridesParser.create().parse_overrides
    return sorted((o.key_or_group, str(o.value())) for o in parse(a)) == sorted(
        (o.key_or_group, str(o.value())) for o in parse(b)
    )


def run_arm(overrides: list[str], seeds: int, out: Path) -> None:
    rlcli(
        "train", "-m", f"trainer.seed={','.join(str(s) for s in range(seeds))}",
        *overrides, f"hydra.sweep.dir={out}",
    )  # fmt: skip


def runs_by_seed(sweep: Path) -> dict[int, list[dict]]:
    """Each job's metrics rows under a sweep directory, by its trainer.seed."""
    runs = {}
    for job in jobs(sweep):
        seed = next(
            int(o.split("=", 1)[1]) for o in overrides_of(job) if o.startswith("trainer.seed=")
        )
        runs[seed] = with_correctness(with_sample_lengths(read_metrics(job), job / "samples.jsonl"))
        after = job / "after" / "eval.json"
        if after.exists() and runs[seed]:
            runs[seed][-1]["eval/accuracy"] = json.loads(after.read_text())["accuracy"]
    return runs


def with_correctness(rows: list[dict]) -> list[dict]:
    """Gives a run under reward=dapo (math_pm1: +1 right, -1 wrong) the 0/1 reward/math the
    other arms log, (math_pm1 + 1) / 2, so that their share of right answers compares."""
    for row in rows:
        if "reward/math_pm1" in row and "reward/math" not in row:
            row["reward/math"] = (row["reward/math_pm1"] + 1) / 2
    return rows


def with_sample_lengths(rows: list[dict], samples: Path) -> list[dict]:
    """Adds to each step's row the mean length of its wrong responses (reward 0 or less:
    reward=math gives 1 or 0) and of its right ones, from the run's samples.jsonl; the script
    derives these, rlcli does not log them."""
    wrong: dict[int, list[int]] = {}
    right: dict[int, list[int]] = {}
    if samples.exists():
        for line in samples.read_text().splitlines():
            s = json.loads(line)
            if s["reward"] is not None:
                (right if s["reward"] > 0 else wrong).setdefault(s["step"], []).append(s["length"])
    for row in rows:
        for key, lengths in (("samples/wrong_length", wrong), ("samples/right_length", right)):
            if row["step"] in lengths:
                row[key] = sum(lengths[row["step"]]) / len(lengths[row["step"]])
    return rows


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
                if metric == claim.metric and arm in (claim.judged or claim.arms):
                    entry["verdict"] = verdict(diffs, claim.direction)
    return result


def rounds_so_far(rows: list[dict]) -> list[float]:
    """The generation rounds a run had sampled by the end of each step (1 a step without
    dynamic sampling)."""
    return list(itertools.accumulate(r.get("batch/gen_batches", 1.0) for r in rows))


def at_baseline_rounds(metric: str, runs: dict[str, dict[int, list[dict]]]) -> dict:
    """Per arm, METRIC's mean over the steps whose generation rounds so far stay within the
    baseline's whole run (the same seed's): the arms compared at the same sampling cost."""
    baseline = next(iter(runs.values()))
    out = {}
    for arm, by_seed in runs.items():
        values = {}
        for seed, rows in by_seed.items():
            budget = rounds_so_far(baseline[seed])[-1]
            within = [r for n, r in zip(rounds_so_far(rows), rows, strict=True) if n <= budget]
            values[seed] = run_value(within, metric, "all")
        mean, half = mean_interval(list(values.values()))
        out[arm] = {"by_seed": values, "mean": mean, "half_width": half}
    return out


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
            if "paired_diff" in m and not math.isnan(m["paired_diff"]["mean"]):
                d = m["paired_diff"]
                text += f" (vs {baseline}: {cell(d['mean'], d['half_width'])})"
            cells.append(text)
        lines.append(
            f"| {arm} | "
            + " | ".join(cells)
            + f" | {entry.get('verdict', 'baseline' if arm == baseline else 'beside')} |"
        )
    if "eval/accuracy before training" in result:
        lines += ["", f"eval/accuracy before training: {result['eval/accuracy before training']}"]
    for arm, m in result.get("at the baseline's rounds", {}).items():
        lines += ["", f"{claim.metric} of {arm} over the generation rounds the baseline sampled: "
                  f"{cell(m['mean'], m['half_width'])} (by seed {m['by_seed']})"]  # fmt: skip
    return "\n".join(lines) + "\n"


# What a plotted metric cannot leave: a 95% band over 3 seeds can reach past it (a share near
# 0 gets a band below 0), and is cut there. Shares lie in [0, 1]; counts, lengths, times and
# entropies are at least 0. A metric not named here (reward/mean, a DPO margin) can be negative.
SHARES = ("clip/high", "clip/frac", "batch/response_utilisation", "response/truncated_frac",
          "reward/math", "eval/accuracy", "eval/reward/accuracy")  # fmt: skip
AT_LEAST_ZERO = ("actor/entropy", "batch/gen_batches", "response/length_mean",
                 "samples/wrong_length", "samples/right_length", "time/step")  # fmt: skip


def bounds(metric: str) -> tuple[float, float]:
    if metric in SHARES:
        return 0.0, 1.0
    return (0.0, math.inf) if metric in AT_LEAST_ZERO else (-math.inf, math.inf)


# A figure has at most two panels a row, each PANEL inches at DPI: 800 pixels wide, which the
# pages show at about 750 (their content column on a 1280-pixel screen), so that text of
# FONT_PT points is shown at 10 or more.
PANEL, DPI, FONT_PT = (4.0, 3.2), 100, 11


def plot(claim: Claim, runs: dict[str, dict[int, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (claim.metric, *claim.also)
    panels = len(metrics) + claim.by_rounds
    cols, rows = min(panels, 2), math.ceil(panels / 2)
    with plt.rc_context({"font.size": FONT_PT, "legend.fontsize": FONT_PT}):
        fig, grid = plt.subplots(rows, cols, figsize=(PANEL[0] * cols, PANEL[1] * rows),
                                 squeeze=False)  # fmt: skip
        axes = list(grid.flat)
        for ax in axes[panels:]:  # an odd number of panels leaves the last cell empty
            ax.set_visible(False)
        for ax, metric in zip(axes, metrics, strict=False):
            draw_metric(ax, metric, runs)
        if claim.by_rounds:
            plot_by_rounds(axes[panels - 1], claim.metric, runs)
        axes[0].legend()
        fig.suptitle(f"{claim.source}: mean over seeds, 95% band")
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    plt.close(fig)


def draw_metric(ax, metric: str, runs: dict[str, dict[int, list[dict]]]) -> None:
    """Each arm's mean over seeds with its 95% band (a point and bar when the metric was
    measured once, after training), the band cut at the metric's `bounds`."""
    low_bound, high_bound = bounds(metric)
    steps: list[int] = []
    for arm, by_seed in runs.items():
        steps = sorted({r["step"] for rows in by_seed.values() for r in rows if metric in r})
        means, lows, highs = [], [], []
        for step in steps:
            values = [r[metric] for rows in by_seed.values() for r in rows
                      if r["step"] == step and metric in r]  # fmt: skip
            mean, half = mean_interval(values)
            half = 0.0 if math.isnan(half) else half
            means.append(mean)
            lows.append(max(mean - half, low_bound))
            highs.append(min(mean + half, high_bound))
        if len(steps) == 1:  # measured once, after training (rlcli eval): a point and interval
            bar = [[means[0] - lows[0]], [highs[0] - means[0]]]
            ax.errorbar([arm], means, yerr=bar, fmt="o", capsize=6, label=arm)
        else:  # a curve; or nothing, if no run of the arm logged it (smoke: right answers)
            ax.plot(steps, means, label=arm)
            ax.fill_between(steps, lows, highs, alpha=0.2)
    ax.set_title(metric)
    ax.set_xlabel("step" if len(steps) != 1 else f"after step {steps[0]}")
    ax.grid(alpha=0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("claim", nargs="?", choices=sorted(CLAIMS))
    parser.add_argument("--list", action="store_true", help="the claims and their commands")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/paper_effects"))
    parser.add_argument("--smoke", action="store_true", help="tiny model, one seed, two steps")
    parser.add_argument(
        "--keep-checkpoints", action="store_true", help="keep each run's final checkpoint"
    )
    args = parser.parse_args()
    if args.list or args.claim is None:
        for key, claim in CLAIMS.items():
            print(f"{key:18} {claim.source}: {claim.claim}")
        return
    claim, seeds = CLAIMS[args.claim], 1 if args.smoke else args.seeds
    out = (args.out / args.claim).resolve()
    if claim.prepare is not None:
        (out / "data").mkdir(parents=True, exist_ok=True)
        claim.prepare(out / "data", args.smoke)
    runs: dict[str, dict[int, list[dict]]] = {}
    for i, (arm, overrides) in enumerate(claim.arms.items()):
        sweep = out / f"arm{i}"
        steps = 2 if args.smoke else claim.steps
        wanted = arm_overrides(claim, overrides, sweep, args.smoke)
        if (ran := ran_with(sweep)) is not None and not same_overrides(ran, wanted):
            # The claim changed since: neither mix the two nor delete what ran.
            sys.exit(
                f"paper_effects: {sweep} ran with {' '.join(ran)}, but the arm {arm!r} is now "
                f"{' '.join(wanted)}. Move that directory away (or pass another --out) to run "
                "the arm again."
            )
        done = runs_by_seed(sweep) if sweep.is_dir() else {}
        # An arm whose every seed ran to the end is not run again (a later claim reuses it).
        if sorted(done) != list(range(seeds)) or any(len(r) < steps for r in done.values()):
            run_arm(wanted, seeds, sweep)
        for job in jobs(sweep):
            if claim.evaluate_after:
                evaluate_run(job, args.smoke)
            if not args.keep_checkpoints:  # 1.5 GiB a run, and the claims read only the metrics
                shutil.rmtree(job / "checkpoints", ignore_errors=True)
        runs[arm] = runs_by_seed(sweep)
    result = summarise(claim, runs)
    if claim.by_rounds:
        result["at the baseline's rounds"] = at_baseline_rounds(claim.metric, runs)
    before = out / "data" / "before" / "eval.json"
    if before.exists():  # the model the arms start from, evaluated as each run is
        result["eval/accuracy before training"] = json.loads(before.read_text())["accuracy"]
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    text = markdown(args.claim, claim, result, seeds)
    (out / "result.md").write_text(text)
    plot(claim, runs, out / "curves.png")
    print(text + f"\nwritten to {out}")


def plot_by_rounds(ax, metric: str, runs: dict[str, dict[int, list[dict]]]) -> None:
    """METRIC against the generation rounds sampled so far, one line per seed: the seeds of an
    arm that samples until its groups differ reach a step after different numbers of rounds, so
    there is no common x to average at."""
    for colour, (arm, by_seed) in enumerate(runs.items()):
        for seed, rows in sorted(by_seed.items()):
            rounds = rounds_so_far(rows)
            points = [(n, r[metric]) for n, r in zip(rounds, rows, strict=True) if metric in r]
            x, y = zip(*points, strict=True)
            ax.plot(x, y, color=f"C{colour}", alpha=0.6,
                    label=arm if seed == min(by_seed) else None)  # fmt: skip
    ax.set_title(f"{metric}, by generation round")
    ax.set_xlabel("generation rounds so far")
    ax.grid(alpha=0.3)
    ax.legend()


if __name__ == "__main__":
    main()
