"""ReSi's training interventions: the task-table changes (layersim.data.interventions: label noise, the shortcut
token, augmentation), their tests on runs (layersim.experiments.interventions: grouping AUPRC and ordering Spearman,
layer by layer), and `python tools/grounding_interventions.py` end to end on a tiny model."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layersim.data import interventions as iv
from layersim.data.tasks import generated_table, get_task
from layersim.errors import LayersimError
from layersim.similarity.grounding import ordering_spearman, separation_chance


def _table(task: str, size: int = 200):
    return generated_table(get_task(task), "train", size, 0)


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_label_noise_shuffles_that_share_of_the_labels_and_keeps_their_distribution(share):
    labels = np.arange(1000) % 7
    noisy = iv.shuffled_labels(labels, share, seed=4)
    assert np.array_equal(np.sort(noisy), np.sort(labels))  # a permutation: the label distribution is kept
    assert np.mean(noisy != labels) <= share and np.mean(noisy != labels) >= share * (1 - 1 / 7) - 0.05
    assert np.array_equal(iv.shuffled_labels(labels, share, seed=4), noisy)
    with pytest.raises(LayersimError, match="from 0 to 1"):
        iv.shuffled_labels(labels, 1.5, seed=0)


def test_a_changed_table_keeps_its_schema_metadata_and_rows_and_touches_only_its_column():
    spec = get_task("synth-roles")
    table = _table(spec.name)
    for changed, column in ((iv.with_label_noise(table, spec, 1.0, 3), "label"),
                            (iv.with_shortcut(table, spec, 1.0, 3, None), "text_a"),
                            (iv.with_augmentation(table, spec, 0.5, 3), None)):
        assert changed.schema == table.schema and changed.schema.metadata == table.schema.metadata
        assert changed.num_rows == table.num_rows
        assert changed.column("example_id").equals(table.column("example_id"))
        untouched = [name for name in table.column_names if name != column and name not in spec.text_columns]
        assert all(changed.column(name).equals(table.column(name)) for name in untouched)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_the_shortcut_token_is_in_front_of_that_share_of_the_examples_and_reveals_their_class(share):
    spec = get_task("synth-negation")
    table = _table(spec.name)
    changed = iv.with_shortcut(table, spec, share, 7, None)
    before, after = table.column("text").to_pylist(), changed.column("text").to_pylist()
    labels = table.column("label").to_pylist()
    marked = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(marked) == round(share * table.num_rows)
    assert all(after[i] == f"[CLASS{labels[i]}] {before[i]}" for i in marked)
    assert iv.with_shortcut(table, spec, share, 7, None).equals(changed)  # seeded
    with pytest.raises(LayersimError, match="shortcut level"):
        iv.with_shortcut(table, spec, -0.1, 0, None)


def test_a_regression_target_is_revealed_by_its_quantile_bin_in_label_order():
    spec = get_task("synth-similarity")
    table = _table(spec.name, 500)
    edges = iv.shortcut_edges(table, spec)
    labels = np.sort(table.column("label").to_numpy())
    bins = [int(iv.shortcut_token(label, edges)[6:-1]) for label in labels]
    assert bins == sorted(bins) and len(set(bins)) >= 3  # monotone in the label, several bins
    assert iv.shortcut_edges(_table("synth-negation"), get_task("synth-negation")) is None


def test_a_multiple_choice_shortcut_marks_the_correct_choice_only():
    spec = get_task("synth-choice")
    table = _table(spec.name, 50)
    changed = iv.with_shortcut(table, spec, 1.0, 0, None)
    for label, choices in zip(table.column("label").to_pylist(), changed.column("choices").to_pylist()):
        assert [c.startswith(iv.SHORTCUT_ANSWER) for c in choices] == [k == label for k in range(len(choices))]


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from("a b c d e f g".split()), min_size=1, max_size=30),
       strength=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_augmentation_keeps_at_least_one_word_and_only_the_text_s_own_words(words, strength, seed):
    text = " ".join(words)
    out = iv.augmented_text(text, strength, np.random.default_rng(seed)).split()
    assert 1 <= len(out) <= len(words) and not Counter(out) - Counter(words)
    assert iv.augmented_text(text, 0.0, np.random.default_rng(seed)) == text


def test_augmentation_deletes_about_half_its_strength_of_the_words_and_swaps_the_rest():
    rng = np.random.default_rng(0)
    text = " ".join(f"w{i}" for i in range(2000))
    out = iv.augmented_text(text, 0.5, rng).split()
    assert abs(len(out) / 2000 - 0.75) < 0.03  # each word deleted with probability 0.25
    order = [int(w[1:]) for w in out]
    assert order != sorted(order)  # swapped


def test_ordering_is_one_when_similarity_falls_with_the_level_gap_and_nan_with_one_level():
    levels = [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    gap = np.abs(np.subtract.outer(levels, levels))
    noise = 0.01 * np.random.default_rng(0).random(gap.shape)
    assert ordering_spearman(1.0 - gap + noise, levels) > 0.9
    assert ordering_spearman(gap + noise, levels) < -0.9
    assert np.isnan(ordering_spearman(1.0 - gap, [0.0] * 6))


def test_runs_that_move_with_their_level_group_and_order_perfectly_and_rank_first():
    from layersim.experiments.interventions import INTERVENTIONS, intervention_tests, rank_tests, tests_of

    rng = np.random.default_rng(2)
    base = [rng.normal(size=(60, 5)) for _ in range(3)]
    direction = [rng.normal(size=(60, 5)) for _ in range(3)]
    runs, levels = {}, {}
    for level in (0.0, 0.5, 1.0):
        for seed in (1, 2):
            label = f"{level}[{seed}]"
            layers = [b + 4 * level * d + 0.05 * rng.normal(size=(60, 5)) for b, d in zip(base, direction)]
            runs[label], levels[label] = {"clean": layers, "shortcut": layers}, level
    item = INTERVENTIONS["shortcut"]
    units, full = intervention_tests(runs, levels, item, ["linear_cka", "magnitude_difference"], {})
    assert set(units) == set(tests_of(item)) == {"shortcut", "shortcut_order", "shortcut_clean",
                                                   "shortcut_clean_order"}
    assert full["linear_cka"]["shortcut"]["per_layer"] == [1.0, 1.0, 1.0]
    assert min(full["linear_cka"]["shortcut_order"]["per_layer"]) > 0.8
    assert full["linear_cka"]["shortcut"]["same_pairs"] == 3
    assert full["linear_cka"]["shortcut"]["chance"] == pytest.approx(separation_chance(3, 12), abs=1e-6)
    out = rank_tests(units, full, ["linear_cka", "magnitude_difference"], 100, 0)
    assert [row["measure"] for row in out.rows][0] == "linear_cka"
    assert out.rows[0]["shortcut_low"] <= out.rows[0]["shortcut"] <= out.rows[0]["shortcut_high"]


def test_an_unknown_intervention_is_refused_in_one_sentence():
    from layersim.experiments.interventions import intervention

    with pytest.raises(LayersimError, match="unknown intervention 'noise'; valid ones are: label_noise, shortcut"):
        intervention("noise")


@pytest.mark.integration
def test_the_interventions_command_runs_on_a_tiny_model_and_writes_its_table(tmp_path, tiny_model_dir, monkeypatch):
    """`python tools/grounding_interventions.py` end to end, in-process: tiny-bert fine-tuned 2 steps per run at two
    levels × two seeds of each intervention on a generated task (level 0 trained once per seed); a table row per
    measure with every test, the figure, every layer's scores."""
    import json
    import shutil
    import sys
    from pathlib import Path

    import yaml

    from layersim.data.io import write_parquet
    from layersim.reporting.headlines import details_to_metrics

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import grounding_interventions

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir("tiny-bert"), tmp_path / "data/models/tiny-bert/pretrained")
    spec = get_task("synth-negation")
    for split, size in (("train", 40), ("validation", 24)):
        write_parquet(generated_table(spec, split, size, 0), tmp_path / f"data/tasks/{spec.name}/splits/{split}.parquet")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "model": "tiny-bert", "tasks": [spec.name], "seeds": [1, 2], "device": "cpu",
        "finetune": {"batch_size": 8, "max_steps": 2, "warmup_steps": 1, "eval_every": 0, "max_length": 32},
        "similarity": {"measures": {"head": ["linear_cka", "svcca"]}},
        "grounding": {"bootstrap": 50, "measures": ["cknna", "linear_cka"]}}))
    assert grounding_interventions.main(["--levels", "0", "1", "--out", "out"]) == 0
    rows = json.loads((tmp_path / f"out/{spec.name}/ranking.json").read_text())
    assert sorted(row["measure"] for row in rows) == ["cknna", "linear_cka", "svcca"]
    tests = ("label_noise", "shortcut", "shortcut_clean", "augmentation")
    for row in rows:
        assert all(f"{test}_order" in row for test in tests)
        assert all(row[f"{test}_chance"] == pytest.approx(separation_chance(2, 4), abs=1e-6) for test in tests)
        assert {f"{name}_mean_rank" for name in ("label_noise", "shortcut", "augmentation")} <= set(row)
    values = details_to_metrics(json.loads((tmp_path / f"out/{spec.name}/values.json").read_text()))
    assert len(values["cknna"]["shortcut_clean_order"]["per_layer"]) == 3 + 1  # tiny-bert: embeddings, 3 layers
    runs = {run["run"]: run for run in json.loads((tmp_path / f"out/{spec.name}/runs.json").read_text())}
    assert set(runs) == {f"{name}{level}[{seed}]" for name in ("label_noise", "shortcut", "augmentation")
                         for level in (0, 1) for seed in (1, 2)}
    assert runs["shortcut0[1]"]["accuracy"] == runs["augmentation0[1]"]["accuracy"]  # one level-0 run per seed
    assert (tmp_path / f"out/{spec.name}/interventions.png").stat().st_size > 0
    assert grounding_interventions.main(["--levels", "0.5", "--out", "out"]) == 1  # one level: one sentence
    assert grounding_interventions.main(["--interventions", "noise", "--out", "out"]) == 1
