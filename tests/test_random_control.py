"""The random-init control (Wu et al. 2020): the pretrained architecture with fresh weights, seeded, extracted
as run "random" and compared as RANDOM in the similarity and compare stages, each cell with its own null."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import pytest
import torch

from layersim.experiments import similarity_inputs
from layersim.similarity.comparisons import (RANDOM, pair_summary, phang_cells, phang_comparisons, stacked_matrix,
                                             stacked_null)
from layersim.errors import LayersimError
from layersim.reporting.headlines import similarity_headline
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.models.registry import load_encoder
from layersim.models.random_control import RANDOM_RUN, random_encoder, random_init_digest, random_run_metadata
from layersim.params import parse_params
from layersim.experiments.similarity import phang_report, run_labels, task_similarity
from layersim.similarity.results import Uncertainty

N, D, LAYERS = 60, 5, 3


def test_random_encoder_is_the_same_architecture_seeded_and_untrained(tiny_model_dir):
    folder = tiny_model_dir("tiny-bert")
    pretrained, state = load_encoder(folder), torch.random.get_rng_state()
    first, again, other = random_encoder(folder, 0), random_encoder(folder, 0), random_encoder(folder, 1)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left as it was
    assert first.config.to_dict() == pretrained.config.to_dict() and type(first) is type(pretrained)
    weights = {name: dict(model.named_parameters()) for name, model in
               (("first", first), ("again", again), ("other", other), ("pretrained", pretrained))}
    name = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(weights["first"][name], weights["again"][name])
    assert not torch.equal(weights["first"][name], weights["other"][name])
    assert not torch.equal(weights["first"][name], weights["pretrained"][name])


def test_the_random_runs_metadata_names_its_base_and_seed(tmp_path):
    orig = {"model_digest": "a" * 64, "task_digest": "b" * 64, "num_layers": LAYERS, "hidden_size": D}
    random = random_run_metadata(orig, 3)
    assert random["base_digest"] == orig["model_digest"] and random["init_seed"] == 3
    assert random["model_digest"] == random_init_digest(orig["model_digest"], 3)
    assert len({random_init_digest("a" * 64, 3), random_init_digest("a" * 64, 4), random_init_digest("c" * 64, 3),
                orig["model_digest"]}) == 4
    path = tmp_path / "random.cls.parquet"
    _write(path, np.random.default_rng(0), {**random, "run": RANDOM_RUN})
    ActivationTable(path, expect=random)
    with pytest.raises(LayersimError, match="init_seed|model_digest"):
        ActivationTable(path, expect=random_run_metadata(orig, 4))  # made with another seed: refused


def _write(path, rng, metadata, layers=None):
    layers = layers if layers is not None else [rng.normal(size=(N, D)).astype(np.float32) for _ in range(LAYERS + 1)]
    with ActivationWriter(path, num_layers=LAYERS, hidden_size=D, label_type=pa.int64(),
                          metadata={"model": "m", "pooling": "cls", "split": "validation", "task": "synth", **metadata}
                          ) as writer:
        writer.write(np.arange(N), np.zeros(N, dtype=np.int16), np.zeros(N, dtype=np.int64), layers)


def _planted(rng: np.random.Generator, seeds: int = 2) -> dict[str, list[np.ndarray]]:
    """FT seeds that keep ORIG's layers 0–1 (with noise); RANDOM independent of all of them."""
    orig = [rng.normal(size=(N, D)) for _ in range(LAYERS + 1)]
    models = {"ORIG": orig}
    for k in range(1, seeds + 1):
        models[f"FT[{k}]"] = [layer + 0.2 * rng.normal(size=(N, D)) if i < 2 else rng.normal(size=(N, D))
                              for i, layer in enumerate(orig)]
    return models | {RANDOM: [rng.normal(size=(N, D)) for _ in range(LAYERS + 1)]}


def test_orig_random_sits_at_its_null_while_orig_orig_and_the_kept_layers_do_not():
    models = _planted(np.random.default_rng(5))
    sizes = {label: len(layers) for label, layers in models.items()}
    report = phang_report(sizes, lambda m: stacked_matrix(m, models), ["linear_cka", "svcca"], "test",
                          layers=lambda: models, uncertainty=Uncertainty(permutations=50, bootstrap=0))
    for measure in ("linear_cka", "svcca"):
        metrics = report.metrics[measure]
        assert set(metrics) >= {"orig_orig", "ft_orig", "ft_ft", "ft1_ft2", "orig_random", "ft_random"}
        control = metrics["orig_random"]
        for k in range(LAYERS + 1):  # independent layers: never above chance, and near the null's mean
            assert control["p_value"][f"layer_{k:02d}"] > 0.05
            value, null = control["diagonal"][f"layer_{k:02d}"], control["null_mean"][f"layer_{k:02d}"]
            assert value == pytest.approx(null, abs=0.15)
            assert metrics["orig_orig"]["p_value"][f"layer_{k:02d}"] < 0.05
        assert metrics["ft_orig"]["p_value"]["layer_00"] < 0.05 < metrics["ft_random"]["p_value"]["layer_00"]
        # FT[1]–FT[2] is still the two seeds, not a seed against the control.
        assert metrics["ft1_ft2"]["diagonal"]["layer_00"] > 0.8
        assert metrics["ft_random"]["seeds"] == 2 and "seed_range" in metrics["ft_random"]
    comparisons = {row["comparison"] for row in report.rows}
    assert comparisons == {"ORIG–ORIG", "FT–ORIG", "FT–FT", "FT[1]–FT[2]", "ORIG–RANDOM", "FT–RANDOM"}
    assert all(row["p_value"] is not None for row in report.rows if "RANDOM" in row["comparison"])
    assert len(report.figure.axes) >= 2 * 6  # two measures × six panels, drawn beside the others
    headline = similarity_headline({"cls": report.metrics}, 0.05)["cls"]["linear_cka"]
    ft_orig, ft_random = report.metrics["linear_cka"]["ft_orig"], report.metrics["linear_cka"]["ft_random"]
    assert headline["ft_orig_above_random_top"] == pytest.approx(ft_orig["last_layer"] - ft_random["last_layer"])
    plt.close("all")


def test_phang_cells_cover_the_random_blocks_and_labels_put_the_control_last():
    sizes = {"ORIG": 2, "FT[1]": 2, "FT[2]": 2, RANDOM: 2}
    marker = np.arange(64.0).reshape(8, 8)
    cells = phang_cells(sizes, "ORIG", ["FT[1]", "FT[2]"])
    reported = np.concatenate([c.matrix.ravel() for c in phang_comparisons(marker, sizes, "ORIG", ["FT[1]", "FT[2]"])])
    np.testing.assert_array_equal(np.sort(marker[cells]), np.sort(reported))
    assert cells.sum() == 6 * 4
    assert run_labels([3, 7], 0) == {"orig": "ORIG", "seed3": "FT[1]", "seed7": "FT[2]", RANDOM_RUN: RANDOM}
    assert RANDOM_RUN not in run_labels([3, 7])


def test_compare_summary_gives_the_control_its_own_diagonal_and_null():
    models = _planted(np.random.default_rng(6), seeds=1)
    stacked = {"ORIG": models["ORIG"], RANDOM: models[RANDOM], "FT:synth": models["FT[1]"]}
    sizes = {label: len(layers) for label, layers in stacked.items()}
    null = stacked_null("linear_cka", stacked, permutations=20, seed=0)
    summary = pair_summary(stacked_matrix("linear_cka", stacked), sizes, "ORIG", 0, null)
    assert set(summary) == {RANDOM, "FT:synth"}
    assert all(p > 0.05 for p in summary[RANDOM]["p_value"].values())
    assert summary["FT:synth"]["p_value"]["layer_00"] < 0.05


def test_the_similarity_stage_reads_the_control_checked_against_its_seed(tmp_path, monkeypatch):
    """task_similarity over activation tables (the fine-tuned checkpoints' metadata stubbed): the control's
    tables are read and compared, with nulls; a table from another init seed is refused before any work."""
    import layersim.experiments.similarity as similarity_task

    known = {"orig": {"model_digest": "a" * 64, "task_digest": "b" * 64, "num_layers": LAYERS, "hidden_size": D}}
    known |= {f"seed{s}": {**known["orig"], "model_digest": str(s) * 64} for s in (1, 2)}
    monkeypatch.setattr(similarity_inputs, "run_expectations",
                        lambda checkpoints, seeds: {run: dict(values) for run, values in known.items()})
    monkeypatch.setattr(similarity_task, "checkpoint_flags", lambda checkpoints, seeds: {})  # no info files here
    models = _planted(np.random.default_rng(7))
    metadata = {"orig": known["orig"], "seed1": known["seed1"], "seed2": known["seed2"],
                RANDOM_RUN: random_run_metadata(known["orig"], 0)}
    for (run, meta), layers in zip(metadata.items(), models.values()):
        _write(tmp_path / f"{run}.cls.parquet", None, {**meta, "run": run},
               [layer.astype(np.float32) for layer in layers])
    def params(control):
        return parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1, 2], "similarity": {
            "measures": {"cls": ["linear_cka"]}, "attention_measures": [], "bootstrap": 0, "random_control": control}})

    out = task_similarity(tmp_path, tmp_path, "synth", params(0))
    control = out.metrics["cls"]["linear_cka"]["orig_random"]
    assert all(p > 0.05 for p in control["p_value"].values())
    assert {row["comparison"] for row in out.rows["plots", "cls.json"]} >= {"ORIG–RANDOM", "FT–RANDOM"}
    plt.close("all")
    with pytest.raises(LayersimError, match="random.cls.parquet"):
        task_similarity(tmp_path, tmp_path, "synth", params(1))
    assert "orig_random" not in task_similarity(tmp_path, tmp_path, "synth", params(None)).metrics["cls"]["linear_cka"]
    plt.close("all")



def test_further_random_controls_give_the_above_random_headline_its_spread(tmp_path, monkeypatch):
    """similarity.random_controls = 3: tables of runs random, random2, random3 (init seeds 0, 1, 2, each checked);
    the details hold FT–ORIG's top minus each control's, and the headline their mean with a t-interval over the
    draws, the first control's value among them; a further control's table from another seed is refused."""
    import layersim.experiments.similarity as similarity_task
    from layersim.models.random_control import control_runs

    assert control_runs(None, 3) == {} and control_runs(4) == {RANDOM_RUN: 4}
    assert control_runs(0, 3) == {RANDOM_RUN: 0, "random2": 1, "random3": 2}
    known = {"orig": {"model_digest": "a" * 64, "task_digest": "b" * 64, "num_layers": LAYERS, "hidden_size": D}}
    known |= {f"seed{s}": {**known["orig"], "model_digest": str(s) * 64} for s in (1, 2)}
    monkeypatch.setattr(similarity_inputs, "run_expectations",
                        lambda checkpoints, seeds: {run: dict(values) for run, values in known.items()})
    monkeypatch.setattr(similarity_task, "checkpoint_flags", lambda checkpoints, seeds: {})
    rng = np.random.default_rng(3)
    models = _planted(rng)
    models["FT[1]"][-1] = models["ORIG"][-1] + 0.3 * rng.normal(size=(N, D))  # the top layer kept: above random
    runs = {"orig": "ORIG", "seed1": "FT[1]", "seed2": "FT[2]", RANDOM_RUN: RANDOM}
    for run, label in runs.items():
        meta = random_run_metadata(known["orig"], 0) if run == RANDOM_RUN else known[run]
        _write(tmp_path / f"{run}.cls.parquet", None, {**meta, "run": run},
               [x.astype(np.float32) for x in models[label]])
    for run, seed in (("random2", 1), ("random3", 2)):
        _write(tmp_path / f"{run}.cls.parquet", rng, {**random_run_metadata(known["orig"], seed), "run": run})
    params = parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1, 2], "similarity": {
        "measures": {"cls": ["linear_cka", "svcca"]}, "attention_measures": [], "bootstrap": 20,
        "permutations": 20, "random_control": 0, "random_controls": 3}})
    out = task_similarity(tmp_path, tmp_path, "synth", params)
    plt.close("all")
    headline = similarity_headline(out.metrics, 0.05)
    for measure in ("linear_cka", "svcca"):
        spread = out.metrics["cls"][measure]["ft_orig_above_random_controls"]
        assert spread["controls"] == 3 and list(spread["values"]) == ["seed_0", "seed_1", "seed_2"]
        entry = headline["cls"][measure]
        assert spread["values"]["seed_0"] == pytest.approx(entry["ft_orig_above_random_top"], abs=1e-5)
        values = list(spread["values"].values())
        assert entry["ft_orig_above_random_top_controls_mean"] == pytest.approx(np.mean(values), abs=1e-5)
        assert entry["ft_orig_above_random_top_controls_sd"] == pytest.approx(np.std(values, ddof=1), abs=1e-5)
        assert 0 < entry["ft_orig_above_random_top_controls_ci_low"] < entry["ft_orig_above_random_top_controls_mean"] \
            < entry["ft_orig_above_random_top_controls_ci_high"]
    from layersim.reporting.cells import fmt
    from layersim.reporting.similarity_tables import similarity_tables

    page = {table.title: table for table in similarity_tables(out.metrics, 0.05)}["cls: top layer against chance"]
    rows = {row[0]: row for row in page.rows if row[1] == "FT–ORIG minus FT–RANDOM over 3 random-init controls"}
    assert rows["svcca"][2].startswith(fmt(headline["cls"]["svcca"]["ft_orig_above_random_top_controls_mean"]) + " ± ")
    _write(tmp_path / "random3.cls.parquet", rng, {**random_run_metadata(known["orig"], 7), "run": "random3"})
    with pytest.raises(LayersimError, match="random3.cls.parquet"):
        task_similarity(tmp_path, tmp_path, "synth", params)
    plt.close("all")
    with pytest.raises(LayersimError, match="random_controls"):
        parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1, 2],
                      "similarity": {"random_control": None, "random_controls": 2}})


def test_above_random_has_a_paired_bootstrap_interval_over_examples():
    """FT–ORIG's top layer minus FT–RANDOM's, both on the same resamples of the examples: its interval is of the
    difference. Planted: the top layer keeps ORIG's (with noise) in one case, is unrelated to it in the other; the
    first difference's interval lies above 0, the second's covers 0, and both hold the value's basic interval."""
    from layersim.similarity.comparison_intervals import above_random_interval
    from layersim.similarity.inference.bootstrap import bootstrap_pairs

    rng = np.random.default_rng(7)
    models = _planted(rng)
    kept = {**models, "FT[1]": [*models["FT[1]"][:-1], models["ORIG"][-1] + 0.5 * rng.normal(size=(N, D))]}
    found = above_random_interval("linear_cka", kept, resamples=200, seed=0)
    assert found["ci_method"] == "basic" and found["resamples"] == 200
    assert 0 < found["ci_low"] < found["value"] < found["ci_high"]
    unrelated = above_random_interval("linear_cka", models, resamples=200, seed=0)
    assert unrelated["ci_low"] < 0 < unrelated["ci_high"]
    # paired: the difference's resamples are those of the two tops drawn together
    pairs = bootstrap_pairs("linear_cka", [kept["FT[1]"][-1]] * 2, [kept["ORIG"][-1], kept[RANDOM][-1]],
                            resamples=200, seed=0, interval="basic")
    differences = pairs.values[:, 0] - pairs.values[:, 1]
    assert found["value"] == pytest.approx(pairs.estimate[0] - pairs.estimate[1])
    assert found["ci_high"] == pytest.approx(2 * found["value"] - np.quantile(differences, 0.025))
    assert above_random_interval("svcca", kept, resamples=20, seed=0) is None  # no interval method covers svcca
    assert above_random_interval("linear_cka", {k: v for k, v in kept.items() if k != RANDOM}, resamples=20,
                                 seed=0) is None
