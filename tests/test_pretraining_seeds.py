"""Ren et al. end to end over pretraining seeds: the pair sampler, the params, mean ± sd over pairs and the
example split (unit); and (integration) two tiny "pretraining seeds" fine-tuned in one experiment, through
alignment before and after fine-tuning, attention alignment and injection with Ren's baselines."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import yaml

from layersim.align.experiments import example_split, mean_sd_over_pairs
from layersim.errors import LayersimError
from layersim.params import parse_params, pretraining_pairs

MULTIBERTS = [f"multiberts-{n}" for n in range(25)]


def _params(**align):
    from dvc_project import repository_params
    raw = repository_params()
    raw["align"].update(align)
    return parse_params(raw)


def test_pair_sampler_draws_distinct_pairs_reproducibly():
    eight = pretraining_pairs(_params(pretraining_models=MULTIBERTS, num_pairs=8, pair_seed=3))
    assert len(eight) == len(set(eight)) == 8 and set(eight) <= set(combinations(MULTIBERTS, 2))
    assert eight == pretraining_pairs(_params(pretraining_models=MULTIBERTS, num_pairs=8, pair_seed=3))
    assert eight != pretraining_pairs(_params(pretraining_models=MULTIBERTS, num_pairs=8, pair_seed=4))
    three = ["tiny-bert", "tiny-bert-seed1", "tiny-bert-seed2"]
    assert pretraining_pairs(_params(pretraining_models=three)) == (
        ("tiny-bert", "tiny-bert-seed1"), ("tiny-bert", "tiny-bert-seed2"), ("tiny-bert-seed1", "tiny-bert-seed2"))
    assert pretraining_pairs(_params()) == ()


@pytest.mark.parametrize("align,message", [
    ({"pretraining_models": ["tiny-bert"]}, "at least two distinct"),
    ({"pretraining_models": ["tiny-bert", "tiny-bert"]}, "at least two distinct"),
    ({"pretraining_models": ["tiny-bert", "no-such-model"]}, "'no-such-model', which is not a known model"),
    ({"num_pairs": 0}, "align.num_pairs = 0 is invalid"),
    ({"train_rows": 5}, "align.train_rows = 5 is invalid"),
])
def test_bad_pretraining_params_are_refused_in_one_sentence(align, message):
    with pytest.raises(LayersimError, match=message):
        _params(**align)


def test_more_pairs_than_the_models_make_is_refused_with_params_yaml():
    three = ["tiny-bert", "tiny-bert-seed1", "tiny-bert-seed2"]
    with pytest.raises(LayersimError, match=r"params.yaml: align.num_pairs = 4, but the 3 models .* make only 3 pairs"):
        _params(pretraining_models=three, num_pairs=4)  # validation, before any fine-tuning
    assert len(pretraining_pairs(_params(pretraining_models=three, num_pairs=3))) == 3


def test_mean_and_sd_over_pairs_by_hand():
    stats = mean_sd_over_pairs([{"inn": [1.0, 2.0]}, {"inn": [3.0, 6.0]}])["inn"]
    assert stats["mean"] == [2.0, 4.0] and stats["sd"] == pytest.approx([2 ** 0.5, 8 ** 0.5])
    assert stats["layer_mean"] == 3.0 and stats["layer_mean_sd"] == pytest.approx(abs(1.5 - 4.5) / 2 ** 0.5)
    one = mean_sd_over_pairs([{"linear": [0.5]}])["linear"]
    assert one["sd"] == [0.0] and one["layer_mean_sd"] == 0.0
    with pytest.raises(LayersimError, match="no pairs"):
        mean_sd_over_pairs([])


def test_example_split_keeps_each_examples_points_on_one_side():
    ids = np.repeat(np.arange(20), 7)  # 7 attention points per example
    train, test = example_split(ids, 0.2, seed=0)
    assert len(set(ids[train]) & set(ids[test])) == 0 and len(set(ids[test])) == 4
    assert sorted(np.concatenate([train, test])) == list(range(len(ids)))


# --- integration: one project build, shared with tests/test_pipeline.py (its configuration holds the models) ---

@pytest.fixture(scope="module")
def project(tmp_path_factory, built_projects) -> Path:
    from dvc_project import built_project, configure_pipeline

    dest = tmp_path_factory.mktemp("project")
    built_project(built_projects, dest, configure_pipeline, "pipeline")
    return dest


@pytest.mark.integration
def test_two_pretraining_seeds_fine_tuned_and_compared_over_pairs(project):
    from dvc_project import PIPELINE_TASK as TASK, assert_figure
    from layersim.reporting.headlines import details_to_metrics

    root = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    models = params["align"]["pretraining_models"]
    finetuned = json.loads((root / f"metrics/finetune_pretrained/{TASK}/metrics.json").read_text())
    assert list(finetuned) == models and all(0.0 <= finetuned[m]["accuracy"] <= 1.0 for m in models)
    for name in models:  # fine-tuned from its own pretraining seed, by the finetune stage's script
        info = json.loads((root / f"data/align/checkpoints/{TASK}/models/{name}/layersim_model.json").read_text())
        assert info["task"] == TASK and info["seed"] == params["seeds"][0]
    seeds = details_to_metrics(json.loads((root / f"plots/details/align/{TASK}/values.json").read_text()))["pretraining_seeds"]
    assert seeds["pairs"] == f"{models[0]}→{models[1]}" and seeds["num_pairs"] == 1
    methods = set(params["align"]["methods"])
    for state in ("pretrained", "finetuned"):  # Ren Fig. 2 / 5a and Fig. 4 / 5b
        assert set(seeds["alignment"][state]) == methods
        stats = seeds["alignment"][state]["inn"]
        assert sorted(stats["mean"]) == [f"layer_{k:02d}" for k in range(4)] and set(stats["sd"].values()) == {0.0}
        assert sorted(seeds["attention"][state]["inn"]["mean"]) == ["layer_01", "layer_02", "layer_03"]
    # Different pretraining seeds are not the same model: something to align at every layer.
    assert min(seeds["alignment"]["pretrained"]["linear"]["mean"].values()) > 0
    injection = seeds["injection"]  # Ren Table 5: per method and baseline, mean ± sd over the pairs
    assert set(injection["methods"]) == methods
    assert set(injection["references"]) == {"target itself", "source unmapped", "random embedding", "random label"}
    target = finetuned[models[1]]["accuracy"]
    assert injection["references"]["target itself"]["mean"] == pytest.approx(target, abs=1e-6)
    for name in ("pretraining_seeds.png", "pretraining_seeds_injection.png"):
        assert_figure(root / f"plots/align/{TASK}/{name}")


def test_injection_means_over_converged_pairs_leave_out_pairs_with_a_flagged_model(tmp_path, monkeypatch):
    """Review §5c: a fine-tuned pretraining model that did not converge is named in the metrics and the figure
    titles, and the injection means are given over the pairs of converged models beside the all-pairs means."""
    from layersim.experiments.pretraining_seeds import PretrainingSeeds

    pairs = [("a", "b"), ("a", "c"), ("b", "c")]
    injection = [{"methods": {"linear": v}, "references": {"target": 0.9}} for v in (0.8, 0.2, 0.6)]
    errors = {state: [{"linear": [0.1, 0.2]}] * 3 for state in ("pretrained", "finetuned")}
    seeds = PretrainingSeeds(pairs, errors, {}, injection, {"train_rows": 4, "test_rows": 4},
                             {"c": "its validation accuracy 0.500 is not above the best constant predictor's 0.500"})
    metrics = seeds.metrics()
    assert metrics["injection"]["methods"]["linear"]["mean"] == pytest.approx(1.6 / 3, abs=1e-6)
    assert metrics["injection_converged"] == {"methods": {"linear": 0.8}, "references": {"target": 0.9}}
    assert metrics["converged_pairs"] == 1 and list(metrics["not_converged"]) == ["c"]
    titles = []
    monkeypatch.setattr("layersim.experiments.pretraining_seeds.write_figure", lambda figure, path: titles.append(
        figure._suptitle.get_text() if figure._suptitle else figure.axes[0].get_title()))
    seeds.write_figures(tmp_path, "rte", "accuracy")
    assert titles and all(title.endswith("c not converged") for title in titles), titles
