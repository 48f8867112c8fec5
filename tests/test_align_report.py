"""The align stage's report, apart from the stage: run labels, pairs, and the metrics of a small exact case."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.experiments.align import (AlignReport, Pair, compared_pairs, injection_pair, method_options, over_pairs,
                                        run_labels)
from layersim.errors import LayersimError
from layersim.params import AlignParams, Params, parse_params


def _params(seeds, pairs=None):
    from dvc_project import repository_params

    raw = repository_params()
    raw.update(model="tiny-bert", tasks=["synth-negation"], seeds=list(seeds))
    raw["finetune"]["max_length"] = 64
    raw["align"]["pairs"] = pairs
    return parse_params(raw)


def test_runs_and_pairs_follow_the_seeds() -> None:
    assert run_labels([3, 7]) == {"ORIG": "orig", "FT[1]": "seed3", "FT[2]": "seed7"}
    assert compared_pairs(_params([3, 7])) == [Pair("FT[1]", "FT[2]", "finetuning_seeds"),
                                               Pair("ORIG", "FT[1]", "finetuning")]
    assert compared_pairs(_params([3])) == [Pair("ORIG", "FT[1]", "finetuning")]


def test_pairs_of_every_kind_and_the_pair_injected() -> None:
    params = _params([1, 2, 3], [["tiny-bert-seed1", "tiny-bert-seed2"], ["FT3", "ORIG"], ["ORIG", "tiny-bert-seed1"],
                                 ["FT2", "tiny-bert-seed2"], ["FT1", "FT3"]])
    pairs = compared_pairs(params)
    assert [(p.label, p.kind) for p in pairs] == [
        ("tiny-bert-seed1→tiny-bert-seed2", "pretrained_models"), ("FT[3]→ORIG", "finetuning"),
        ("ORIG→tiny-bert-seed1", "pretrained_models"), ("FT[2]→tiny-bert-seed2", "mixed"),
        ("FT[1]→FT[3]", "finetuning_seeds")]
    assert injection_pair(pairs, [1, 2, 3]) == ("FT[1]", "FT[3]")  # the first with a fine-tuned target
    assert injection_pair(pairs[:2], [1, 2, 3]) == ("FT[1]", "FT[2]")
    assert injection_pair([], [1]) == ("ORIG", "FT[1]")


def test_pairs_must_name_known_runs_and_models() -> None:
    with pytest.raises(LayersimError, match=r"align.pairs has 'FT2', but seeds = \[1\] holds 1 seed"):
        _params([1], [["ORIG", "FT2"]])
    with pytest.raises(LayersimError, match=r"did you mean 'multiberts-1'\?.*multiberts-0 … multiberts-24"):
        _params([1], [["ORIG", "multibert-1"]])
    with pytest.raises(LayersimError, match=r"of widths 32 and 768"):
        _params([1], [["ORIG", "multiberts-3"]])
    with pytest.raises(LayersimError, match=r"aligns a run with itself"):
        _params([1], [["FT1", "FT1"]])


def test_mean_and_sd_over_the_pairs_of_a_kind() -> None:
    errors = {"a→b": {"inn": [0.1, 0.3]}, "c→d": {"inn": [0.3, 0.5]}, "ORIG→FT[1]": {"inn": [0.2, 0.2]}}
    pairs = [Pair("a", "b", "pretrained_models"), Pair("ORIG", "FT[1]", "finetuning"), Pair("c", "d", "pretrained_models")]
    grouped = over_pairs(errors, pairs)
    assert list(grouped) == ["finetuning", "pretrained_models"]  # the order of PAIR_KINDS
    inn = grouped["pretrained_models"]["inn"]
    assert grouped["pretrained_models"]["pairs"] == ["a→b", "c→d"]
    np.testing.assert_allclose(inn["mean"], [0.2, 0.4])
    np.testing.assert_allclose(inn["sd"], [np.sqrt(0.02), np.sqrt(0.02)])  # sample sd of (0.1, 0.3)
    assert inn["layer_mean"] == pytest.approx(0.3) and inn["layer_mean_sd"] == pytest.approx(np.sqrt(0.02))
    assert grouped["finetuning"]["inn"]["sd"] == [0.0, 0.0]  # one pair: no spread


def test_method_options_come_from_the_align_params() -> None:
    params = Params(model="tiny-bert", tasks=("synth-negation",), seeds=(1,), device="cpu",
                    align=AlignParams(ridge=0.5, inn_depth=2, steps=9))
    options = method_options(params)
    assert options["linear"] == {"ridge": 0.5}
    assert options["inn"]["depth"] == 2 and options["inn"]["steps"] == 9 and options["mlp"]["steps"] == 9
    assert options["inn"]["device"] == options["mlp"]["device"] == "cpu"


def test_metrics_of_a_small_report() -> None:
    matrix = np.array([[0.1, 0.5], [0.7, 0.3]])
    report = AlignReport(rows=[], errors={"FT[1]→FT[2]": {"linear": [0.2, 0.4]}}, recovery={"linear": 0.9},
                         matrix_pair=("FT[1]", "FT[2]"), matrix=matrix, injection={"methods": {}}, num_train=30,
                         num_rows=40)
    metrics = report.metrics("mean")
    assert metrics["train_rows"] == 30 and metrics["validation_rows"] == 10 and metrics["table_precision"] == "float32"
    assert metrics["alignment"] == {"FT[1]→FT[2]": {"linear": {"layer_00": 0.2, "layer_01": 0.4}}}
    assert metrics["alignment_mean"]["FT[1]→FT[2]"]["linear"] == pytest.approx(0.3)
    assert metrics["layer_matrix_inn"] == {"pair": "FT[1]→FT[2]", "diagonal_mean": 0.2, "offdiagonal_mean": 0.6}
