"""Linear CKA from row batches: layersim.similarity.LinearCKAAccumulator, ActivationTable.iter_batches,
and the similarity stage's streamed path (layersim.similarity.comparisons), each against the in-memory computation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from layersim.experiments import similarity_inputs
from layersim.similarity.comparisons import stacked_matrix, stream_layers, streamed_linear_cka
from layersim.errors import LayersimError
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.similarity import _cka_kernels
from layersim.similarity import LinearCKAAccumulator, cka_matrix, permutation_matrix, streamed_linear_cka_null
from layersim.similarity.inference._rv import row_traces
from layersim.similarity.kernels import debiased_cka_matrix, streamed_debiased_cka
from layersim.experiments.similarity import phang_report
from layersim.similarity.results import Uncertainty

ROOT = Path(__file__).resolve().parents[1]


def _layers(rng: np.random.Generator, n: int, widths: list[int], offset: float = 3.0) -> list[np.ndarray]:
    """Correlated float32 layers with an offset: each a noisy linear map of the previous one."""
    layers = [rng.normal(size=(n, widths[0]))]
    for d in widths[1:]:
        prev = layers[-1]
        layers.append(prev @ rng.normal(size=(prev.shape[1], d)) / np.sqrt(prev.shape[1]) + 0.7 * rng.normal(size=(n, d)))
    return [(layer + offset * rng.normal(size=layer.shape[1])).astype(np.float32) for layer in layers]


def _stream(layers: list[np.ndarray], batch: int, **kwargs) -> LinearCKAAccumulator:
    accumulator = LinearCKAAccumulator(**kwargs)
    for start in range(0, len(layers[0]), batch):
        accumulator.update([a[start : start + batch] for a in layers])
    return accumulator


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# --- the accumulator ---


def test_matches_cka_matrix_in_float64(rng):
    # 2,550 columns: two panels of products (PANEL_COLUMNS = 2048), so panel bookkeeping is exercised too.
    layers = _layers(rng, 600, [700, 900, 600, 50, 300])
    assert len(_cka_kernels._panels(np.cumsum([0, 700, 900, 600, 50, 300]))) == 2
    want = cka_matrix(layers, precision="float64")
    got = _stream(layers, 128, precision="float64").matrix()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert np.array_equal(got, got.T) and np.all(np.diag(got) == 1.0)
    assert 0.05 < got[0, 4] < 0.95  # a value where a mistake could show


@pytest.mark.parametrize("precision, atol", [("float64", 1e-12), ("float32", 1e-6)])
def test_batch_sizes_do_not_matter(rng, precision, atol):
    layers = _layers(rng, 500, [6, 11, 3, 8])
    results = [_stream(layers, batch, precision=precision).matrix() for batch in (1, 7, 128, 500)]
    for result in results[1:]:
        np.testing.assert_allclose(result, results[0], rtol=0, atol=atol)
    np.testing.assert_allclose(results[0], cka_matrix(layers, precision="float64"), rtol=0, atol=max(atol, 1e-10))


def test_large_means_do_not_cancel(rng):
    # Values 1e4 + N(0, 1) in float32. Summing xᵀx and subtracting n·x̄x̄ᵀ would cancel ~8 digits
    # (relative error ~1e-8 · 1e8); shifting by the first batch's mean keeps them.
    layers = [a - a.mean(axis=0) + np.float32(1e4) for a in _layers(rng, 2000, [5, 9, 4])]
    want = cka_matrix(layers, precision="float64")
    np.testing.assert_allclose(_stream(layers, 300, precision="float64").matrix(), want, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_stream(layers, 300, precision="float32").matrix(), want, rtol=0, atol=1e-6)


def test_auto_precision_follows_the_first_batch(rng):
    layers = _layers(rng, 50, [3, 4])
    assert _stream(layers, 10)._dtype == np.float32
    assert _stream([a.astype(np.float64) for a in layers], 10)._dtype == np.float64


def test_constant_layers_raise_or_give_nan_like_stacked_matrix(rng):
    varied = _layers(rng, 90, [4, 6, 5])
    # Like the CLS token's embedding output: the same row for every example (not exactly 0 after
    # centring in floating point, which must still count as constant).
    constant = np.tile(np.float32([1234.567, 0.1, -7.0]), (90, 1))
    layers = [constant, *varied[:2], constant * 0, varied[2]]
    with pytest.raises(LayersimError, match=re.escape("layers[0] is constant across examples")):
        _stream(layers, 40).matrix()
    accumulator = _stream(layers, 40, precision="float64")
    assert accumulator.constant_layers().tolist() == [True, False, False, True, False]
    got = accumulator.matrix(constant="nan")
    want = stacked_matrix("linear_cka", {"one": layers[:2], "two": layers[2:]})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)  # NaN where want is NaN
    assert np.isnan(got[0]).all() and np.isnan(got[:, 3]).all()


def test_errors(rng):
    accumulator = LinearCKAAccumulator()
    with pytest.raises(LayersimError, match="seen 0 rows; CKA needs at least 2 rows"):
        accumulator.matrix()
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    accumulator.update([a[:1], b[:1]])
    with pytest.raises(LayersimError, match="seen 1 rows"):
        accumulator.matrix()
    with pytest.raises(LayersimError, match=re.escape("widths [3, 3], but the first batch had [3, 2]")):
        accumulator.update([a, a])
    with pytest.raises(LayersimError, match=re.escape("widths [3], but the first batch had [3, 2]")):
        accumulator.update([a])
    with pytest.raises(LayersimError, match=re.escape("layers[1] has shape (4, 2) but layers[0] has shape (5, 3)")):
        accumulator.update([a, b[:4]])
    bad = b.copy()
    bad[2, 1] = np.inf
    with pytest.raises(LayersimError, match=re.escape("layers[1] contains 1 non-finite value")):
        accumulator.update([a, bad])
    accumulator.update([a[:0], b[:0]])  # an empty batch changes nothing
    assert accumulator.num_rows == 1
    with pytest.raises(LayersimError, match="unknown precision 'half'.*auto, float32, float64"):
        LinearCKAAccumulator(precision="half")
    with pytest.raises(LayersimError, match="unknown constant 'zero'.*nan, raise"):
        accumulator.matrix(constant="zero")


def test_memory_does_not_grow_with_rows():
    small = LinearCKAAccumulator.memory_bytes([768] * 13, 4096, "float32")
    assert small == LinearCKAAccumulator.memory_bytes([768] * 13, 10**9, "float32")
    assert 400e6 < small < 1e9  # the float64 upper triangle of a 9,984-column Zᵀ Z, and a block of rows


# --- reading tables in row batches ---

META = {"model": "tiny-bert", "digest": "abc123", "run": "orig", "pooling": "cls", "task": "synth-negation",
        "split": "validation"}


def _write_table(path: Path, layers: list[np.ndarray], rows_per_group: int = 4096, run: str = "orig") -> None:
    n = len(layers[0])
    with ActivationWriter(path, num_layers=len(layers) - 1, hidden_size=layers[0].shape[1], label_type=pa.int64(),
                          metadata={**META, "run": run}, rows_per_group=rows_per_group) as writer:
        for start in range(0, n, 97):  # written in uneven pieces
            stop = min(start + 97, n)
            writer.write(np.arange(start, stop) * 10, np.zeros(stop - start, np.int16), np.zeros(stop - start, np.int64),
                         [a[start:stop] for a in layers])


@pytest.mark.parametrize("rows", [1, 64, 250, 1000, 5000])
def test_iter_batches_gives_the_layers_in_exact_row_batches(tmp_path, rng, rows):
    layers = _layers(rng, 1000, [6, 6, 6])
    path = tmp_path / "orig.cls.parquet"
    _write_table(path, layers, rows_per_group=300)  # row groups that batches straddle
    table = ActivationTable(path)
    batches = list(table.iter_batches(rows))
    assert [len(b[0]) for b in batches] == [min(rows, 1000 - s) for s in range(0, 1000, rows)]
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([b[k] for b in batches]), layers[k])
        assert all(b[k].dtype == np.float32 and b[k].shape[1] == 6 for b in batches)
    only = list(table.iter_batches(rows, layers=[2]))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in only]), layers[2])


def test_iter_batches_errors_name_the_layer_and_example(tmp_path, rng):
    layers = _layers(rng, 300, [4, 4])
    layers[1][123, 2] = np.nan
    path = tmp_path / "orig.cls.parquet"
    _write_table(path, layers, rows_per_group=100)
    table = ActivationTable(path)
    with pytest.raises(LayersimError, match=re.escape("layer 1 holds a non-finite value at example_id 1230 (row 123")):
        list(table.iter_batches(64))
    assert len(list(table.iter_batches(64, layers=[0]))) == 5  # layer 0 is fine
    with pytest.raises(LayersimError, match=re.escape("layer 2 is out of range")):
        list(table.iter_batches(64, layers=[0, 2]))
    for rows in (0, -3, 2.5, True):
        with pytest.raises(LayersimError, match="rows must be a positive integer"):
            list(table.iter_batches(rows))


# --- the similarity stage's streamed path ---


def _stage():
    from layersim.experiments import similarity as similarity_task

    return similarity_task


def _three_runs(tmp_path: Path, rng: np.random.Generator, n: int = 700) -> dict[str, ActivationTable]:
    base = _layers(rng, n, [8, 8, 8, 8])
    runs = {"orig": base,
            "seed1": [base[0], base[1], base[2] + rng.normal(size=(n, 8)).astype(np.float32), base[3][:, ::-1]],
            "seed2": [base[0], base[1] * 2, rng.normal(size=(n, 8)).astype(np.float32), base[3]]}
    tables = {}
    for run, layers in runs.items():
        layers = [np.tile(np.float32(0.5), (n, 8)), *layers]  # a constant embedding layer, as CLS is
        _write_table(tmp_path / f"{run}.cls.parquet", layers, rows_per_group=256, run=run)
        tables[run] = ActivationTable(tmp_path / f"{run}.cls.parquet")
    return tables


def test_streamed_matrix_equals_stacked_matrix(tmp_path, rng):
    tables = _three_runs(tmp_path, rng)
    models = {run: table.layers() for run, table in tables.items()}
    want = stacked_matrix("linear_cka", models)
    got = streamed_linear_cka(zip(*(table.iter_batches(100) for table in tables.values())))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert np.isnan(got[0]).all() and np.isnan(got[5]).all() and np.isnan(got[10]).all()


def test_stage_outputs_are_the_same_streamed_or_loaded(tmp_path, rng, monkeypatch):
    stage = _stage()
    tables = _three_runs(tmp_path, rng)
    labels = stage.run_labels([1, 2])
    sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
    outputs = {}
    for streamed in (False, True):
        monkeypatch.setattr(similarity_inputs, "stream_layers", lambda *args, streamed=streamed: streamed)
        loaded = []
        monkeypatch.setattr(ActivationTable, "layers", lambda self, original=ActivationTable.layers: (
            loaded.append(self.path.name), original(self))[1])
        matrix_of, layers, _ = stage.layer_sources(tables, labels, ["linear_cka"], {})
        assert (layers is None) == streamed  # streamed: no layers in memory, so no null or interval either
        report = phang_report(sizes, matrix_of, ["linear_cka"], "title")
        assert loaded == ([] if streamed else ["orig.cls.parquet", "seed1.cls.parquet", "seed2.cls.parquet"])
        outputs[streamed] = report.rows, report.metrics
        monkeypatch.undo()
    assert outputs[True] == outputs[False]


def test_streamed_traces_and_exact_null_equal_the_in_memory_ones(rng):
    """Linear CKA's exact permutation null from one streamed pass (traces expanded around the first batch's
    means) equals permutation_matrix's on the whole arrays, for related and for independent layers."""
    base = rng.normal(size=(1500, 6))
    layers = [(base @ rng.normal(size=(6, 9)) + rng.normal(size=(1500, 9)) + 40.0).astype(np.float32),
              (rng.normal(size=(1500, 20)) * 3.0 - 7.0).astype(np.float32),
              (base @ rng.normal(size=(6, 5)) + 2.0 * rng.normal(size=(1500, 5))).astype(np.float32)]
    acc = LinearCKAAccumulator(precision="float64", sample_rows=1500)  # every row: the exact skewness too
    for start in range(0, 1500, 400):
        acc.update([a[start:start + 400] for a in layers])
    trace, products = acc.row_norm_products()
    norms = np.stack([((a - a.mean(0, dtype=np.float64)) ** 2).sum(1) for a in layers])
    np.testing.assert_allclose(trace, norms.sum(1), rtol=1e-12)
    np.testing.assert_allclose(products, norms @ norms.T, rtol=1e-10)
    np.testing.assert_allclose(np.diag(products), row_traces([(str(k), a) for k, a in enumerate(layers)])[1], rtol=1e-10)
    cells = ~np.eye(3, dtype=bool)
    got = streamed_linear_cka_null(acc, cells)
    want = permutation_matrix("linear_cka", layers, exact=True, cells=cells)
    for field in ("observed", "null_mean", "null_p95", "p_value"):
        np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-9, atol=1e-12)
    assert got.method == "exact" and np.isnan(got.p_value[0, 0])
    assert got.p_value[0, 2] < 1e-6 and got.p_value[0, 1] > 1e-3  # shared signal vs independent noise


def test_streamed_debiased_cka_equals_the_in_memory_matrix(rng):
    """Large offsets (activations are not centred) and uneven batches: the expansion around the first
    batch's means keeps debiased CKA, whose terms nearly cancel, to 1e-9 of the in-memory float64 value."""
    base = rng.normal(size=(900, 4))
    layers = [base @ rng.normal(size=(4, d)) + rng.normal(size=(900, d)) + offset
              for d, offset in ((5, 100.0), (12, -30.0), (3, 0.0))]
    acc = LinearCKAAccumulator(precision="float64")
    for start, stop in ((0, 7), (7, 400), (400, 900)):
        acc.update([a[start:stop] for a in layers])
    np.testing.assert_allclose(streamed_debiased_cka(acc, [0, 1, 2]), debiased_cka_matrix(layers), rtol=0, atol=1e-9)
    np.testing.assert_allclose(streamed_debiased_cka(acc, [2, 0]), debiased_cka_matrix([layers[2], layers[0]]),
                               rtol=0, atol=1e-9)


def test_a_streamed_stage_reports_linear_ckas_exact_null(tmp_path, rng, monkeypatch):
    """Streamed, the report carries the same linear CKA null as loaded (no bootstrap asked for), and SVCCA's
    null from the streamed pass: the same null means to Monte-Carlo error."""
    stage = _stage()
    tables = _three_runs(tmp_path, rng)
    labels = stage.run_labels([1, 2])
    sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
    uncertainty = Uncertainty(permutations=20, bootstrap=0, seed=0)
    reports = {}
    for streamed in (False, True):
        monkeypatch.setattr(similarity_inputs, "stream_layers", lambda *args, streamed=streamed: streamed)
        options = {"svcca": {"variance_threshold": 0.99}}
        matrix_of, layers, streamed_null = stage.layer_sources(tables, labels, ["linear_cka", "svcca"], options)
        assert (streamed_null is None) != streamed
        reports[streamed] = phang_report(sizes, matrix_of, ["linear_cka", "svcca"], "title", layers=layers,
                                         options=options, uncertainty=uncertainty, streamed_null=streamed_null)
        monkeypatch.undo()
    rows = {s: [r for r in reports[s].rows if r["measure"] == "linear CKA"] for s in (False, True)}
    assert rows[True] and any(r.get("p_value") is not None for r in rows[True])
    for loaded, streamed in zip(rows[False], rows[True]):
        assert loaded.keys() == streamed.keys()
        for key, value in loaded.items():
            assert streamed[key] == (pytest.approx(value, abs=1e-9) if isinstance(value, float) else value)
    assert reports[True].metrics["linear_cka"]["null"] == {"method": "exact", "permutations": 0}
    assert reports[False].metrics["svcca"]["null"] == {"method": "permutation", "permutations": 20}
    # These tables fit the accumulator's row sample, so the streamed null permutes those rows (a larger table
    # gets the rotation null, tests/test_rotation_null.py).
    assert reports[True].metrics["svcca"]["null"] == {"method": "permutation", "permutations": 20}
    rows = {s: [r for r in reports[s].rows if r["measure"] == "SVCCA" and r.get("null_mean") is not None]
            for s in (False, True)}
    assert len(rows[True]) == len(rows[False]) > 0
    for loaded, streamed in zip(rows[False], rows[True]):
        assert streamed["similarity"] == pytest.approx(loaded["similarity"], abs=1e-6)
        assert streamed["null_mean"] == pytest.approx(loaded["null_mean"], abs=0.01)  # ~0.09, sd/√20 ≈ 0.003


@pytest.mark.parametrize("measure, options", [("svcca", {"variance_threshold": 0.99}), ("pwcca", {}),
                                              ("mean_cca", {}), ("neuronsim", {}), ("mixedsim", {}),
                                              ("debiased_cka", {"method": "feature"})])
def test_streamed_moments_give_the_loaded_matrices(tmp_path, rng, monkeypatch, measure, options):
    """The stage's streamed path for the other measures that the streamed sums determine (second moments;
    debiased CKA also the row norms' products): the same stacked matrix as on the loaded layers, NaN for the
    constant embedding layers included."""
    stage = _stage()
    tables = _three_runs(tmp_path, rng)
    labels = stage.run_labels([1, 2])
    matrices = {}
    for streamed in (False, True):
        monkeypatch.setattr(similarity_inputs, "stream_layers", lambda *args, streamed=streamed: streamed)
        matrix_of, layers, _ = stage.layer_sources(tables, labels, ["linear_cka", measure], {measure: options})
        assert (layers is None) == streamed
        matrices[streamed] = matrix_of(measure), matrix_of("linear_cka")
        monkeypatch.undo()
    for streamed, loaded in zip(matrices[True], matrices[False]):
        assert np.array_equal(np.isnan(streamed), np.isnan(loaded)) and np.isnan(streamed[5]).all()
        np.testing.assert_allclose(streamed, loaded, rtol=0, atol=1e-9)


def test_when_the_stage_streams():
    widths = [768] * 39  # ORIG and two seeds of a 12-layer base model
    assert stream_layers(["linear_cka"], 200_000, widths)
    assert not stream_layers(["linear_cka"], 277, widths)  # RTE's validation set: loading is smaller
    assert stream_layers(["linear_cka", "svcca", "pwcca", "neuronsim", "mixedsim"], 200_000, widths)
    assert not stream_layers(["linear_cka", "rbf_cka"], 200_000, widths)  # RBF CKA needs the rows
    assert stream_layers(["debiased_cka"], 200_000, widths)
