"""Exchangeability blocks in the permutation nulls (layersim.similarity.inference.exchangeability): whole examples permuted
among examples of the same stratum and size; one row per example keeps today's row permutation exactly; the
false-positive rate on grouped data (words of sentences, choices of a question) at its level."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from layersim.experiments import similarity_inputs
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.errors import LayersimError
from layersim.experiments import similarity as stage
from layersim.similarity import permutation_matrix, permutation_test
from layersim.similarity.comparisons import phang_cells, stacked_null
from layersim.similarity.inference.exchangeability import (LINEAR_CKA_BLOCK_PERMUTATIONS, block_permutations, example_sample,
                                                 length_class_rows, null_units, unmovable)


def _grouped(rng, sentence_sd: float, sentences: int = 50, words: int = 10, d: int = 20):
    """The review's design: x = a_s + e, y = b_s + f with a, b, e, f independent (H0 true), sentence sd given."""
    g = np.repeat(np.arange(sentences), words)
    x = sentence_sd * rng.normal(size=(sentences, d))[g] + rng.normal(size=(sentences * words, d))
    y = sentence_sd * rng.normal(size=(sentences, d))[g] + rng.normal(size=(sentences * words, d))
    return x, y, g


# --- the sampler ---


def test_one_row_per_example_is_todays_row_permutation():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 6)), rng.normal(size=(40, 5)) + 0.3 * rng.normal(size=(40, 1))
    ids = rng.permutation(1000)[:40] * 7  # any labels, one per row
    for name, options in (("linear_cka", {}), ("svcca", {"variance_threshold": 0.99}), ("neuronsim", {})):
        before = permutation_test(name, x, y, permutations=50, seed=3, **options)
        after = permutation_test(name, x, y, permutations=50, seed=3, groups=ids, **options)
        assert after == before
    assert block_permutations(40, ids).plain and block_permutations(40).draw(np.random.default_rng(5)).tolist() == \
        np.random.default_rng(5).permutation(40).tolist()


def test_a_draw_moves_whole_examples_in_order_within_their_stratum():
    rng = np.random.default_rng(1)
    sizes = np.r_[rng.integers(1, 5, size=58), 6, 7]  # the last two: a size no other example has
    groups = rng.permutation(np.repeat(np.arange(60), sizes))  # an example's rows need not be contiguous
    strata = (np.arange(60) % 3)[groups]
    blocks = block_permutations(len(groups), groups, strata)
    rows_of = {e: np.flatnonzero(groups == e) for e in range(60)}
    for _ in range(20):
        perm = blocks.draw(rng)
        assert sorted(perm.tolist()) == list(range(len(groups)))
        for e, rows in rows_of.items():
            sources = groups[perm[rows]]
            assert len(set(sources)) == 1  # never split: all rows come from one example ...
            source = sources[0]
            assert np.array_equal(perm[rows], rows_of[source])  # ... position by position
            assert strata[rows_of[source][0]] == strata[rows[0]] and sizes[source] == sizes[e]
    # Examples whose size is unique in their stratum stay in place; the others move.
    unique = [e for e in range(60) if sum(sizes[f] == sizes[e] and f % 3 == e % 3 for f in range(60)) == 1]
    moved = np.mean([np.array_equal(blocks.draw(rng)[rows_of[e]], rows_of[e]) for _ in range(30) for e in unique])
    assert unique == [58, 59] and moved == 1.0
    assert blocks.movable == pytest.approx(1 - sum(sizes[e] for e in unique) / len(groups))


def test_draws_are_uniform_over_the_arrangements_and_the_null_is_their_distribution():
    """4 examples of 2 rows (4! = 24 arrangements) and one of 3 (fixed): the sampled block null of linear CKA
    takes only the enumerated values, each arrangement about equally often, with the enumerated mean."""
    rng = np.random.default_rng(2)
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4])
    x, y = rng.normal(size=(11, 3)), rng.normal(size=(11, 2))
    blocks = block_permutations(11, groups)
    assert blocks.log10_arrangements == pytest.approx(np.log10(24)) and blocks.movable == pytest.approx(8 / 11)

    def cka(perm):
        xc, yc = x - x.mean(0), y[perm] - y[perm].mean(0)
        return np.sum((xc.T @ yc) ** 2) / np.sqrt(np.sum((xc.T @ xc) ** 2) * np.sum((yc.T @ yc) ** 2))

    rows = np.arange(8).reshape(4, 2)
    enumerated = []
    for sigma in itertools.permutations(range(4)):
        perm = np.arange(11)
        perm[rows] = rows[list(sigma)]
        enumerated.append(cka(perm))
    counts = {}
    draws = 4800
    for _ in range(draws):
        perm = blocks.draw(rng)
        counts[tuple(perm)] = counts.get(tuple(perm), 0) + 1
    assert len(counts) == 24 and max(counts.values()) < 1.5 * draws / 24 and min(counts.values()) > 0.5 * draws / 24
    null = permutation_test("linear_cka", x, y, permutations=2000, seed=0, groups=groups)
    assert null.null_mean == pytest.approx(np.mean(enumerated), abs=4 * np.std(enumerated) / np.sqrt(2000))
    observed = enumerated[0]  # the identity
    assert null.observed == pytest.approx(observed)
    exact_p = np.mean(np.array(enumerated) >= observed - 1e-12)
    assert abs(null.p_value - exact_p) < 4 * np.sqrt(exact_p * (1 - exact_p) / 2000) + 1 / 2001


def test_bad_blocks_are_refused():
    x = np.random.default_rng(0).normal(size=(6, 2))
    with pytest.raises(LayersimError, match=r"groups must hold one label per row, shape \(6,\)"):
        permutation_test("linear_cka", x, x, groups=np.arange(5))
    with pytest.raises(LayersimError, match="has rows in more than one stratum"):
        permutation_test("linear_cka", x, x, groups=[0, 0, 1, 1, 2, 2], strata=[0, 1, 0, 0, 1, 1])
    with pytest.raises(LayersimError, match="no two examples of one stratum have the same number of rows"):
        permutation_test("svcca", x, x, groups=[0, 1, 1, 2, 2, 2], variance_threshold=0.99)
    assert "no two examples" in unmovable(6, [0, 1, 1, 2, 2, 2]) and unmovable(6, [0, 0, 1, 1, 2, 2]) is None
    with pytest.raises(LayersimError, match="exact=True needs exchangeable rows"):
        permutation_test("linear_cka", x, x, groups=[0, 0, 1, 1, 2, 2], exact=True)


def test_the_note_says_when_a_p_value_cannot_reach_the_level():
    few = block_permutations(9, [0, 0, 1, 1, 2, 2, 3, 3, 3])  # 3! = 6 arrangements
    assert "only 6 distinct permutations" in few.note(0.05)
    many = block_permutations(40, np.repeat(np.arange(10), 4))
    assert many.note(0.05) is None and block_permutations(40).note(0.05) is None
    sparse = block_permutations(40, np.r_[np.repeat(np.arange(6), 2), np.repeat(np.arange(6, 10), [3, 5, 7, 13])])
    assert "little power: only 30% of the rows can move" in sparse.note(0.05)


def test_example_sample_takes_whole_examples():
    groups = np.repeat(np.arange(100), np.arange(100) % 7 + 1)
    rows = example_sample(groups, 200, seed=4)
    assert len(rows) <= 200 and len(rows) > 150 and np.all(np.diff(rows) > 0)
    for e in np.unique(groups[rows]):
        assert np.array_equal(np.flatnonzero(groups == e), rows[groups[rows] == e])


def test_length_classes_cut_each_block_to_a_multiple_of_its_first_rows():
    rng = np.random.default_rng(3)
    groups = rng.permutation(np.repeat(np.arange(40), rng.integers(1, 30, 40)))  # blocks' rows interleaved
    assert np.array_equal(length_class_rows(groups, 1), np.arange(len(groups)))
    for multiple in (2, 5, 10):
        kept = length_class_rows(groups, multiple)
        assert np.all(np.diff(kept) > 0)
        for block in np.unique(groups):
            rows = np.flatnonzero(groups == block)
            assert np.array_equal(kept[groups[kept] == block], rows[:len(rows) // multiple * multiple])
        exact, coarse = block_permutations(len(groups), groups), block_permutations(len(kept), groups[kept])
        assert coarse.movable > exact.movable  # here (lengths 1–29, 40 blocks): 72 % movable with exact lengths
        units = null_units(len(groups), groups, length_classes=multiple)
        assert units["rows_in_null"] == len(kept) and units["movable_exact"] == round(exact.movable, 4)
        assert units["movable"] == round(coarse.movable * len(kept) / len(groups), 4)
    assert "length_classes" not in null_units(10, np.arange(10), length_classes=5)  # one row per example: no cut
    with pytest.raises(LayersimError, match="positive multiple"):
        length_class_rows(groups, 0)


def test_a_null_on_the_length_class_rows_is_the_null_of_those_rows():
    """phang_result with null_rows: its p-values and null means are those of the same measure on the kept rows
    alone (the observed values there too), while the reported matrix is every row's."""
    from layersim.similarity.comparisons import stacked_matrix
    from layersim.similarity.results import Uncertainty, phang_result

    rng = np.random.default_rng(8)
    groups = np.repeat(np.arange(30), rng.integers(2, 9, 30))
    models = {label: [rng.normal(size=(len(groups), 4)) for _ in range(3)] for label in ("ORIG", "FT[1]", "FT[2]")}
    sizes = {label: 3 for label in models}
    kept = length_class_rows(groups, 3)
    uncertainty = Uncertainty(permutations=30, bootstrap=0, seed=2)
    whole = stacked_matrix("svcca", models)
    cut = phang_result("svcca", whole, sizes, models=models, uncertainty=uncertainty, groups=groups, null_rows=kept)
    alone = {label: [layer[kept] for layer in layers] for label, layers in models.items()}
    direct = phang_result("svcca", stacked_matrix("svcca", alone), sizes, models=alone, uncertainty=uncertainty,
                          groups=groups[kept])
    assert np.array_equal(cut.matrix, whole)
    for a, b in zip(cut.comparisons, direct.comparisons):
        np.testing.assert_allclose(a.p_value, b.p_value)
        np.testing.assert_allclose(a.null_mean, b.null_mean)


# --- calibration (the benchmark's structured-data section runs >= 200 draws of every measure) ---


def _rate(make, name, draws, **options):
    rng = np.random.default_rng(47)
    p = []
    for k in range(draws):
        x, y, g = make(rng)
        p.append(permutation_test(name, x, y, permutations=99, seed=k, groups=g, **options).p_value)
    return np.mean(np.array(p) <= 0.05)


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
@pytest.mark.parametrize("sentence_sd", [0.0, 0.3, 1.0])
def test_words_of_sentences_false_positive_rate(sentence_sd):
    """50 sentences × 10 words, d = 20, independent x and y that share the sentence grouping: the block null's
    false-positive rate at 0.05 is 0.05 ± 0.03 (200 draws); the row null's far above it at sd 1."""
    rate = _rate(lambda rng: _grouped(rng, sentence_sd), "linear_cka", 200)
    assert abs(rate - 0.05) <= 0.03, rate
    if sentence_sd == 1.0:
        rng = np.random.default_rng(47)
        rows = [permutation_test("linear_cka", *_grouped(rng, 1.0)[:2]).p_value for _ in range(20)]
        assert np.mean(np.array(rows) <= 0.05) > 0.8


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_four_choice_examples_false_positive_rate():
    def make(rng, examples=100, d=20):
        g = np.repeat(np.arange(examples), 4)
        own = lambda: rng.normal(size=(examples, d))[g] + rng.normal(size=(4 * examples, d))  # noqa: E731
        return own(), own(), g

    for name, options, draws in (("linear_cka", {}, 200), ("svcca", {"variance_threshold": 0.99}, 100)):
        assert abs(_rate(make, name, draws, **options) - 0.05) <= 0.03


# --- through the stages' functions ---


def test_stacked_null_with_groups_draws_linear_ckas_minimum():
    rng = np.random.default_rng(5)
    x, y, g = _grouped(rng, 1.0, sentences=12, words=3, d=4)
    models = {"ORIG": [x, y], "FT[1]": [y, x]}
    null = stacked_null("linear_cka", models, permutations=20, seed=0, groups=g,
                        cells=phang_cells({"ORIG": 2, "FT[1]": 2}, "ORIG", ["FT[1]"]))
    assert null.method == "block permutation" and null.permutations == LINEAR_CKA_BLOCK_PERMUTATIONS
    plain = stacked_null("linear_cka", models, permutations=20, seed=0, groups=np.arange(len(g)))
    assert plain.method == "exact"
    svcca = stacked_null("svcca", models, permutations=20, seed=0, groups=g, variance_threshold=0.99)
    assert svcca.permutations == 20 and np.all(np.round(svcca.p_value * 21, 6) % 1 == 0)


def _write(path, layers, ids, choice, run):
    meta = {"task": "t", "split": "validation", "run": run, "pooling": "cls", "model": "m"}
    with ActivationWriter(path, num_layers=len(layers) - 1, hidden_size=layers[0].shape[1], label_type=pa.int64(),
                          metadata=meta, rows_per_group=128) as writer:
        writer.write(ids, choice, np.zeros(len(ids), np.int64), layers)


def test_streamed_multiple_choice_tables_get_a_block_null_from_a_sample(tmp_path, monkeypatch):
    """Streamed, rows of one example (4 choices) get the block null of a sample of whole examples, computed with
    its own observed values; one row per example keeps the moments' routes."""
    rng = np.random.default_rng(6)
    examples, d = 150, 6
    ids, choice = np.repeat(np.arange(examples), 4), np.tile(np.arange(4, dtype=np.int16), examples)
    shared = rng.normal(size=(examples, d))[np.repeat(np.arange(examples), 4)]
    tables = {}
    for run in ("orig", "seed1", "seed2"):
        layers = [(shared + rng.normal(size=shared.shape)).astype(np.float32) for _ in range(3)]
        _write(tmp_path / f"{run}.cls.parquet", layers, ids, choice, run)
        tables[run] = ActivationTable(tmp_path / f"{run}.cls.parquet")
    monkeypatch.setattr(similarity_inputs, "stream_layers", lambda *args: True)
    monkeypatch.setattr(similarity_inputs, "STREAMED_SAMPLE_ROWS", 400)
    labels = stage.run_labels([1, 2])
    matrix_of, layers, streamed_null = stage.layer_sources(tables, labels, ["linear_cka", "svcca"],
                                                           {"svcca": {"variance_threshold": 0.99}})
    assert layers is None
    sizes = {"ORIG": 3, "FT[1]": 3, "FT[2]": 3}
    cells = phang_cells(sizes, "ORIG", ["FT[1]", "FT[2]"])
    for measure in ("linear_cka", "svcca"):
        null = streamed_null(measure, cells, 20, 0)
        assert null.method == "block permutation"
        # The sample's observed values, not the whole table's: the p-value compares like with like.
        rows = example_sample(ids, 400, 0)
        assert len(rows) == 400
        want = permutation_matrix(measure, [t.layers()[k][rows] for t in tables.values() for k in range(3)],
                                  permutations=null.permutations, seed=0, cells=cells, groups=ids[rows],
                                  **({"variance_threshold": 0.99} if measure == "svcca" else {}))
        np.testing.assert_allclose(null.p_value, want.p_value, equal_nan=True)
        assert not np.allclose(null.observed[cells], matrix_of(measure)[cells])


def test_the_stage_cuts_clusters_to_length_classes_on_request(tmp_path, monkeypatch):
    """task_similarity on tables whose clusters (examples sharing a text) are of 1–14 rows, 3 of a shared size: with
    exact lengths it warns that few rows can move and names similarity.length_classes; with length_classes = 3 the
    null unit records the multiple, the rows the null keeps and more rows movable, and the p-values are those of the
    kept rows."""
    from layersim.params import parse_params

    rng = np.random.default_rng(11)
    clusters = np.repeat(np.arange(16), rng.permutation(np.r_[np.arange(1, 15), [2, 2]]))  # 3 of one size
    n, d = len(clusters), 5
    known = {"orig": {"model_digest": "a" * 64, "task_digest": "b" * 64, "num_layers": 2, "hidden_size": d}}
    known |= {f"seed{s}": {**known["orig"], "model_digest": str(s) * 64} for s in (1, 2)}
    monkeypatch.setattr(similarity_inputs, "run_expectations", lambda checkpoints, seeds: {r: dict(v) for r, v in known.items()})
    monkeypatch.setattr(stage, "checkpoint_flags", lambda checkpoints, seeds: {})
    for run in known:
        meta = {"model": "m", "pooling": "cls", "split": "validation", "task": "synth", "run": run, **known[run]}
        with ActivationWriter(tmp_path / f"{run}.cls.parquet", num_layers=2, hidden_size=d, label_type=pa.int64(),
                              metadata=meta) as writer:
            writer.write(np.arange(n), np.zeros(n, np.int16), np.zeros(n, np.int64),
                         [rng.normal(size=(n, d)).astype(np.float32) for _ in range(3)], cluster_id=clusters)

    def run(length_classes):
        warnings = []
        params = parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1, 2], "similarity": {
            "measures": {"cls": ["linear_cka"]}, "attention_measures": [], "bootstrap": 0, "permutations": 20,
            "random_control": None, "length_classes": length_classes}})
        out = stage.task_similarity(tmp_path, tmp_path, "synth", params, warn=lambda *a: warnings.append(a[0] % a[1:]))
        return out.metrics["cls"], " ".join(warnings)

    exact, warned = run(1)
    assert "of the rows can move" in warned and "similarity.length_classes" in warned
    assert "length_classes" not in exact["null_unit"]
    coarse, _ = run(3)
    unit = coarse["null_unit"]
    kept = length_class_rows(clusters, 3)
    assert unit["length_classes"] == 3 and unit["rows_in_null"] == len(kept) < n
    assert unit["movable_exact"] == exact["null_unit"]["movable"] < unit["movable"]
    assert coarse["linear_cka"]["ft_orig"]["diagonal"] == exact["linear_cka"]["ft_orig"]["diagonal"]  # all rows
    assert coarse["linear_cka"]["ft_orig"]["p_value"] != exact["linear_cka"]["ft_orig"]["p_value"]
    import matplotlib.pyplot as plt
    plt.close("all")
