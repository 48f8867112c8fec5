"""Metrics files hold headline scalars; details plot data hold every value (layersim.reporting.headlines)."""

import math

import pytest

from layersim.data.tasks import get_task
from layersim.reporting.headlines import (align_headline, compare_headline, details_to_metrics, first_layer_at_chance,
                                          last_block_starts, metrics_to_details, similarity_headline, skip_headline,
                                          summary_headline, truncate_headline)


def _layers(*values, first=0):
    return {f"layer_{k + first:02d}": v for k, v in enumerate(values)}


FULL_SIMILARITY = {
    "cls": {
        "linear_cka": {
            "null": {"method": "exact", "permutations": 0},
            "ft_orig": {"diagonal": _layers(0.99, 0.9, 0.5, first=1), "last_layer": 0.5, "diagonal_mean": 0.8,
                        "p_value": _layers(0.001, 0.01, 0.2, first=1), "null_mean": _layers(0.3, 0.3, 0.3, first=1)},
            "ft1_ft2": {"diagonal": _layers(0.98, 0.95, 0.7, first=1), "last_layer": 0.7},
            "orig_orig": {"diagonal": _layers(1.0, 1.0, 1.0, first=1), "offdiagonal_mean": 0.6},
        },
        "rows": 60,
    },
    "tokens": {
        "svcca": {"ft_orig": {"diagonal": _layers(0.9, 0.8), "last_layer": 0.8, "p_value": _layers(0.01, 0.02)},
                  "kept_dimensions": {"ORIG": [3, 4]}},
        "localization": {"ORIG": _layers(0.1, -0.2)},
    },
    "attention": {"jensen_shannon": {"ft_orig": {"diagonal": _layers(0.8, 0.6, first=1), "last_layer": 0.6},
                                     "ft1_ft2": {"diagonal": _layers(0.9, 0.9, first=1), "last_layer": 0.9}}},
}


def test_details_hold_every_value_and_give_the_metrics_back():
    rows = metrics_to_details(FULL_SIMILARITY)
    assert {"metric": "cls.linear_cka.ft_orig.diagonal", "layer": 3, "value": 0.5} in rows
    assert {"metric": "cls.linear_cka.null.method", "layer": None, "value": "exact"} in rows
    assert {"metric": "tokens.svcca.kept_dimensions.ORIG", "layer": 1, "value": 4} in rows  # list position = layer
    leaves = sum(1 for _ in _leaves(FULL_SIMILARITY))
    assert len(rows) == leaves
    back = details_to_metrics(rows)
    assert back["cls"] == FULL_SIMILARITY["cls"] and back["attention"] == FULL_SIMILARITY["attention"]
    assert back["tokens"]["svcca"]["kept_dimensions"]["ORIG"] == {"layer_00": 3, "layer_01": 4}
    assert metrics_to_details(back) == rows  # a fixed point: nothing lost, nothing added


def _leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        yield from value
    else:
        yield value


def test_first_layer_at_chance():
    assert first_layer_at_chance(_layers(0.001, 0.01, 0.2, first=1), 0.05) == 3
    assert first_layer_at_chance(_layers(0.001, 0.05, 0.2, first=1), 0.05) == 2  # p = significance: not above
    assert first_layer_at_chance(_layers(0.001, 0.01), 0.05) is None
    assert first_layer_at_chance({"layer_10": 0.5, "layer_02": 0.9, "layer_00": math.nan}, 0.05) == 2
    assert first_layer_at_chance({"layer_00": None, "layer_01": 0.3}, 0.05) == 1


def test_similarity_headline():
    headline = similarity_headline(FULL_SIMILARITY, significance=0.05)
    assert headline == {
        "cls": {"linear_cka": {"ft_orig_top": 0.5, "ft_orig_chance_from": 3, "ft1_ft2_top": 0.7}},
        "tokens": {"svcca": {"ft_orig_top": 0.8, "ft_orig_chance_from": None}},  # one seed: no FT[1]–FT[2]
        "attention": {"jensen_shannon": {"ft_orig_top": 0.6}},
    }
    assert similarity_headline(FULL_SIMILARITY, significance=0.01)["cls"]["linear_cka"]["ft_orig_chance_from"] == 2


def test_truncate_skip_align_compare_headlines():
    truncate = {"droppable_top_layers_untuned": 2, "droppable_top_layers_tuned": 4, "full": 0.9,
                "untuned": _layers(0.5, 0.6, 0.9)}
    assert truncate_headline(truncate) == {"untuned_droppable_top_layers": 2, "tuned_droppable_top_layers": 4}
    assert skip_headline({"largest_span_within_tolerance": {"first": 2, "last": 4, "length": 3}}) == \
        {"longest_skippable_span": 3}
    assert skip_headline({"largest_span_within_tolerance": None}) == {"longest_skippable_span": 0}
    def kind(pairs, **means):
        return {"pairs": "; ".join(pairs), "num_pairs": len(pairs), **{m: {"layer_mean": v, "layer_mean_sd": 0.01} for m, v in means.items()}}

    align = {"alignment_over_pairs": {"finetuning_seeds": kind(["FT[1]→FT[2]"], linear=0.4, cca=0.5, inn=0.3),
                                      "finetuning": kind(["ORIG→FT[1]"], linear=0.6, cca=0.7, inn=0.65)}}
    assert align_headline(align) == {"finetuning_seeds": {"linear": 0.4, "cca": 0.5, "inn": 0.3, "inn_advantage": 0.1}}
    one = {"alignment_over_pairs": {"finetuning": kind(["ORIG→FT[1]"], linear=0.4)}}
    assert align_headline(one) == {"finetuning": {"linear": 0.4}}
    several = {"alignment_over_pairs": {"pretrained_models": kind(["a→b", "c→d"], linear=0.4, inn=0.2)}}
    assert align_headline(several) == {"pretrained_models": {"linear": 0.4, "linear_sd": 0.01, "inn": 0.2,
                                                             "inn_sd": 0.01, "inn_advantage": 0.2}}
    seeds = {"alignment": {"pretrained": {"linear": {"layer_mean": 0.5}}, "finetuned": {"linear": {"layer_mean": 0.7}}},
             "injection": {"methods": {"linear": {"mean": 0.6, "sd": 0.1}},
                           "references": {"random label": {"mean": 0.5, "sd": 0.0}}}}
    assert align_headline(one | {"pretraining_seeds": seeds}) == {
        "finetuning": {"linear": 0.4},
        "pretraining_seeds": {"linear_before": 0.5, "linear_after": 0.7, "injected_linear": 0.6,
                              "injected_random_label": 0.5}}
    compare = {"cls": {"linear_cka": {"FT:a": {"diagonal": _layers(None, 0.8, 0.6)},
                                      "other-model": {"best_match": {}}}},
               "tokens": {"svcca": {"FT:a": {"diagonal": _layers(0.1)}}}}
    assert compare_headline(compare, "cls", "linear_cka") == {"cls": {"linear_cka": {"FT:a": 0.7}}}
    assert compare_headline(compare, "mean", "linear_cka") == {}


def test_summary_is_the_mean_over_tasks():
    per_stage = {
        "finetune": {"a": [{"accuracy": 0.8}, {"accuracy": 0.6}], "b": [{"pearson": 0.5, "spearman": 0.1}] * 2},
        "similarity": {"a": {"cls": {"linear_cka": {"ft_orig_top": 0.4}}},
                       "b": {"cls": {"linear_cka": {"ft_orig_top": None}}}},
        "truncate": {"a": {"untuned_droppable_top_layers": 1, "tuned_droppable_top_layers": 3},
                     "b": {"untuned_droppable_top_layers": 2, "tuned_droppable_top_layers": 4}},
        "skip": {"a": {"longest_skippable_span": 0}, "b": {"longest_skippable_span": 3}},
        "align": {"a": {"finetuning_seeds": {"inn_advantage": -0.1}}, "b": {"finetuning_seeds": {"inn_advantage": 0.3}}},
    }
    summary = summary_headline(per_stage, {"a": "accuracy", "b": "pearson"}, ("cls", "linear_cka"))
    # One mean per primary metric: a's accuracy (0.7) is never averaged with b's Pearson (0.5).
    assert summary["mean"] == pytest.approx({"accuracy": 0.7, "pearson": 0.5, "ft_orig_top": 0.4, "untuned_drop": 1.5,
                                             "tuned_drop": 3.5, "skip_span": 1.5, "inn_advantage": 0.1})
    assert summary["finetune_runs"] == {"total": 4, "not_converged": 1}  # a's 0.6 is 0.2 below its sibling
    assert summary_headline({"finetune": per_stage["finetune"]}, {"a": "accuracy", "b": "pearson"},
                            ("cls", "linear_cka")) == {"mean": {"accuracy": 0.7, "pearson": 0.5},
                                                       "finetune_runs": {"total": 4, "not_converged": 1}}
    assert "finetune_runs" not in summary_headline({"skip": per_stage["skip"]}, {}, ("cls", "linear_cka"))


def test_summary_counts_the_runs_that_did_not_converge():
    """A run flagged by its own check and a seed far below its siblings (0.35 against 0.80, 0.79) count;
    the mean scores still include them, and say so beside them."""
    stuck = {"pearson": 0.369, "convergence": {"converged": False, "score": 0.369, "reason": "loss at 3.1"}}
    fine = {"pearson": 0.768, "convergence": {"converged": True, "score": 0.768}}
    per_stage = {"finetune": {"sim": [stuck, fine], "neg": [{"accuracy": 0.80}, {"accuracy": 0.79},
                                                             {"accuracy": 0.35}]}}
    summary = summary_headline(per_stage, {"sim": "pearson", "neg": "accuracy"}, ("cls", "linear_cka"))
    assert summary["finetune_runs"] == {"total": 5, "not_converged": 2}
    assert summary["mean"] == pytest.approx({"pearson": (0.369 + 0.768) / 2, "accuracy": (0.80 + 0.79 + 0.35) / 3},
                                            abs=1e-6)


def test_summary_means_each_metric_over_its_own_tasks():
    # MRPC and QQP by F1, STS-B by Pearson, CoLA by MCC, the rest by accuracy (layersim.data.tasks).
    tasks = ("mrpc", "qqp", "stsb", "cola", "rte", "sst2")
    metrics = {task: get_task(task).primary_metric for task in tasks}
    assert metrics == {"mrpc": "f1", "qqp": "f1", "stsb": "pearson", "cola": "mcc", "rte": "accuracy",
                       "sst2": "accuracy"}
    values = {"mrpc": 0.9, "qqp": 0.8, "stsb": 0.6, "cola": 0.4, "rte": 0.7, "sst2": 0.9}
    per_stage = {"finetune": {task: [{metrics[task]: values[task]}] for task in tasks}}
    mean = summary_headline(per_stage, metrics, ("cls", "linear_cka"))["mean"]
    assert list(mean) == ["accuracy", "f1", "mcc", "pearson"]  # sorted: stable dvc exp show columns
    assert mean == pytest.approx({"accuracy": 0.8, "f1": 0.85, "mcc": 0.4, "pearson": 0.6})


def test_last_block_starts_come_from_the_similarity_details():
    def blocks(ft_start, layers=4):
        labels = {f"layer_{k:02d}": int(k >= ft_start) for k in range(layers)}
        return {"ft_ft": {"block_of_layer": labels, "num_blocks": 2, "last_block_start": ft_start},
                "orig_orig": {"block_of_layer": {f"layer_{k:02d}": 0 for k in range(layers)}, "num_blocks": 1,
                              "last_block_start": 0}}
    details = {"a": metrics_to_details({"cls": {"linear_cka": {"blocks": blocks(2)}, "svcca": {"blocks": blocks(1)}}}),
               "b": metrics_to_details({"cls": {"linear_cka": {"blocks": blocks(3)}}}),
               "c": metrics_to_details({"cls": {"linear_cka": {"ft_orig": {}}}})}  # no blocks found
    starts, num_layers = last_block_starts(details, ("cls", "linear_cka"))
    assert starts == {"a": {"orig_orig": 0, "ft_ft": 2}, "b": {"orig_orig": 0, "ft_ft": 3},
                      "c": {"orig_orig": None, "ft_ft": None}}
    assert num_layers == 4


def test_skip_headline_reports_the_similarity_predictions():
    prediction = {"pooling": "tokens", "angular_distance": {"within_length": 0.62, "all_spans": 0.9, "spans": 78},
                  "block_influence": {"within_length": None, "all_spans": None, "spans": 2},
                  "baselines": {"random_layer": {"within_length": 0.01, "within_length_high": 0.2}}}
    headline = skip_headline({"largest_span_within_tolerance": None, "prediction": prediction})
    assert headline == {"longest_skippable_span": 0, "skip_prediction_angular": 0.62,
                        "skip_prediction_block_influence": None, "skip_prediction_random_layer": 0.01,
                        "skip_prediction_random_layer_high": 0.2}
    # with the depth baseline and the rho beyond position (details written before them have neither)
    prediction["angular_distance"]["beyond_position"] = 0.05
    prediction["block_influence"]["beyond_position"] = None
    prediction["baselines"]["position_only"] = {"within_length": 0.6}
    prediction["baselines"]["random_layer"]["beyond_position_high"] = 0.3
    assert skip_headline({"largest_span_within_tolerance": None, "prediction": prediction}) == {
        **headline, "skip_prediction_position_only": 0.6, "skip_prediction_angular_beyond_position": 0.05,
        "skip_prediction_block_influence_beyond_position": None,
        "skip_prediction_random_layer_beyond_position_high": 0.3}
