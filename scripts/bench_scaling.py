"""How a GRPO step's cost grows with the work, rlcli against TRL: seconds per step, completion
tokens per second and peak memory for response caps 48, 128 and 256 tokens x 16, 32 and 64
responses per step (4 per prompt), SmolLM2-135M in bfloat16, each point rlcli's
`scripts/bench.py` and then TRL's `scripts/bench_trl.py` in fresh processes, one at a time.

    .venv/bin/python scripts/bench_scaling.py                    # the 9 points, 3 steps each
    .venv/bin/python scripts/bench_scaling.py --caps 48 --responses 16 --steps 2

Writes the figures to `--json` (after each point, so an interrupted sweep keeps what it
measured), a Markdown table to stdout and a plot to `--plot`. The engine's KV cache is set to
0.5 GiB at every point (`sampler.cpu_kv_cache_gb`: the default 0.125 holds ~5,800 tokens,
fewer than 32 responses of 256 tokens need), as a user scaling the batch would.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent


def last_json(stdout: str) -> dict:
    """The JSON object a bench script prints last (its report)."""
    start = stdout.rindex("\n{\n") + 1 if "\n{\n" in stdout else stdout.index("{\n")
    return json.loads(stdout[start:])


def run(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return last_json(done.stdout)


def measure(cap: int, responses: int, steps: int, trl: bool) -> dict:
    prompts = responses // 4
    rlcli = run([
        sys.executable, str(SCRIPTS / "bench.py"), "--steps", str(steps),
        f"sampler.max_new_tokens={cap}", f"trainer.prompts_per_step={prompts}",
        "sampler.cpu_kv_cache_gb=0.5",
    ])  # fmt: skip
    point = {
        "cap": cap,
        "responses": responses,
        "rlcli_step_median_s": rlcli["step_median_s"],
        "rlcli_step_range_s": rlcli["step_range_s"],
        "rlcli_tokens_per_s": rlcli["tokens_per_s"],
        "rlcli_peak_gib": rlcli["peak_memory_gib"],
        "rlcli_phases_s": {
            k.split("/")[1]: v for k, v in rlcli.items() if k.startswith("seconds/")
        },
    }
    if trl:
        peer = run([
            sys.executable, str(SCRIPTS / "bench_trl.py"), "--bf16", "--steps", str(steps),
            "--prompts", str(prompts), "--max-new-tokens", str(cap),
        ])  # fmt: skip
        seconds = peer["step_seconds"]
        point |= {
            "trl_step_median_s": peer["step_median_s"],
            "trl_step_range_s": [min(seconds), max(seconds)],
            "trl_tokens_per_s": round(
                peer["completion_tokens_per_step"] / peer["step_median_s"], 1
            ),
            "trl_peak_gib": peer["peak_memory_gib"],
            "ratio": round(rlcli["step_median_s"] / peer["step_median_s"], 3),
        }
    return point


def table(points: list[dict]) -> str:
    lines = [
        "| cap | responses | rlcli s/step (range) | TRL s/step (range) | rlcli / TRL "
        "| tokens/s rlcli, TRL | peak GiB rlcli, TRL |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lo, hi = p["rlcli_step_range_s"]
        row = (
            f"| {p['cap']} | {p['responses']} | {p['rlcli_step_median_s']:.2f} ({lo:.2f}-{hi:.2f}) "
        )
        if "trl_step_median_s" in p:
            tlo, thi = p["trl_step_range_s"]
            row += (
                f"| {p['trl_step_median_s']:.2f} ({tlo:.2f}-{thi:.2f}) | **{p['ratio']:.2f}** "
                f"| {p['rlcli_tokens_per_s']:.0f}, {p['trl_tokens_per_s']:.0f} "
                f"| {p['rlcli_peak_gib']:.2f}, {p['trl_peak_gib']:.2f} |"
            )
        else:
            row += f"| | | {p['rlcli_tokens_per_s']:.0f} | {p['rlcli_peak_gib']:.2f} |"
        lines.append(row)
    return "\n".join(lines)


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = sorted({p["cap"] for p in points})
    fig, axes = plt.subplots(1, len(caps), figsize=(4 * len(caps), 3.4), squeeze=False)
    for ax, cap in zip(axes[0], caps, strict=True):
        at = sorted((p for p in points if p["cap"] == cap), key=lambda p: p["responses"])
        x = [p["responses"] for p in at]
        for who, style in (("rlcli", "o-"), ("trl", "s--")):
            if all(f"{who}_step_median_s" in p for p in at):
                y = [p[f"{who}_step_median_s"] for p in at]
                lo = [p[f"{who}_step_median_s"] - p[f"{who}_step_range_s"][0] for p in at]
                hi = [p[f"{who}_step_range_s"][1] - p[f"{who}_step_median_s"] for p in at]
                label = "rlcli" if who == "rlcli" else "TRL 1.16 (bf16)"
                ax.errorbar(x, y, yerr=[lo, hi], fmt=style, capsize=3, label=label)
        ax.set_title(f"responses of <= {cap} tokens")
        ax.set_xlabel("responses per step")
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("seconds per step (median, range)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", type=int, nargs="+", default=[48, 128, 256])
    parser.add_argument("--responses", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--steps", type=int, default=3, help="steps counted at each point")
    parser.add_argument("--no-trl", action="store_true", help="rlcli alone (no peer)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench_scaling.json"))
    parser.add_argument("--plot", type=Path, default=Path("runs/bench_scaling.png"))
    args = parser.parse_args()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    points = []
    for cap in args.caps:
        for responses in args.responses:
            points.append(measure(cap, responses, args.steps, not args.no_trl))
            args.json.write_text(json.dumps(points, indent=1))
            print(json.dumps(points[-1]), flush=True)
    print(table(points))
    plot(points, args.plot)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
