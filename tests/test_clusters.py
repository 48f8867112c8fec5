"""Clusters above the example (issue 63): examples that share a premise, question or context move as one block in
every null and are resampled together in every bootstrap. On planted shared-premise data (100 premises × 3
hypotheses, d = 20, nothing shared but the premise) the similarity stage's own functions (``phang_result`` with the
stage's default params) keep the false-positive rate in [0.02, 0.08] and the interval's coverage ≥ 0.9 with the
premises as blocks, and fail without them. Seeds are fixed, so the rates are the same on every run;
benchmarks/calibration.py --structured --premises runs the same design with more draws and every measure. The calibrations (hundreds of draws through the stage's
null and bootstrap: about 100 CPU-seconds) are marked `integration`, the full tier's; the check that they can fail
and the block draws stay in the fast tier."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from layersim.experiments.compare import Probe, probe_rows
from layersim.params.schema import SimilarityParams
from layersim.similarity import similarity
from layersim.similarity.comparisons import stacked_matrix
from layersim.similarity.inference.exchangeability import block_permutations, null_units
from layersim.similarity.results import phang_result, settings

PREMISES, HYPOTHESES, WIDTH = 100, 3, 20
MIXING = np.random.default_rng(7).normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)


def _shared_premise(rng, premise_sd: float, premises: int = PREMISES, signal: float = 0.0):
    """x = a_p + e, y = signal·x·A + b_p + f: a, b per premise (sd `premise_sd`), e, f per row (sd 1)."""
    premise = np.repeat(np.arange(premises), HYPOTHESES)
    x = premise_sd * rng.normal(size=(premises, WIDTH))[premise] + rng.normal(size=(len(premise), WIDTH))
    y = premise_sd * rng.normal(size=(premises, WIDTH))[premise] + rng.normal(size=(len(premise), WIDTH))
    return x, y + signal * x @ MIXING, premise


def _stage(measure: str, x, y, groups, seed: int, bootstrap: int = 0):
    """FT–ORIG's p-value and interval of one layer pair as the similarity stage computes them (its defaults)."""
    options, uncertainty = settings(SimilarityParams())
    uncertainty = dataclasses.replace(uncertainty, seed=seed, bootstrap=bootstrap)
    models, options = {"ORIG": [x], "FT[1]": [y]}, options.get(measure, {})
    result = phang_result(measure, stacked_matrix(measure, models, **options), {"ORIG": 1, "FT[1]": 1},
                          models=models, uncertainty=uncertainty, groups=groups, options=options)
    found = next(c for c in result.comparisons if c.key == "ft_orig")
    return found.p_value[0, 0], found.interval


def _false_positives(measure: str, premise_sd: float, draws: int, clustered: bool) -> float:
    rng = np.random.default_rng(63)
    p = []
    for k in range(draws):
        x, y, premise = _shared_premise(rng, premise_sd)
        p.append(_stage(measure, x, y, premise if clustered else None, k)[0])
    return float(np.mean(np.array(p) <= 0.05))


@pytest.mark.integration
@pytest.mark.parametrize("measure, premise_sd, draws", [
    ("linear_cka", 0.5, 200), ("linear_cka", 1.0, 200), ("svcca", 1.0, 100), ("neuronsim", 1.0, 100)])
def test_premises_as_blocks_keep_the_false_positive_rate(measure, premise_sd, draws):
    """The stage's null with the premises as blocks rejects at its level (the stage's default measures but PWCCA,
    whose null costs 4× more: the benchmark runs it, 200 draws)."""
    assert 0.02 <= _false_positives(measure, premise_sd, draws, clustered=True) <= 0.08


def test_examples_as_blocks_reject_far_too_often_when_they_share_a_premise():
    """The check above can fail: one example per block (before clusters) rejects H0 in most draws at sd 1."""
    assert _false_positives("linear_cka", 1.0, 40, clustered=False) > 0.5


@pytest.mark.integration
def test_the_interval_over_premises_covers_the_population_value():
    """Linear CKA's interval (the stage's basic, 200 resamples) on y = 0.5·x·A + b_p + f, premise sd 1: resampling
    premises covers the value on 60,000 rows ≥ 90 % of the time; resampling examples misses it most of the time."""
    big = _shared_premise(np.random.default_rng(123), 1.0, premises=20_000, signal=0.5)
    truth = similarity("linear_cka", big[0], big[1])
    rng, covered = np.random.default_rng(64), {True: [], False: []}
    for k in range(100):
        x, y, premise = _shared_premise(rng, 1.0, signal=0.5)
        for clustered in covered:
            (low, high) = _stage("linear_cka", x, y, premise if clustered else None, k, bootstrap=200)[1]
            covered[clustered].append(low[0] <= truth <= high[0])
    assert np.mean(covered[True]) >= 0.9 and np.mean(covered[False]) < 0.6, covered


def test_a_cluster_moves_whole_and_keeps_its_examples_words_together():
    """Word rows of examples grouped into clusters: every draw maps each cluster onto one cluster of its size and
    each example's words onto one example's words (position by position), never splitting either."""
    example = np.repeat(np.arange(12), [3, 2, 3, 2] * 3)        # 12 examples of 3 or 2 words
    cluster = np.repeat(np.arange(6), [5, 5, 5, 5, 5, 5])       # pairs of examples share a premise
    blocks = block_permutations(len(example), cluster)
    assert blocks.movable == 1.0
    for seed in range(20):
        perm = blocks.draw(np.random.default_rng(seed))
        for c in range(6):
            assert len(np.unique(cluster[perm[cluster == c]])) == 1
        for e in range(12):
            assert len(np.unique(example[perm[example == e]])) == 1
    assert null_units(len(example), cluster, unit="examples sharing their premise") == {
        "unit": "examples sharing their premise", "blocks": 6, "rows": 30, "movable": 1.0}
    assert null_units(4)["unit"] == "row"


def test_the_compare_probe_blocks_are_clusters_within_their_task():
    """Probe rows of examples that share a text get one block (within their task; ids repeat across tasks)."""
    keys = np.array([[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]])
    clusters = np.array([[0, 0, 0], [0, 1, 0], [0, 2, 2], [1, 0, 0], [1, 1, 1]])  # task 0: examples 0 and 1 share
    _, strata, groups = probe_rows({"ORIG": Probe({"cls": [np.zeros((5, 2))]}, example_keys=keys,
                                                  clusters=clusters)}, "cls")
    np.testing.assert_array_equal(strata, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(groups, [0, 0, 1, 2, 3])
