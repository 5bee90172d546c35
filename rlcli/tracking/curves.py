"""Training curves from `metrics.jsonl`: each run's `curves.png`, `rlcli plot`, a sweep's chart.

Small multiples against the step, one panel per metric a run logged (reward, held-out
accuracy, loss, gradient norm, response length, entropy, clip fraction, KL, a learning rate
that moves, tool calls), one line per run, every panel over the same steps. Drawn with
matplotlib's object API on the Agg canvas, so nothing needs a display and no pyplot state is
shared between runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rlcli.tracking.metrics import read_metrics

CURVES_FILE = "curves.png"
# Panels with more points than this are drawn as plain lines, fewer get a dot per step.
MARKER_LIMIT = 40


@dataclass(frozen=True)
class Panel:
    """One panel: the first of `keys` a run logs is its line (runs may differ)."""

    keys: tuple[str, ...]
    # Logged only at some steps (held-out evaluations): points joined across the steps
    # between them, each marked, rather than gaps.
    sparse: bool = False
    # Metrics of the same scale drawn in the same panel, dotted, for the runs that log them.
    extra: tuple[str, ...] = ()
    # Drawn only for a run whose values change: a constant learning rate is no news.
    varying: bool = False
    # Shares that sum to 1, drawn stacked: the metrics named this prefix and a number
    # (rollout/staleness_0, _1, ...), for one run at a time.
    stacked: str | None = None


REWARD = Panel(("reward/mean", "reward/accuracy"))  # DPO logs the accuracy of its pairs
HELD_OUT = Panel(("eval/accuracy",), sparse=True)  # trainer.eval_every
PANELS = (
    REWARD,
    HELD_OUT,
    # The loss minimised: DPO's objective; RL's surrogate, whose level says little about
    # progress but whose spikes, NaNs and flat zeros (nothing trained) do.
    Panel(("loss/policy",)),
    # The global gradient norm before clipping (trainer.max_grad_norm).
    Panel(("actor/grad_norm",)),
    Panel(("response/length_mean",)),
    Panel(("actor/entropy",)),
    Panel(("clip/frac",)),
    # KL to the reference when beta > 0, else how far each update moved the policy.
    Panel(("loss/kl", "policy/approx_kl")),
    Panel(("actor/lr",), varying=True),  # trainer.warmup_steps, trainer.lr_scheduler
    # env=...: tool calls in each step's episodes, and the failed ones.
    Panel(("env/tool_calls",), extra=("env/tool_errors",)),
    # Rollout workers streaming ahead (sampler.max_staleness): the share of trained tokens
    # 0, 1, 2, ... updates old, each step.
    Panel(("rollout/staleness_0",), varying=True, stacked="rollout/staleness_"),
)

Runs = dict[str, list[dict]]  # label -> rows of metrics.jsonl


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of `key`, NaN where a step did not log it or logged null (a gap)."""
    steps = [row["step"] for row in rows]
    values = [math.nan if row.get(key) is None else float(row[key]) for row in rows]
    return steps, values


def has_values(rows: list[dict], key: str) -> bool:
    return any(math.isfinite(v) for v in series(rows, key)[1])


def varies(rows: list[dict], key: str) -> bool:
    return len({v for v in series(rows, key)[1] if math.isfinite(v)}) > 1


def panel_key(panel: Panel, rows: list[dict]) -> str | None:
    """The key this run draws in `panel`, or None when the run has none of its metrics."""
    key = next((key for key in panel.keys if has_values(rows, key)), None)
    if key is not None and panel.varying and not varies(rows, key):
        return None
    return key


def panel_lines(runs: Runs, panels=PANELS) -> list[dict[str, str]]:
    """Per panel some run has: {label: key} of the runs drawn in it."""
    return [keys for _, keys in drawn_panels(runs, panels)]


def drawn_panels(runs: Runs, panels=PANELS) -> list[tuple[Panel, dict[str, str]]]:
    """The panels some run has, each with {label: key} of the runs drawn in it."""
    drawn = []
    for panel in panels:
        if panel.stacked is not None and len(runs) > 1:
            continue  # stacked areas of several runs would hide each other
        keys = {label: panel_key(panel, rows) for label, rows in runs.items()}
        keys = {label: key for label, key in keys.items() if key}
        if keys:
            drawn.append((panel, keys))
    return drawn


def line_styles(labels) -> dict[str, dict]:
    """A colour per run, and past ten runs a new dash pattern, so no two runs look alike."""
    dashes = ("-", "--", ":", "-.")
    return {
        label: {"color": f"C{i % 10}", "linestyle": dashes[i // 10 % len(dashes)]}
        for i, label in enumerate(labels)
    }


def step_range(runs: Runs) -> tuple[float, float]:
    """The steps every panel spans (0 when a run evaluated before its first step)."""
    steps = [row["step"] for rows in runs.values() for row in rows] or [1]
    low, high = min(steps), max(steps)
    margin = max(0.5, 0.03 * (high - low))
    return low - margin, high + margin


def draw_line(ax, rows: list[dict], key: str, style: dict, sparse: bool) -> None:
    """One run's line of `key` against the step."""
    steps, values = series(rows, key)
    if sparse:
        points = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
        steps, values = [s for s, _ in points], [v for _, v in points]
    marker = "o" if sparse or len(steps) <= MARKER_LIMIT else None
    ax.plot(steps, values, marker=marker, markersize=3, **style)


def draw_stacked(ax, rows: list[dict], prefix: str) -> None:
    """The shares named `prefix` and a number, stacked against the step (a histogram per step)."""
    from matplotlib.ticker import MaxNLocator

    names = sorted(
        {k for row in rows for k in row if k.startswith(prefix) and k[len(prefix) :].isdigit()},
        key=lambda k: int(k[len(prefix) :]),
    )
    steps = [row["step"] for row in rows if names[0] in row]
    shares = [[row.get(k, 0.0) for row in rows if names[0] in row] for k in names]
    labels = [k[len(prefix) :] for k in names]
    ax.stackplot(steps, shares, labels=labels, step="mid")
    ax.legend(title="updates old", fontsize="small", loc="lower left")
    ax.set_title(f"{prefix}k (share of trained tokens)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def draw_panel(
    ax, runs: Runs, keys: dict[str, str], styles: dict[str, dict], panel: Panel = REWARD
) -> None:
    """One panel: each run's line of its key against the step (and of the panel's extra
    metrics, dotted, with a legend naming them)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    if panel.stacked is not None:
        draw_stacked(ax, runs[next(iter(keys))], panel.stacked)
        return
    extra = [k for k in panel.extra if any(has_values(runs[label], k) for label in keys)]
    for label, key in keys.items():
        draw_line(ax, runs[label], key, styles[label], panel.sparse)
        for other in extra:
            draw_line(ax, runs[label], other, {**styles[label], "linestyle": ":"}, panel.sparse)
    named = list(dict.fromkeys(keys.values()))
    if extra:
        lines = ["-"] * len(named) + [":"] * len(extra)
        handles = [Line2D([], [], color="0.3", linestyle=line) for line in lines]
        ax.legend(handles, [*named, *extra], fontsize="small")
    ax.set_title((" and " if extra else " / ").join([*named, *extra]))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.get_major_formatter().set_useOffset(False)  # an offset label covers the title
    ax.grid(alpha=0.3)


def draw_curves(runs: Runs, out: Path, title: str = "", panels=PANELS) -> Path:
    """Small multiples of `panels` against the step, one line per run; writes a PNG.

    A panel is drawn when some run logs one of its metrics; with several runs a legend
    below the panels names them.
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    drawn = drawn_panels(runs, panels)
    lines = [keys for _, keys in drawn]
    cols = min(3, max(1, len(lines)))
    rows = max(1, math.ceil(len(lines) / cols))
    size = (7.0, 4.5) if len(lines) <= 1 else (4.4 * cols, 3.2 * rows)
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    styles = line_styles(runs)
    span = step_range(runs)
    for ax, (panel, keys) in zip(axes, drawn, strict=False):
        draw_panel(ax, runs, keys, styles, panel)
        ax.set_xlim(*span)
    for ax in axes[len(lines) :]:
        ax.set_axis_off()
    if not lines:
        axes[0].text(0.5, 0.5, "no metrics logged", ha="center", va="center")
    if len(runs) > 1:
        handles = [Line2D([], [], marker="o", markersize=3, **style) for style in styles.values()]
        long_labels = max(len(label) for label in runs) > 30
        ncols = 1 if long_labels else min(3, len(runs))
        fig.legend(handles, list(runs), loc="outside lower center", ncols=ncols)
    if title:
        fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")  # "tight" keeps a wide legend whole
    return out


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Each run's directory name, or its path as given where two names are the same."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs, strict=True)]


def plot_runs(run_dirs: list[Path], out: Path) -> Path:
    """Draw the curves of the runs in `run_dirs` (each holding metrics.jsonl) into `out`."""
    runs = {label: read_metrics(d) for label, d in zip(run_labels(run_dirs), run_dirs, strict=True)}
    title = next(iter(runs)) if len(runs) == 1 else ""
    return draw_curves(runs, out, title)
