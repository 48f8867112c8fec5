"""finetune.compare_methods (issue 52): runs of another fine-tuning method beside finetune.method's, with the same
seeds, named, placed and labelled in one place (layersim.data.layout), found by the finetune_compared stage's
matrix item, and compared by similarity with ORIG and with FT in the same stacked matrix, with nulls and intervals.
The whole journey (dvc repro with full and LoRA runs): tests/test_pipeline.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from layersim.data.layout import (METHOD_LABELS, FinetunedRun, as_runs, finetuned, finetuned_run, finetuned_runs,
                                  run_labels)
from layersim.errors import LayersimError
from layersim.params.vocabulary import FINETUNE_METHODS


def _finetune(method="full", compare_methods=("lora",)):
    from layersim.params.schema import FinetuneParams

    return FinetuneParams(method=method, compare_methods=tuple(compare_methods))


def test_every_method_has_a_figure_label():
    assert set(METHOD_LABELS) == set(FINETUNE_METHODS)


def test_runs_are_named_placed_and_labelled_by_method_then_seed():
    runs = finetuned_runs(_finetune(), [3, 7])
    assert [run.name for run in runs] == ["seed3", "seed7", "lora-seed3", "lora-seed7"]
    assert [run.folder("c") for run in runs] == [Path("c/seed3/model"), Path("c/seed7/model"),
                                                 Path("c/lora/seed3/model"), Path("c/lora/seed7/model")]
    assert run_labels(runs) == {"seed3": "FT[1]", "seed7": "FT[2]", "lora-seed3": "LoRA[1]", "lora-seed7": "LoRA[2]"}
    assert finetuned_runs(_finetune(), [3], compared=False) == [FinetunedRun("full", 3)]
    # finetune.method's runs keep the paths and names they had before compare_methods existed.
    assert runs[0].folder("c") == finetuned("c", 3) and as_runs([3])[0].name == "seed3"


def test_a_lora_main_method_is_ft_and_a_compared_full_run_is_labelled_full():
    runs = finetuned_runs(_finetune("lora", ["full"]), [0])
    assert run_labels(runs) == {"seed0": "FT[1]", "full-seed0": "Full[1]"}


@pytest.mark.parametrize("run", ["seed3", "lora-seed7", "full-seed0"])
def test_a_run_name_leads_back_to_its_checkpoint(run):
    method, _, seed = run.rpartition("-")
    assert finetuned_run("c", run) == FinetunedRun(method, int(seed[4:]), primary=not method).folder("c")


@pytest.mark.parametrize("run", ["orig", "random", "qlora-seed1", "lora-seedx", "lora-", "seed"])
def test_a_name_that_is_no_fine_tuned_run_is_refused(run):
    with pytest.raises(ValueError, match="is not a fine-tuned run"):
        finetuned_run("c", run)


def test_the_compared_stage_finds_its_task_method_and_seed():
    from layersim.params.stage_args import fill_placeholders, matrix_item

    params = _params()
    assert matrix_item("finetune_compared@synth-roles-lora-12", params, with_seed=True, with_method=True) == {
        "task": "synth-roles", "method": "lora", "seed": 12}
    argv = fill_placeholders(["--task", "@task", "--method", "@method", "--seed", "@seed"], params,
                             "finetune_compared@synth-roles-lora-3")
    assert argv == ["--task", "synth-roles", "--method", "lora", "--seed", "3"]
    with pytest.raises(LayersimError, match=r"names no single matrix item .*task, method, seed .*synth-roles-lora-3"):
        matrix_item("finetune_compared@synth-roles-full-3", params, with_seed=True, with_method=True)


def test_a_compared_run_trains_with_its_own_method_and_nothing_else_changes():
    from layersim.training.train import with_method

    params = _params()
    assert with_method(params, None) is params
    lora = with_method(params, "lora")
    assert lora.finetune.method == "lora"
    assert dataclasses.replace(lora.finetune, method=params.finetune.method) == params.finetune
    with pytest.raises(LayersimError, match=r"--method full is not one of finetune.compare_methods = \['lora'\]"):
        with_method(params, "full")


def test_adding_a_compared_method_keeps_every_run_fingerprint(monkeypatch):
    """A full run resumes its saved state (and is the same run) whatever compare_methods lists."""
    from layersim.data.tasks import get_task
    from layersim.training import train

    monkeypatch.setattr(train, "model_info", lambda folder: {"digest": "base"})
    monkeypatch.setattr(train, "file_digest", lambda path: "tables")
    spec = get_task("synth-roles")
    prints = [train.run_fingerprint("base", "tables", spec, _finetune(compare_methods=methods), 0)
              for methods in ((), ("lora",))]
    assert prints[0] == prints[1]
    assert train.run_fingerprint("base", "tables", spec, _finetune("lora", ()), 0) != prints[0]


def _params(seeds=(3, 12)):
    import yaml

    from dvc_project import repository_params_text, tiny_params
    from layersim.params import parse_params

    doc = tiny_params(yaml.safe_load(repository_params_text()), model="tiny-bert", tasks=["synth-roles"],
                      seeds=list(seeds))
    doc["finetune"]["compare_methods"] = ["lora"]
    return parse_params(doc)


# --- similarity: the compared runs in the stacked matrix -------------------------------------------------


@pytest.fixture(scope="module")
def stacked():
    """ORIG; three FT seeds (ORIG plus independent noise); two LoRA runs that are exact copies of ORIG."""
    rng = np.random.default_rng(0)
    orig = [rng.normal(size=(60, 6)) for _ in range(3)]
    models = {"ORIG": orig} | {f"FT[{i}]": [x + rng.normal(size=x.shape) for x in orig] for i in (1, 2, 3)}
    models |= {f"LoRA[{i}]": [x.copy() for x in orig] for i in (1, 2)}
    return models


def _result(models, uncertainty=True):
    from layersim.similarity.comparisons import stacked_matrix
    from layersim.similarity.results import Uncertainty, phang_result

    sizes = {label: len(layers) for label, layers in models.items()}
    found = Uncertainty(permutations=99, bootstrap=50, seed=0) if uncertainty else None
    return phang_result("linear_cka", stacked_matrix("linear_cka", models), sizes, models=models,
                        uncertainty=found), sizes


def test_lora_is_compared_with_orig_and_ft_beside_phangs_comparisons(stacked):
    from layersim.similarity.results import finetuned_labels, trained_labels

    result, sizes = _result(stacked)
    by_key = {c.key: c for c in result.comparisons}
    assert list(by_key) == ["orig_orig", "ft_orig", "ft_ft", "ft1_ft2", "lora_orig", "lora_ft"]
    assert [by_key[k].title for k in ("lora_orig", "lora_ft")] == ["LoRA–ORIG", "LoRA–FT"]
    assert finetuned_labels(sizes) == ["FT[1]", "FT[2]", "FT[3]"]  # LoRA runs are not FT seeds
    assert trained_labels(sizes) == ["ORIG", "FT[1]", "FT[2]", "FT[3]"]  # nor in Wu's localization averages
    # LoRA = ORIG exactly: LoRA–ORIG is 1 on the diagonal, LoRA–FT is FT–ORIG transposed (CKA is symmetric).
    np.testing.assert_allclose(np.diag(by_key["lora_orig"].matrix), 1.0, atol=1e-12)
    np.testing.assert_allclose(by_key["lora_ft"].matrix, by_key["ft_orig"].matrix.T, atol=1e-12)
    assert sorted(by_key["lora_orig"].per_seed) == ["LoRA[1]", "LoRA[2]"]
    # The seeds' spread (FT[i]–FT[j]) is over the three FT runs only: 3 pairs, not the LoRA copies' 1.0.
    assert result.seed_spread is not None and np.all(result.seed_spread[0] < 0.99)


def test_compared_cells_get_the_null_and_intervals_of_phangs_cells(stacked):
    result, _ = _result(stacked)
    by_key = {c.key: c for c in result.comparisons}
    for key in ("lora_orig", "lora_ft"):
        c = by_key[key]
        assert c.p_value is not None and np.isfinite(np.diag(c.p_value)).all()
        assert c.interval is not None and np.all(c.interval[0] <= c.interval[1] + 1e-12)
    # identical representations are far above chance; FT–ORIG's cells get the same null whichever runs are stacked
    assert np.all(np.diag(by_key["lora_orig"].p_value) <= 0.01)
    without, _ = _result({k: v for k, v in stacked.items() if not k.startswith("LoRA")})
    ft_orig = {c.key: c for c in without.comparisons}["ft_orig"]
    np.testing.assert_allclose(by_key["ft_orig"].matrix, ft_orig.matrix, atol=1e-12)


def test_the_report_names_and_the_headline_reads_the_compared_comparisons(stacked):
    from layersim.reporting.headlines import compared_keys, similarity_headline
    from layersim.reporting.similarity_tables import comparison_name
    from layersim.reporting.similarity import phang_summary
    from layersim.similarity.results import Uncertainty

    result, sizes = _result(stacked)
    report = phang_summary([result], sizes, "t", uncertainty=Uncertainty(permutations=99, bootstrap=50, seed=0))
    details = report.metrics["linear_cka"]
    assert compared_keys(details) == ["lora_orig", "lora_ft"]
    assert [comparison_name(key) for key in ("lora_orig", "lora_ft", "ft_orig", "full_ft")] == [
        "LoRA–ORIG", "LoRA–FT", "FT–ORIG", "Full–FT"]
    headline = similarity_headline({"cls": {"linear_cka": details}}, 0.05)["cls"]["linear_cka"]
    assert headline["lora_orig_top"] == pytest.approx(1.0) and headline["lora_ft_top"] == details["lora_ft"]["last_layer"]
    # one line per diagonal in the curve data, the compared ones included
    assert {row["series"] for row in report.diagonal_rows} >= {"linear CKA LoRA–ORIG", "linear CKA LoRA–FT"}


def test_lora_is_compared_with_other_seeds_ft_beside_ft_against_itself(stacked):
    """LoRA[i]–FT[j ≠ i] (no shared seed) beside FT[i]–FT[j], with their difference and the confounded LoRA[i]–FT[i]:
    here LoRA = ORIG, so LoRA[i]–FT[j] is FT[j]'s FT–ORIG diagonal."""
    from layersim.similarity.comparisons import block

    result, sizes = _result(stacked)
    spreads = result.pair_spreads
    assert set(spreads) == {"ft_pairs", "lora_ft_other_seed", "lora_ft_other_seed_minus_ft_pairs", "lora_ft_same_seed"}
    to_orig = {j: np.diag(block(result.matrix, sizes, f"FT[{j + 1}]", "ORIG")) for j in range(3)}
    # Two LoRA runs: pairs (LoRA[1], FT[2]) and (LoRA[2], FT[1]); the same-seed ones (LoRA[1], FT[1]), (LoRA[2], FT[2]).
    np.testing.assert_allclose(spreads["lora_ft_other_seed"].mean, (to_orig[1] + to_orig[0]) / 2, atol=1e-12)
    assert spreads["lora_ft_other_seed"].pairs == 2 and spreads["lora_ft_other_seed"].low is None  # 2 seeds
    assert spreads["ft_pairs"].pairs == 3 and spreads["ft_pairs"].low is not None  # 3 FT seeds: an interval
    np.testing.assert_allclose(spreads["lora_ft_other_seed_minus_ft_pairs"].mean,
                               spreads["lora_ft_other_seed"].mean - spreads["ft_pairs"].mean, atol=1e-12)


def test_the_compared_methods_top_layers_are_claims_of_the_headline_family(stacked):
    from layersim.reporting.headlines import similarity_headline
    from layersim.reporting.similarity import phang_summary
    from layersim.similarity.results import Uncertainty, correct_claims

    result, sizes = _result(stacked)
    details = phang_summary([result], sizes, "t", uncertainty=Uncertainty(permutations=99, bootstrap=50,
                                                                          seed=0)).metrics["linear_cka"]
    layers = len(details["ft_orig"]["diagonal"])
    # FT–ORIG's every layer, the top layer of FT[1]–FT[2], LoRA–ORIG and LoRA–FT (no RANDOM here).
    assert correct_claims({"cls": {"linear_cka": details}}, "holm") == layers + 3
    headline = similarity_headline({"cls": {"linear_cka": details}}, 0.05)["cls"]["linear_cka"]
    assert {"lora_orig_top_p_adjusted", "lora_ft_top_p_adjusted"} <= set(headline)
    assert headline["ft_pairs_top"] == pytest.approx(details["ft_pairs"]["mean"][max(details["ft_pairs"]["mean"])])
    assert headline["ft_pairs_top_ci_low"] <= headline["ft_pairs_top"] <= headline["ft_pairs_top_ci_high"]
    assert "lora_ft_other_seed_top" in headline and "lora_ft_other_seed_top_ci_low" not in headline  # 2 LoRA seeds


def test_the_page_puts_other_seed_pairs_beside_ft_pairs_and_says_which_runs_share_a_seed(stacked):
    from layersim.reporting.similarity_tables import similarity_tables
    from layersim.reporting.similarity import phang_summary
    from layersim.similarity.results import Uncertainty

    result, sizes = _result(stacked)
    details = phang_summary([result], sizes, "t", uncertainty=Uncertainty(permutations=99, bootstrap=50,
                                                                          seed=0)).metrics
    tables = {table.title: table for table in similarity_tables({"cls": details}, 0.05)}
    pairs = tables["cls: runs of different seeds, top layer"]
    assert [row[1] for row in pairs.rows] == ["FT[i]–FT[j], i ≠ j", "LoRA[i]–FT[j], j ≠ i",
                                              "LoRA[i]–FT[j] − FT[i]–FT[j]", "LoRA[i]–FT[i]"]
    assert "jackknife" in pairs.rows[0][2] and "no interval" in pairs.rows[1][2]  # 3 FT seeds; 2 LoRA seeds
    assert "head's initialisation" in pairs.rows[3][3] and "LoRA[i] and FT[i] share" in pairs.note
    assert "the two share seed 1, so the head's" in tables["cls: top layer against chance"].note
