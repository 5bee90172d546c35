"""The paper effects' figures (scripts/paper_effects.py, docs/paper-effects.md): text readable
at the size the pages show them, and 95% bands that stay where the metric can be (a share in
[0, 1], a count or length at or above 0), on made-up runs of three seeds."""

import dataclasses
import sys

import matplotlib.pyplot as plt
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import paper_effects  # noqa: E402
from paper_effects import AT_LEAST_ZERO, CLAIMS, SHARES, plot  # noqa: E402

# The pages' content column on a 1280-pixel-wide screen, beside both sidebars: a wider figure
# is shown shrunk to it.
SHOWN_WIDTH_PX = 750
# The metrics of the claims that can be negative, by design.
SIGNED = {"reward/mean", "eval/reward/margin"}


def runs(metric: str, by_seed: list[list[float]], steps=(1, 2, 3)) -> dict:
    """Two arms alike, each seed's value of `metric` at each of `steps`."""
    arm = {seed: [{"step": s, metric: v} for s, v in zip(steps, values, strict=True)]
           for seed, values in enumerate(by_seed)}  # fmt: skip
    return {"baseline": arm, "other": arm}


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """The figure `plot` draws, kept open (it closes it once saved)."""
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)

    def draw(claim, runs_):
        plot(claim, runs_, tmp_path / "curves.png")
        return figures[-1]

    return draw


def test_a_shares_band_is_cut_at_0_and_1(drawn):
    claim = dataclasses.replace(CLAIMS["gspo_clipping"], metric="clip/frac", also=())
    # Mean 0.1, and a 95% half-width over three seeds of about 0.43: the band would reach -0.33.
    figure = drawn(claim, runs("clip/frac", [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.3, 0.3, 0.3]]))
    band = figure.axes[0].collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == 0.0 and band[:, 1].max() == pytest.approx(0.1 + 0.43, abs=0.01)

    # Measured once, after training: the interval's bar stops at 1 above.
    claim = dataclasses.replace(CLAIMS["dpo_pairs"], metric="eval/accuracy", also=())
    figure = drawn(claim, runs("eval/accuracy", [[1.0], [1.0], [0.7]], steps=(20,)))
    bars = figure.axes[0].collections[0].get_segments()
    ends = sorted(y for segment in bars for _, y in segment)
    assert ends[-1] == 1.0 and ends[0] == pytest.approx(0.9 - 0.43, abs=0.01)


def test_a_signed_metrics_band_is_left_whole(drawn):
    claim = dataclasses.replace(CLAIMS["gspo_clipping"], metric="reward/mean", also=())
    figure = drawn(claim, runs("reward/mean", [[0.0] * 3, [0.0] * 3, [0.3] * 3]))
    band = figure.axes[0].collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(0.1 - 0.43, abs=0.01)


@pytest.mark.parametrize("key", ["dynamic_sampling", "gspo_clipping", "dpo_pairs"])
def test_the_text_is_10_points_or_more_as_the_pages_show_it(drawn, key):
    claim = CLAIMS[key]
    metrics = (claim.metric, *claim.also, "batch/gen_batches")
    figure = drawn(claim, {"baseline": {0: [{"step": s, **dict.fromkeys(metrics, 0.5)}
                                            for s in (1, 2)]}})  # fmt: skip
    shrink = min(1.0, SHOWN_WIDTH_PX / (figure.get_figwidth() * paper_effects.DPI))
    texts = [figure._suptitle]
    for ax in figure.axes:
        if ax.get_visible():
            texts += [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.title, ax.xaxis.label]
            texts += ax.get_legend().get_texts() if ax.get_legend() else []
    sizes = {t.get_fontsize() * shrink for t in texts if t.get_text()}
    assert sizes and min(sizes) >= 10, sorted(sizes)


def test_every_plotted_metric_has_its_range_said():
    plotted = {m for claim in CLAIMS.values() for m in (claim.metric, *claim.also)}
    assert plotted - set(SHARES) - set(AT_LEAST_ZERO) - SIGNED == set()
