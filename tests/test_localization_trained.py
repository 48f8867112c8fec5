"""Wu et al.'s localization score over the trained models only (issue 47, review §6): the random-init controls
stay out of every mean, as in Wu et al.'s Figures 3 and 7."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity.comparisons import RANDOM, localization, stacked_matrix
from layersim.similarity.localization import localization_scores, mean_similarity_per_layer
from layersim.similarity.results import localization_of, trained_labels


def _models(seed: int = 0) -> dict[str, list[np.ndarray]]:
    """ORIG and FT[1] share a signal that grows with depth; RANDOM's layers are a fixed random map of the input."""
    rng = np.random.default_rng(seed)
    source = rng.normal(size=(80, 6))
    trained = {label: [source @ rng.normal(size=(6, 6)) + (3 - k) * rng.normal(size=(80, 6)) for k in range(3)]
               for label in ("ORIG", "FT[1]")}
    mixing = rng.normal(size=(6, 6))
    return trained | {RANDOM: [np.tanh(source @ np.linalg.matrix_power(mixing, k + 1) / 3) for k in range(3)]}


@pytest.mark.parametrize("standardize", [False, True])
def test_a_wu_faithful_oracle_over_orig_and_ft_equals_the_score_with_a_random_block_present(standardize):
    models = _models()
    sizes = {label: len(layers) for label, layers in models.items()}
    neuron, sv = (stacked_matrix(measure, models) for measure in ("neuronsim", "svcca"))
    found = localization(neuron, sv, sizes, standardize=standardize, trained=["ORIG", "FT[1]"])
    # The oracle: the layers' means over ORIG and FT alone, straight from the layers (no stacked matrix).
    trained = [models["ORIG"], models["FT[1]"]]
    oracle = localization_scores(np.concatenate(mean_similarity_per_layer("neuronsim", trained)),
                                 np.concatenate(mean_similarity_per_layer("svcca", trained)), standardize=standardize)
    assert set(found) == {"ORIG", "FT[1]"}  # the control gets no score
    np.testing.assert_allclose(np.concatenate([found["ORIG"], found["FT[1]"]]), oracle, rtol=1e-10, atol=1e-12)
    # Averaging over RANDOM too (the old default) moves every trained layer's score.
    everything = localization(neuron, sv, sizes, standardize=standardize)
    assert not np.allclose(np.concatenate([everything["ORIG"], everything["FT[1]"]]), oracle, atol=1e-3)
    # The stages' entry point passes the same choice through.
    matrices = {"neuronsim": neuron, "svcca": sv}
    via_stage = localization_of(matrices, sizes, "zscore" if standardize else "raw", trained_labels(sizes))
    np.testing.assert_allclose(np.concatenate([via_stage["ORIG"], via_stage["FT[1]"]]), oracle, rtol=1e-10,
                               atol=1e-12)


def test_trained_labels_and_unknown_models():
    assert trained_labels({"ORIG": 3, "FT[1]": 3, "FT[2]": 3, RANDOM: 3}) == ["ORIG", "FT[1]", "FT[2]"]
    sizes = {"ORIG": 2, "FT[1]": 2}
    with pytest.raises(LayersimError, match=r"\['FT\[2\]'\] not among the stacked models"):
        localization(np.eye(4), np.eye(4), sizes, trained=["ORIG", "FT[2]"])
