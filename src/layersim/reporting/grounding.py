"""The grounding stage's figure and the report's table of it: the measures of each pooling ranked by ReSi's tests
(layersim.experiments.grounding), each test's score with its 95 % paired-bootstrap interval, and the mean rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from layersim.reporting.cells import fmt
from layersim.reporting.html import Table

if TYPE_CHECKING:  # the report reads details only: no scipy or scikit-learn for it
    from layersim.similarity.grounding import Ranking

TEST_LABELS = {"monotonicity": "layer monotonicity (ReSi's correlation, 1: best)",
               "separation": "seeds vs fine-tuning (AUPRC, 1: best)"}


def ranking_figure(rankings: Mapping[str, Ranking], title: str, labels: Mapping[str, str] | None = None):
    """Per pooling, or per group of tests (a row of panels): each test's score per measure with its interval,
    measures best first, and the mean rank over the tests with its interval; `labels`: the tests' titles beyond
    the grounding stage's own."""
    import matplotlib.pyplot as plt

    labels = {**TEST_LABELS, **(labels or {})}
    columns = max(len(r.tests) for r in rankings.values()) + 1
    height = sum(1.0 + 0.35 * len(r.measures) for r in rankings.values())
    fig, axes = plt.subplots(len(rankings), columns, figsize=(3.6 * columns, 0.6 + height), squeeze=False,
                             constrained_layout=True)
    for row, (pooling, ranking) in zip(axes, rankings.items()):
        order = sorted(ranking.measures, key=lambda m: ranking.mean_rank[m])
        y = np.arange(len(order))[::-1]
        panels = [(labels[test], ranking.score[test], ranking.interval[test]) for test in ranking.tests]
        panels.append(("mean rank over the tests (1: best)", ranking.mean_rank, ranking.rank_interval))
        for ax, (label, score, interval) in zip(row, panels):
            values = np.array([score[m] for m in order], dtype=float)
            low = np.array([interval[m][0] for m in order], dtype=float)
            high = np.array([interval[m][1] for m in order], dtype=float)
            ax.errorbar(values, y, xerr=[np.clip(values - low, 0, None), np.clip(high - values, 0, None)], fmt="o",
                        color="tab:blue", capsize=3)
            ax.set_yticks(y, order, fontsize=8)
            ax.set_title(f"{pooling}: {label}", fontsize=8)
            ax.grid(axis="x", alpha=0.3)
        for ax in row[len(panels):]:
            ax.set_visible(False)
    fig.suptitle(f"{title}\n(95 % intervals: paired bootstrap over runs and layers)", fontsize=9)
    return fig


HEADER = ("pooling", "place", "measure", "mean rank [95 %]", "layer monotonicity [95 %]", "random-init control",
          "seeds vs fine-tuning AUPRC [95 %]", "AUPRC by chance")


def _interval(entry: Mapping | None) -> str:
    if not entry or entry.get("score") is None:
        return "–"
    return f"{fmt(entry['score'])} [{fmt(entry.get('low'))}, {fmt(entry.get('high'))}]"


def grounding_table(details: Mapping | None) -> Table | None:
    """The report's ranking table from the grounding stage's details (None when the stage was off or not run)."""
    if not details or not details.get("enabled"):
        return None
    rows = []
    for pooling, measures in details.items():
        if not isinstance(measures, Mapping):
            continue
        ranked = sorted(((m, v) for m, v in measures.items() if isinstance(v, Mapping) and "rank" in v),
                        key=lambda item: item[1]["rank"]["mean_rank"])
        for place, (measure, entry) in enumerate(ranked, 1):
            rank, separation = entry["rank"], entry.get("separation")
            rows.append([pooling, place, measure,
                         f"{fmt(rank['mean_rank'])} [{fmt(rank['low'])}, {fmt(rank['high'])}]",
                         _interval(entry["monotonicity"]), fmt(entry["monotonicity"].get("random_control")),
                         _interval(separation), fmt(separation.get("chance")) if separation else "–"])
    return Table("Which measure to trust on this model (ReSi's grounding tests)", HEADER, rows,
                 "Layer monotonicity: within each trained model (ORIG and every seed), does a layer's similarity to the "
                 "others fall with their distance (ReSi's Spearman statistic; the random-init control beside it, not "
                 "ranked). Seeds vs fine-tuning: per layer, does the measure rank FT[i]–FT[j] pairs above FT[i]–ORIG "
                 "(AUPRC). Mean rank over the two tests; 95 % intervals from a paired bootstrap over runs and layers.")
