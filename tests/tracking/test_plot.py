"""curves.png and `rlcli plot` draw the same panels: the loss, the gradient norm, a learning
rate only when it moves, tool calls and errors beside the reward, every panel over the same
steps (step 0 included when a run evaluated before training)."""

import json
import subprocess
import sys

from rlcli.tracking.curves import PANELS, drawn_panels, panel_lines, plot_runs, step_range

# An RL run with tools, a cosine learning rate and an evaluation before its first step.
TOOLS_ROWS = [{"step": 0, "eval/accuracy": 0.1}] + [
    {"step": s, "reward/mean": 0.1 * s, "loss/policy": 0.01 / s, "actor/grad_norm": 1.0 / s,
     "actor/lr": 1e-5 / s, "env/tool_calls": 4.0 * s, "env/tool_errors": 1.0, "time/step": 1.0}
    for s in (1, 2, 3)
]  # fmt: skip
# A run without tools whose learning rate stays where it is.
PLAIN_ROWS = [
    {"step": s, "reward/mean": 0.2, "loss/policy": -0.01, "actor/grad_norm": 0.5,
     "actor/lr": 1e-5, "time/step": 1.0}
    for s in (1, 2)
]  # fmt: skip


def test_loss_grad_norm_moving_lr_and_tool_panels():
    runs = {"tools": TOOLS_ROWS, "plain": PLAIN_ROWS}
    assert panel_lines(runs) == [
        {"tools": "reward/mean", "plain": "reward/mean"},
        {"tools": "eval/accuracy"},
        {"tools": "loss/policy", "plain": "loss/policy"},  # RL's loss too, not only DPO's
        {"tools": "actor/grad_norm", "plain": "actor/grad_norm"},
        {"tools": "actor/lr"},  # the constant one is no news
        {"tools": "env/tool_calls"},  # with env/tool_errors dotted in the same panel
    ]
    tools = [panel for panel, _ in drawn_panels(runs) if panel.keys == ("env/tool_calls",)]
    assert tools[0].extra == ("env/tool_errors",)
    assert panel_lines({"plain": PLAIN_ROWS}, PANELS[4:]) == []  # no tools, no moving lr
    low, high = step_range(runs)
    assert low < 0 < 3 < high  # every panel spans step 0 (the evaluation before training)


def write_run(run_dir, rows):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_rlcli_plot_draws_what_the_run_drew(tmp_path):
    run_dir = write_run(tmp_path / "run", TOOLS_ROWS)
    curves = plot_runs([run_dir], run_dir / "curves.png")  # what the run's tracker draws
    cmd = [sys.executable, "-m", "rlcli", "plot", str(run_dir), "--out", str(tmp_path / "re.png")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"rlcli: curves in {tmp_path / 're.png'}"
    assert (tmp_path / "re.png").read_bytes() == curves.read_bytes()


def test_a_streamed_run_draws_its_staleness_histogram(tmp_path):
    # sampler.max_staleness=2: step 1 fresh, then tokens 1 and 2 updates old.
    shares = [(1.0, 0.0, 0.0), (0.0, 0.6, 0.4), (0.0, 0.2, 0.8)]
    streamed = [
        {"step": s, "reward/mean": 0.1, **{f"rollout/staleness_{k}": v for k, v in enumerate(row)}}
        for s, row in enumerate(shares, start=1)
    ]
    synchronous = [{"step": s, "reward/mean": 0.1, "rollout/staleness_0": 1.0} for s in (1, 2)]
    histogram = [p for p, _ in drawn_panels({"streamed": streamed}) if p.stacked]
    assert [p.keys for p in histogram] == [("rollout/staleness_0",)]
    assert not [p for p, _ in drawn_panels({"sync": synchronous}) if p.stacked]  # nothing moves
    # Several runs: stacked areas would hide each other, so the panel is left out.
    assert not [p for p, _ in drawn_panels({"a": streamed, "b": streamed}) if p.stacked]
    out = plot_runs([write_run(tmp_path / "run", streamed)], tmp_path / "curves.png")
    assert out.stat().st_size > 10_000
