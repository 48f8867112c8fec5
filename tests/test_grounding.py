"""ReSi's grounding tests on layer × layer matrices (layersim.similarity.grounding) and the ranking of measures over
them; the grounding stage's work on fake activation tables (layersim.experiments.grounding)."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.experiments import similarity_inputs
from layersim.errors import LayersimError
from layersim.similarity.grounding import (monotonicity_conformity, monotonicity_correlation, rank_measures,
                                           separation_auprc, separation_chance, separation_per_layer)


def planted(num_layers: int, decay=lambda d: 1.0 - 0.1 * d) -> np.ndarray:
    """A matrix whose similarity falls strictly with layer distance."""
    i, j = np.indices((num_layers, num_layers))
    return decay(np.abs(i - j).astype(float))


@pytest.mark.parametrize("num_layers", [3, 7, 13])
def test_a_planted_monotone_matrix_scores_one_and_its_reverse_minus_one(num_layers):
    matrix = planted(num_layers)
    assert monotonicity_correlation(matrix) == pytest.approx(1.0)
    assert monotonicity_conformity(matrix) == 1.0
    assert monotonicity_correlation(planted(num_layers, lambda d: 0.1 * d)) == pytest.approx(-1.0)
    assert monotonicity_conformity(planted(num_layers, lambda d: 0.1 * d)) == 0.0


def test_any_strictly_decreasing_profile_scores_one_whatever_its_scale():
    """Spearman reads ranks only: a steep, a shallow and an exponential fall all score 1."""
    for decay in (lambda d: np.exp(-d), lambda d: 5 - 0.001 * d, lambda d: 1 / (1 + d)):
        assert monotonicity_correlation(planted(9, decay)) == pytest.approx(1.0)


def test_shuffled_matrices_score_about_zero():
    rng = np.random.default_rng(0)
    scores = [monotonicity_correlation(rng.permutation(planted(13).ravel()).reshape(13, 13)) for _ in range(200)]
    conformity = [monotonicity_conformity(rng.random((13, 13))) for _ in range(200)]
    assert abs(np.mean(scores)) < 0.03 and np.std(scores) < 0.2
    assert np.mean(conformity) == pytest.approx(0.5, abs=0.02)


def test_one_violation_is_counted_once_per_triple_and_direction():
    """Layers 0..3; swapping S[0, 2] and S[0, 3] breaks exactly the (0; 2, 3) triple forward (S[0, 1] stays above
    both): 1 of the 8 triples (4 forward, 4 backward) is out of order, and Spearman of row 0 forward drops."""
    matrix = planted(4)
    matrix[0, 2], matrix[0, 3] = matrix[0, 3], matrix[0, 2]
    assert monotonicity_conformity(matrix) == pytest.approx(7 / 8)
    # Row 0 forward: sims (0.9, 0.7, 0.8) against distances (1, 2, 3), Spearman −0.5 → 0.5; every other direction
    # with two layers or more (row 1 backward has one, row 3 backward three: 1) scores 1.
    assert monotonicity_correlation(matrix) == pytest.approx(np.mean([0.5, 1.0, 1.0, 1.0]))


def test_undefined_monotonicity_is_nan_and_a_matrix_too_small_is_refused():
    assert np.isnan(monotonicity_correlation(np.ones((5, 5))))  # constant rows: Spearman undefined everywhere
    nan = planted(5)
    nan[1, 3], nan[2, 0] = np.nan, 0.99  # row 1 forward left out; row 2 backward out of order
    # Triples per direction of two layers or more: row 0 forward 6, row 2 forward 1 and backward 1 (0.9 at distance
    # 1, 0.99 at 2: broken), row 3 backward 3, row 4 backward 6; row 1 forward holds the NaN.
    kept = 6 + 1 + 3 + 6
    assert monotonicity_conformity(nan) == pytest.approx(kept / (kept + 1))
    assert np.isnan(monotonicity_conformity(np.full((4, 4), np.nan)))
    with pytest.raises(LayersimError, match="at least 3 layers"):
        monotonicity_correlation(np.ones((2, 2)))
    with pytest.raises(LayersimError, match="square"):
        monotonicity_conformity(np.ones((3, 4)))


def test_auprc_of_a_perfect_separation_is_one_and_of_a_reversed_one_its_floor():
    assert separation_auprc([0.9, 0.8, 0.95], [0.1, 0.2, 0.3]) == 1.0
    # Positives last: precision at each positive's recall step is 1/4, 2/5, 3/6 → mean (Zhu's average precision).
    assert separation_auprc([0.1, 0.2, 0.3], [0.9, 0.8, 0.95]) == pytest.approx((1 / 4 + 2 / 5 + 3 / 6) / 3)
    assert separation_chance(1, 2) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)  # the positive at rank 1, 2 or 3
    assert np.isnan(separation_auprc([0.5], [np.nan])) and np.isnan(separation_auprc([], [0.1]))


@pytest.mark.parametrize("same, different", [(1, 2), (3, 3), (3, 6), (1, 1), (4, 0)])
def test_auprc_is_the_mean_precision_at_each_same_kind_pair_and_chance_its_mean_over_every_ordering(same, different):
    """Against the definition (no ties): for every placement of the same-kind pairs among all, the mean over them of
    the share of same-kind pairs ranked at or above each; chance is its mean over all placements (equally likely)."""
    from itertools import combinations

    total, values = same + different, []
    for places in combinations(range(total), same):  # positions, 0 = most similar
        scores = -np.arange(total, dtype=float)
        expected = np.mean([(k + 1) / (place + 1) for k, place in enumerate(places)])
        values.append(expected)
        positive = np.isin(np.arange(total), places)
        if different:
            assert separation_auprc(scores[positive], scores[~positive]) == pytest.approx(expected)
    assert separation_chance(same, different) == pytest.approx(np.mean(values))


def stacked(blocks: dict[str, np.ndarray], cross) -> tuple[np.ndarray, dict[str, int]]:
    """A stacked matrix of models with these own blocks, `cross(a, b)` the similarity of layer k of a and b at every
    pair of layers of two different models."""
    labels, size = list(blocks), len(next(iter(blocks.values())))
    matrix = np.zeros((size * len(labels),) * 2)
    for x, a in enumerate(labels):
        for y, b in enumerate(labels):
            matrix[x * size:(x + 1) * size, y * size:(y + 1) * size] = blocks[a] if a == b else cross(a, b)
    return matrix, {label: x * size for x, label in enumerate(labels)}


def test_seeds_closer_to_each_other_than_to_orig_separate_perfectly_at_every_layer():
    labels = ["ORIG", "FT[1]", "FT[2]", "FT[3]"]
    matrix, starts = stacked({label: planted(5) for label in labels},
                             lambda a, b: 0.5 if "ORIG" in (a, b) else 0.8)
    scores, same, different = separation_per_layer(matrix, starts, 5, "ORIG", labels[1:])
    assert (same, different) == (3, 3) and np.array_equal(scores, np.ones(5))
    reversed_matrix, starts = stacked({label: planted(5) for label in labels},
                                      lambda a, b: 0.8 if "ORIG" in (a, b) else 0.5)
    flipped, *_ = separation_per_layer(reversed_matrix, starts, 5, "ORIG", labels[1:])
    # Every seed pair below every FT–ORIG pair, all tied within their kind: one threshold reaches the first seed pair,
    # with every pair above it: precision 3 / 6.
    assert np.allclose(flipped, 0.5)


def test_an_asymmetric_measure_is_read_in_both_orders():
    """neuronsim(ft, orig) ≠ neuronsim(orig, ft): the pair's value is the mean of both orders, so neither order
    decides alone."""
    labels = ["ORIG", "FT[1]", "FT[2]"]
    matrix, starts = stacked({label: planted(3) for label in labels}, lambda a, b: 0.6)
    o, f1, f2 = starts["ORIG"], starts["FT[1]"], starts["FT[2]"]
    matrix[f1, f2], matrix[f2, f1] = 0.9, 0.5   # FT pair: 0.7 on average
    matrix[f1, o], matrix[o, f1] = 0.95, 0.3    # FT[1]–ORIG: 0.625, higher one way only
    scores, *_ = separation_per_layer(matrix, starts, 3, "ORIG", labels[1:])
    assert scores[0] == 1.0


def test_the_ranking_orders_measures_by_mean_rank_and_its_bootstrap_is_paired_and_seeded():
    units = {"monotonicity": {"good": [0.9, 0.95, 0.92], "mid": [0.5, 0.6, 0.55], "bad": [0.1, -0.1, 0.0]},
             "separation": {"good": [1.0, 1.0, 0.9, 1.0], "mid": [0.7, 0.8, 0.6, 0.7], "bad": [0.3, 0.4, 0.5, 0.2]}}
    ranking = rank_measures(units, 500, seed=3)
    assert ranking.mean_rank == {"good": 1.0, "mid": 2.0, "bad": 3.0}
    assert ranking.score["monotonicity"]["good"] == pytest.approx(np.mean([0.9, 0.95, 0.92]))
    low, high = ranking.interval["separation"]["mid"]
    assert 0.6 <= low <= 0.7 <= high <= 0.8
    assert ranking.top_share["good"] == 1.0 and ranking.rank_interval["good"] == (1.0, 1.0)
    assert rank_measures(units, 500, seed=3) == ranking


def test_a_measure_that_wins_one_test_and_loses_the_other_ties_and_nan_ranks_last():
    units = {"monotonicity": {"a": [0.9, 0.9], "b": [0.1, 0.2], "c": [np.nan, np.nan]},
             "separation": {"a": [0.2, 0.3], "b": [0.9, 1.0], "c": [0.1, np.nan]}}
    ranking = rank_measures(units, 200, seed=0)
    assert ranking.mean_rank["a"] == ranking.mean_rank["b"] == 1.5  # (1 + 2) / 2 each
    assert ranking.mean_rank["c"] == 3.0  # last on monotonicity (NaN) and on separation
    assert ranking.score["separation"]["c"] == 0.1  # the undefined layer is left out of the mean
    assert sum(ranking.top_share.values()) == pytest.approx(1.0)


def test_one_test_alone_ranks_and_no_test_is_refused():
    ranking = rank_measures({"monotonicity": {"a": [0.2], "b": [0.3]}}, 10, seed=0)
    assert ranking.tests == ("monotonicity",) and ranking.mean_rank == {"a": 2.0, "b": 1.0}
    with pytest.raises(LayersimError, match="no grounding test"):
        rank_measures({"monotonicity": {}}, 10, seed=0)


N, D, LAYERS = 80, 6, 4


def _tables(tmp_path, monkeypatch, seeds=(1, 2, 3)):
    """Activation tables of ORIG, the seeds and the random-init control (checkpoint metadata stubbed), whose layers
    drift step by step (so layer similarity falls with distance) and whose seeds share a fine-tuning direction
    that ORIG lacks (so seeds are closer to each other than to ORIG)."""
    import pyarrow as pa

    import layersim.experiments.similarity as similarity_task
    from layersim.data.io import ActivationWriter
    from layersim.models.random_control import RANDOM_RUN, random_run_metadata

    known = {"orig": {"model_digest": "a" * 64, "task_digest": "b" * 64, "num_layers": LAYERS, "hidden_size": D}}
    known |= {f"seed{s}": {**known["orig"], "model_digest": str(s) * 64} for s in seeds}
    monkeypatch.setattr(similarity_inputs, "run_expectations",
                        lambda checkpoints, runs: {run: dict(values) for run, values in known.items()})
    rng = np.random.default_rng(5)

    def drifting(start, step=0.8):
        layers = [start]
        for _ in range(LAYERS):
            layers.append(layers[-1] + step * rng.normal(size=(N, D)))
        return layers

    orig = drifting(rng.normal(size=(N, D)))
    shared = rng.normal(size=(N, D))  # what every seed's fine-tuning adds
    models = {"orig": orig} | {f"seed{s}": [layer + 2.0 * shared + 0.3 * rng.normal(size=(N, D)) for layer in orig]
                               for s in seeds}
    models[RANDOM_RUN] = drifting(rng.normal(size=(N, D)))
    metadata = known | {RANDOM_RUN: random_run_metadata(known["orig"], 0)}
    for run, layers in models.items():
        with ActivationWriter(tmp_path / f"{run}.cls.parquet", num_layers=LAYERS, hidden_size=D,
                              label_type=pa.int64(), metadata={"model": "m", "pooling": "cls", "split": "validation",
                                                               "task": "synth", "run": run, **metadata[run]}) as writer:
            writer.write(np.arange(N), np.zeros(N, dtype=np.int16), np.zeros(N, dtype=np.int64),
                         [layer.astype(np.float32) for layer in layers])


def _params(enabled=True, seeds=(1, 2, 3), measures=("linear_cka", "svcca", "neuronsim"), extra=()):
    from layersim.params import parse_params

    return parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": list(seeds),
                         "similarity": {"measures": {"cls": list(measures)}, "random_control": 0},
                         "grounding": {"enabled": enabled, "bootstrap": 200, "measures": list(extra)}})


def test_the_stage_work_ranks_every_measure_on_planted_runs_and_writes_a_table_and_figure(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from layersim.experiments.grounding import task_grounding
    from layersim.reporting.grounding import grounding_table
    from layersim.reporting.headlines import details_to_metrics, metrics_to_details

    _tables(tmp_path, monkeypatch)
    out = task_grounding(tmp_path, tmp_path, "synth", _params())
    cls = out.full["cls"]
    for measure in ("linear_cka", "svcca", "neuronsim"):
        entry = cls[measure]
        assert set(entry["monotonicity"]["per_run"]) == {"ORIG", "FT[1]", "FT[2]", "FT[3]"}
        assert entry["monotonicity"]["score"] > 0.5  # drifting layers: far layers are less alike
        assert entry["monotonicity"]["random_control"] is not None
        assert entry["separation"]["same_pairs"] == entry["separation"]["different_pairs"] == 3
        assert entry["separation"]["chance"] == pytest.approx(separation_chance(3, 3))
        assert len(entry["separation"]["per_layer"]) == LAYERS + 1
        assert entry["monotonicity"]["low"] <= entry["monotonicity"]["score"] <= entry["monotonicity"]["high"]
    assert cls["linear_cka"]["separation"]["score"] == 1.0  # the shared direction dominates: every layer separates
    assert [row["place"] for row in out.rows] == [1, 2, 3]
    assert [row["mean_rank"] for row in out.rows] == sorted(row["mean_rank"] for row in out.rows)
    assert out.headline == {"cls": {m: cls[m]["rank"]["mean_rank"] for m in ("linear_cka", "svcca", "neuronsim")}}
    table = grounding_table(details_to_metrics(metrics_to_details(out.full)))  # as the report reads it back
    assert [row[2] for row in table.rows] == [row["measure"] for row in out.rows]
    assert out.figure is not None
    plt.close("all")


def test_off_writes_only_that_it_is_off_and_one_seed_ranks_on_monotonicity_alone(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from layersim.experiments.grounding import task_grounding
    from layersim.reporting.grounding import grounding_table

    off = task_grounding(tmp_path / "nothing-here", tmp_path, "synth", _params(enabled=False))
    assert off.full["enabled"] is False and off.rows == [] and off.figure is None
    assert grounding_table(off.full) is None
    _tables(tmp_path, monkeypatch, seeds=(1,))
    one = task_grounding(tmp_path, tmp_path, "synth", _params(seeds=(1,)))
    assert "separation" not in one.full["cls"]["svcca"] and "needs two seeds" in one.full["cls"]["separation_unavailable"]
    assert all("separation" not in row for row in one.rows)
    plt.close("all")


@pytest.mark.parametrize("value, fragment", [(0, "grounding.bootstrap"), ("yes", "grounding.enabled"),
                                             (-1, "grounding.seed")])
def test_bad_grounding_params_are_refused_in_one_sentence(value, fragment):
    from layersim.params import parse_params

    key = fragment.split(".")[1]
    with pytest.raises(LayersimError, match=fragment.replace(".", r"\.")):
        parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1], "grounding": {key: value}})


def test_grounding_measures_are_ranked_beside_similarity_measures_with_the_values_they_would_have_there(
        tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from layersim.experiments.grounding import task_grounding

    _tables(tmp_path, monkeypatch)
    out = task_grounding(tmp_path, tmp_path, "synth", _params(extra=("distance_correlation", "cknna", "svcca")))
    assert {row["measure"] for row in out.rows} == {"linear_cka", "svcca", "neuronsim", "distance_correlation", "cknna"}
    assert sorted(row["place"] for row in out.rows) == [1, 2, 3, 4, 5] and "left_out" not in out.full["cls"]
    assert set(out.headline["cls"]) == {row["measure"] for row in out.rows}
    there = task_grounding(tmp_path, tmp_path, "synth", _params(measures=("distance_correlation", "cknna")))
    for measure in ("distance_correlation", "cknna"):
        for test in ("monotonicity", "separation"):
            assert out.full["cls"][measure][test]["score"] == there.full["cls"][measure][test]["score"]
    plt.close("all")


def test_a_grounding_measure_a_pooling_cannot_compute_is_left_out_with_its_reason_and_refused_if_none_can(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from layersim.experiments import grounding
    from layersim.experiments.grounding import computable_extras, task_grounding

    wide = SimpleNamespace(num_rows=80, hidden_size=100)  # wider than its examples
    kept, left_out = computable_extras(("cknna", "linear_regression", "gulp"), wide, {"gulp": {"ridge": 0.0}})
    assert kept == ("cknna",) and set(left_out) == {"linear_regression", "gulp"}
    assert "n = 80" in left_out["linear_regression"] and "ridge > 0" in left_out["gulp"]
    assert computable_extras(("gulp",), wide, {"gulp": {"ridge": 0.1}}) == (("gulp",), {})
    _tables(tmp_path, monkeypatch)
    real = grounding.check_computable_on

    def refusing(measure, *args, **options):
        if measure == "cknna":
            raise LayersimError("cknna cannot be computed here.")
        return real(measure, *args, **options)

    monkeypatch.setattr(grounding, "check_computable_on", refusing)
    with pytest.raises(LayersimError, match="grounding.measures has 'cknna', which no pooling .* cknna cannot be"):
        task_grounding(tmp_path, tmp_path, "synth", _params(extra=("cknna",)))
