"""The attention maps' permutation null and bootstrap intervals (layersim.similarity.inference.attention_null): a draw
pairs each example only with an example of equal length, a cluster's examples together; every null value is the
measure on maps permuted so; a resample's value is the measure on the resampled maps; calibrated on planted maps."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import permutation_matrix
from layersim.similarity.attention import AttentionMaps, attention_similarity_matrix
from layersim.similarity.inference.attention_null import (HeadNullEngine, attention_blocks,
                                                          attention_bootstrap_pairs, attention_null_units,
                                                          attention_stacked_null, attention_unmovable, pair_blocks)
from layersim.similarity.inference.bootstrap import resample_rows

HEAD = ("jensen_shannon", "pearson", "matrix_norm")


def _softmax(z):
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _maps(rng, lengths, heads=3, signal=0.0, shared=None):
    """Two layers' maps over examples of `lengths`; y = signal × x's logits + its own (0: independent)."""
    xs, ys = [], []
    for t in lengths:
        own = rng.normal(size=(heads, t, t))
        xs.append(_softmax(2 * own))
        ys.append(_softmax(2 * (signal * own + rng.normal(size=(heads, t, t)))))
    return xs, ys


def _per_example(maps: AttentionMaps) -> list[np.ndarray]:
    starts, counts, rows = maps.example_layout()
    return [maps.weights[s:s + c].reshape(t, t, -1).transpose(2, 0, 1) for s, c, t in zip(starts, counts, rows)]


def test_a_draw_pairs_examples_of_equal_length_and_moves_clusters_whole():
    rng = np.random.default_rng(0)
    lengths = [3, 4, 3, 4, 3, 5, 4, 4, 3, 3]
    # clusters 0 and 1 have the shape (3, 4), 2, 5 and 6 the shape (3,): movable; 3 (5,) and 4 (4, 4) are unique
    clusters = np.array([0, 0, 1, 1, 2, 3, 4, 4, 5, 6])
    x = AttentionMaps.from_maps(_maps(rng, lengths)[0])
    blocks = attention_blocks(x, clusters)
    starts, _, rows = x.example_layout()
    example_of_pair = np.repeat(np.arange(len(lengths)), [t * t for t in lengths])
    moved = set()
    for seed in range(50):
        perm = blocks.draw(np.random.default_rng(seed))
        partner = example_of_pair[perm[starts]]
        assert (rows[partner] == rows).all()  # equal lengths only
        # each example's pairs come from one example, query for query and key for key
        for e, f in enumerate(partner):
            assert (perm[starts[e]:starts[e] + rows[e] ** 2] == np.arange(starts[f], starts[f] + rows[f] ** 2)).all()
        assert partner[0] in (0, 2) and partner[1] == partner[0] + 1  # clusters 0 and 1 exchanged whole
        assert partner[5] == 5 and set(partner[[6, 7]]) == {6, 7} and partner[6] == 6  # unique shapes stay
        moved |= {int(partner[0])}
    assert moved == {0, 2}
    groups, strata = pair_blocks(x, clusters)
    assert groups.shape == strata.shape == (x.num_pairs,)
    units = attention_null_units(x, clusters)
    assert units["examples"] == 10 and units["blocks"] == 7 and units["pairs"] == x.num_pairs
    assert units["movable"] == pytest.approx((2 * (9 + 16) + 3 * 9) / x.num_pairs, abs=1e-4)


@pytest.mark.parametrize("measure", HEAD)
def test_every_null_value_is_the_measure_on_the_permuted_maps(measure):
    rng = np.random.default_rng(1)
    lengths = [3, 4, 3, 4, 3, 4, 5, 5]
    x, y = (AttentionMaps.from_maps(m) for m in _maps(rng, lengths, signal=0.7))
    engine = HeadNullEngine(measure, [x, y], None, np.array([[False, True], [True, False]]))
    observed = engine.values(None)
    np.testing.assert_allclose(observed[0, 1], attention_similarity_matrix(measure, [x], [y])[0, 0], rtol=1e-12)
    blocks = attention_blocks(x)
    for seed in range(4):  # draws meet pairs of examples already computed (kept) and new ones
        perm = blocks.draw(np.random.default_rng(seed))
        permuted = AttentionMaps(y.weights[perm], y.row_starts, y.example_starts)
        got = engine.values(perm)
        np.testing.assert_allclose(got[0, 1], attention_similarity_matrix(measure, [x], [permuted])[0, 0], rtol=1e-10)
        np.testing.assert_allclose(got[1, 0], attention_similarity_matrix(
            measure, [y], [AttentionMaps(x.weights[perm], x.row_starts, x.example_starts)])[0, 0], rtol=1e-10)
        assert np.isnan(got[0, 0]) and np.isnan(got[1, 1])


@pytest.mark.parametrize("measure", HEAD)
def test_cells_that_share_their_terms_give_the_unshared_values_bit_for_bit(measure):
    """With one list of layers, cells (i, j) and (j, i) and the pairs (e, f), (f, e) of a diagonal cell keep their
    terms once (HeadNullEngine._key): the values equal an engine given the layers twice, which shares nothing."""
    rng = np.random.default_rng(4)
    x, y = (AttentionMaps.from_maps(m) for m in _maps(rng, [3, 4, 3, 4, 3, 4, 3], signal=0.5))
    layers, cells = [x, y], np.ones((2, 2), dtype=bool)
    shared, alone = HeadNullEngine(measure, layers, None, cells), HeadNullEngine(measure, layers, layers, cells)
    np.testing.assert_array_equal(shared.values(None), alone.values(None))
    blocks = attention_blocks(x)
    for seed in range(6):
        perm = blocks.draw(np.random.default_rng(seed))
        np.testing.assert_array_equal(shared.values(perm), alone.values(perm))
    assert shared.cached_bytes < alone.cached_bytes


def test_the_stacked_null_tests_dependence_and_matches_the_registry_for_array_measures():
    rng = np.random.default_rng(2)
    lengths = rng.choice([4, 5, 6], 30)
    x, y = (AttentionMaps.from_maps(m) for m in _maps(rng, lengths, signal=1.0))
    cells = np.array([[False, True], [False, False]])
    null = attention_stacked_null("jensen_shannon", {"ORIG": [x], "FT[1]": [y]}, permutations=49, seed=0,
                                  cells=cells)
    assert null.method == "block permutation" and null.permutations == 49
    assert null.p_value[0, 1] == pytest.approx(1 / 50) and null.null_mean[0, 1] < null.observed[0, 1]
    assert np.isnan(null.p_value[1, 0])
    groups, strata = pair_blocks(x)
    array = attention_stacked_null("svcca", {"ORIG": [x], "FT[1]": [y]}, permutations=20, seed=3, cells=cells,
                                   variance_threshold=0.99)
    direct = permutation_matrix("svcca", [x.weights, y.weights], permutations=20, seed=3, cells=cells, groups=groups,
                                strata=strata, variance_threshold=0.99)
    np.testing.assert_allclose(array.p_value, direct.p_value, equal_nan=True)
    np.testing.assert_allclose(array.null_mean, direct.null_mean, equal_nan=True)


def test_no_null_where_no_two_examples_share_a_length():
    rng = np.random.default_rng(3)
    x, y = (AttentionMaps.from_maps(m) for m in _maps(rng, [2, 3, 4, 5]))
    assert "no two of the 4 attention examples" in attention_unmovable(x)
    assert attention_unmovable(x, np.array([0, 0, 1, 1])) is not None
    with pytest.raises(LayersimError, match="no two of the 4 attention examples"):
        attention_stacked_null("pearson", {"a": [x], "b": [y]}, permutations=10, seed=0)
    with pytest.raises(LayersimError, match="one label per example"):
        attention_blocks(x, np.array([0, 1]))
    with pytest.raises(LayersimError, match="permutations must be an integer"):
        attention_stacked_null("pearson", {"a": [x], "b": [y]}, permutations=0, seed=0)


@pytest.mark.parametrize("measure", HEAD)
def test_a_resample_is_the_measure_on_the_resampled_examples(measure):
    rng = np.random.default_rng(4)
    lengths = rng.choice([3, 4, 5], 12)
    xs, ys = _maps(rng, lengths, signal=0.8)
    x, y = AttentionMaps.from_maps(xs), AttentionMaps.from_maps(ys)
    clusters = np.repeat(np.arange(6), 2)
    found = attention_bootstrap_pairs(measure, [x, x], [y, x], resamples=5, seed=7, groups=clusters,
                                      interval="percentile")
    np.testing.assert_allclose(found.estimate, [attention_similarity_matrix(measure, [x], [y])[0, 0], 1.0],
                               rtol=1e-12)
    assert found.method == "percentile" and found.values.shape == (5, 2)
    for r, rows in enumerate(resample_rows(12, 5, 7, clusters)):
        assert (rows.reshape(-1, 2) == 2 * clusters[rows[::2]][:, None] + [0, 1]).all()  # whole clusters drawn
        rx, ry = (AttentionMaps.from_maps([maps[e] for e in rows]) for maps in (_per_example(x), _per_example(y)))
        np.testing.assert_allclose(found.values[r, 0], attention_similarity_matrix(measure, [rx], [ry])[0, 0],
                                   rtol=1e-10)
    assert found.low[0] <= found.centre[0] <= found.high[0]


def test_array_measure_intervals_resample_whole_examples_pairs():
    rng = np.random.default_rng(5)
    x, y = (AttentionMaps.from_maps(m) for m in _maps(rng, rng.choice([3, 4], 20), signal=1.0))
    found = attention_bootstrap_pairs("linear_cka", [x], [y], resamples=20, seed=0)
    assert found.method == "basic" and found.low[0] < found.estimate[0] < found.high[0]
    assert found.estimate[0] == pytest.approx(attention_similarity_matrix("linear_cka", [x], [y])[0, 0])


def _planted(rng, signal: float, clusters: int = 30):
    """30 premises × 2 examples (one length per premise, 4–7 units), 3 heads: a positional pattern both layers share,
    each layer's own premise component and example component, y gaining `signal` × x's example component."""
    xs, ys, premise = [], [], []
    for c in range(clusters):
        t = int(rng.integers(4, 8))
        pattern = 2.0 * np.stack([np.roll(np.eye(t), h, axis=1) for h in range(3)])
        shared_x, shared_y = rng.normal(size=(2, 3, t, t))
        for _ in range(2):
            own = rng.normal(size=(3, t, t))
            xs.append(_softmax(pattern + shared_x + own))
            ys.append(_softmax(pattern + shared_y + rng.normal(size=(3, t, t)) + signal * own))
            premise.append(c)
    return AttentionMaps.from_maps(xs), AttentionMaps.from_maps(ys), np.array(premise)


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_false_positive_rate_at_its_level_and_power_on_planted_maps():
    """Independent layers (sharing only the positional pattern and each its own premise component): the share of
    p ≤ 0.05 over 150 draws within [0.02, 0.08]; y = x's example component + its own: found in ≥ 80 %."""
    cells = np.array([[False, True], [False, False]])
    for measure in ("jensen_shannon", "pearson"):
        rng = np.random.default_rng(63)
        p = {0.0: [], 1.0: []}
        for k in range(150):
            for signal in p:
                if signal and k >= 50:
                    continue
                x, y, premise = _planted(rng, signal)
                p[signal].append(attention_stacked_null(measure, {"x": [x], "y": [y]}, permutations=49, seed=k,
                                                        cells=cells, clusters=premise).p_value[0, 1])
        rate = np.mean(np.array(p[0.0]) <= 0.05)
        assert 0.02 <= rate <= 0.08, (measure, rate)
        assert np.mean(np.array(p[1.0]) <= 0.05) >= 0.8, measure


def test_the_similarity_stage_reports_the_attention_null_and_intervals(tmp_path):
    """Through the stage: FT's first layer keeps ORIG's attention (plus noise), its second is new; the heatmap rows and
    the metrics carry each cell's p-value, the diagonals their intervals (where the measure has an interval
    method), the null unit what moved; the attention claims join the headline family."""
    import matplotlib.pyplot as plt

    from fake_tables import similarity_params, write_attention, write_extracted
    from layersim.data.io import ActivationTable
    from layersim.experiments.similarity import task_similarity
    from layersim.reporting.headlines import similarity_headline
    from layersim.similarity.inference.bootstrap import AUTO_INTERVAL

    root = write_extracted(tmp_path)
    rng = np.random.default_rng(6)
    lengths = rng.choice([3, 4], 16)
    orig = [_maps(rng, lengths)[0] for _ in range(2)]
    for run in ("orig", "seed1", "seed2"):
        maps = orig if run == "orig" else [
            [_softmax(np.log(m) + 0.3 * rng.normal(size=m.shape)) for m in orig[0]], _maps(rng, lengths)[0]]
        digest = ActivationTable(root / "activations" / f"{run}.cls.parquet").metadata["model_digest"]
        write_attention(root / "activations" / "attention" / f"{run}.parquet", maps, np.arange(16), run=run,
                        digest=digest)
    params = similarity_params("linear_cka", attention_measures=["jensen_shannon"], bootstrap=20, permutations=99)
    out = task_similarity(root / "activations", root / "checkpoints", "synth-negation", params)
    metrics = out.metrics["attention"]
    js = metrics["jensen_shannon"]
    assert js["null"] == {"method": "block permutation", "permutations": 99} and "no_uncertainty" not in js
    assert js["ft_orig"]["p_value"]["layer_01"] == pytest.approx(1 / 100)
    assert js["ft_orig"]["p_value"]["layer_02"] > 0.05 and set(js["ft_orig"]["p_family"]) == {"layer_01", "layer_02"}
    if AUTO_INTERVAL["jensen_shannon"]:
        assert js["ft_orig"]["ci_low"]["layer_01"] <= js["ft_orig"]["diagonal"]["layer_01"] <= \
            js["ft_orig"]["ci_high"]["layer_01"]
    else:
        assert "no bootstrap interval" in js["no_interval"]
    assert metrics["null_unit"]["examples"] == 16 and metrics["null_unit"]["movable"] == 1.0
    cells = [row for row in out.rows["plots", "attention.json"] if row["comparison"] == "FT–ORIG"]
    assert len(cells) == 4 and all(0 < row["p_value"] <= 1 and "p_adjusted" in row for row in cells)
    assert {row["layer"] for row in out.rows["diagonals", "attention.json"]} == {1, 2}
    headline = similarity_headline(out.metrics, 0.05)["attention"]["jensen_shannon"]
    assert headline["ft_orig_chance_from"] == 2 and "ft_orig_top_p_adjusted" in headline
    assert js["family"] == out.metrics["cls"]["linear_cka"]["family"]  # one family over every pooling
    plt.close("all")


def _kept_and_new(rng, lengths):
    """ORIG's two layers of maps, and FT's: its first layer ORIG's first plus noise, its second new."""
    orig = [AttentionMaps.from_maps(_maps(rng, lengths)[0]) for _ in range(2)]
    kept = [_softmax(np.log(m) + 0.3 * rng.normal(size=m.shape)) for m in _per_example(orig[0])]
    return {"ORIG": orig, "FT": [AttentionMaps.from_maps(kept), AttentionMaps.from_maps(_maps(rng, lengths)[0])]}


@pytest.mark.parametrize("measure", ["jensen_shannon", "linear_cka"])
def test_the_compare_heatmap_gets_the_attention_null_and_intervals(measure):
    """The compare stage's stacked attention heatmap (issue 63): FT's first layer keeps ORIG's attention, so the null
    rejects FT–ORIG at layer 1; FT's second layer is new, so no cell of it is above chance. Every cell between the two
    models carries the similarity stage's null (the same p-values as attention_stacked_null's on those cells, clusters
    as blocks), the layer-k-against-layer-k cells the bootstrap interval attention_bootstrap_pairs gives them; the
    figure says what was tested."""
    import matplotlib.pyplot as plt

    from layersim.experiments.compare import stacked_report
    from layersim.similarity.inference.correction import between_model_cells
    from layersim.similarity.results import Uncertainty

    rng = np.random.default_rng(6)
    models, clusters = _kept_and_new(rng, rng.choice([3, 4], 16)), np.repeat(np.arange(8), 2)
    uncertainty = Uncertainty(permutations=99, bootstrap=50, seed=2)
    report = stacked_report(models, measure, "t", uncertainty=uncertainty, groups=clusters, first_layer=1,
                            attention=True, pooling="attention")
    direct = attention_stacked_null(measure, models, permutations=99, seed=2, clusters=clusters,
                                    cells=between_model_cells([2, 2]))
    ft = report.summary["FT"]  # linear CKA's block null draws at least 199 permutations
    assert ft["p_value"]["layer_01"] == pytest.approx(1 / (direct.permutations + 1))
    assert ft["p_value"]["layer_02"] > 0.05
    assert report.summary["correction"] == "fdr_bh" and "no_null" not in report.summary
    cells = {(row["comparison"], row["y_layer"], row["x_layer"]): row for row in report.rows}
    assert cells["FT vs ORIG", 1, 1]["p_adjusted"] < 0.05
    new = [row for key, row in cells.items() if key[0] != "ORIG vs ORIG" and key[0] != "FT vs FT"
           and (key[0].startswith("FT") and key[1] == 2 or key[0].endswith("FT") and key[2] == 2)]
    assert len(new) == 4 and all(row["p_adjusted"] >= 0.05 for row in new)
    assert all(row["p_value"] is None for key, row in cells.items() if key[0] in ("ORIG vs ORIG", "FT vs FT"))
    assert [cells["FT vs ORIG", 1, 1]["p_value"], cells["ORIG vs FT", 2, 1]["p_value"]] == pytest.approx(
        [direct.p_value[2, 0], direct.p_value[1, 2]])
    interval = attention_bootstrap_pairs(measure, models["FT"], models["ORIG"], resamples=50, seed=2, groups=clusters)
    for k in (1, 2):
        row = cells["FT vs ORIG", k, k]
        assert [row["ci_low"], row["ci_high"]] == pytest.approx([interval.low[k - 1], interval.high[k - 1]], abs=1e-6)
        assert ft["ci_low"][f"layer_0{k}"] == row["ci_low"] and ft["ci_high"][f"layer_0{k}"] == row["ci_high"]
    assert sum(row["ci_low"] is not None for row in report.rows) == 2  # the summary's cells only
    note = report.figure.texts[0].get_text()
    assert "examples exchanged with examples of equal length" in note and "bootstrap resamples" in note
    plt.close("all")


def test_the_compare_heatmap_says_no_uncertainty_without_examples_of_equal_length():
    """No two examples of one length: no permutation can move an example, so the heatmap has no null and no interval,
    and its figure and summary say so."""
    import matplotlib.pyplot as plt

    from layersim.experiments.compare import stacked_report
    from layersim.similarity.results import Uncertainty

    models = _kept_and_new(np.random.default_rng(7), [2, 3, 4, 5])
    report = stacked_report(models, "pearson", "t", uncertainty=Uncertainty(permutations=19, bootstrap=20),
                            first_layer=1, attention=True, pooling="attention")
    assert "no two of the 4 attention examples" in report.summary["no_null"]
    assert "p_value" not in report.summary["FT"] and "ci_low" not in report.summary["FT"]
    assert all("p_value" not in row and "ci_low" not in row for row in report.rows)
    assert report.figure.texts[0].get_text().startswith("no uncertainty (no null, no interval): no two of the 4")
    plt.close("all")
