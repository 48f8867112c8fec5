"""Wu et al. 2020's localization score (§5.1, Figure 3): how localised a layer's information is.

neuronsim rewards pairs of individual neurons that behave alike (localised information), svsim
(SVCCA) rewards whole layers that span alike subspaces (distributed information). Wu et al.
"compute the average similarity according to each measure when comparing each layer to all other
layers. In effect, we take the column-wise mean of each heatmap", over a heatmap of every layer of
every model in the study, "and we subtract the svsim means from the neuronsim means":

    localization(l) = mean_{m ≠ l} neuronsim(l, m) - mean_{m ≠ l} svsim(l, m)

:func:`mean_similarity_per_layer` computes the per-layer means from the models' layers;
:func:`localization_scores` takes the difference. Choices the paper leaves open, made here:

* the mean runs over every *other* layer of every model, the layer's own model included (that is
  what a column of the all-layers heatmap holds) and the layer itself excluded (its similarity is
  trivially 1); ``include_same_model=False`` averages over the other models' layers only;
* for the asymmetric neuronsim the layer is the *first* argument: its neurons are the ones matched
  (``neuronsim(l, m)`` averages over l's neurons);
* the paper subtracts raw means (the default here). The two measures have different scales, so the
  score's offset means little on its own; ``standardize=True`` z-scores each series across the
  given layers first, which keeps only the shape of the profile across layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity.registry import similarity_matrix


def mean_similarity_per_layer(
    name: str,
    models: Sequence[Sequence[np.ndarray]],
    *,
    include_same_model: bool = True,
    **options,
) -> list[np.ndarray]:
    """Per layer of each model, its mean similarity to all other layers (Wu et al. §5.1).

    Parameters
    ----------
    name : a similarity measure (:data:`layersim.similarity.MEASURES`), e.g. "neuronsim" or "svcca".
    models : one sequence of ``(num_examples x hidden)`` layer arrays per model, all on the same
        examples; widths and depths may differ.
    include_same_model : average over the other layers of the same model too (the column of Wu's
        all-layers heatmap); False: only over the layers of the other models (needs two models).
    **options : passed to the measure.

    Returns
    -------
    One float64 array per model, of length its number of layers: entry l is
    ``mean over layers m (m ≠ l) of measure(layer l, layer m)``.

    Raises
    ------
    LayersimError
        If there is nothing to average over (a single layer, or one model with
        ``include_same_model=False``), and for the measure's own errors.
    """
    models = [list(layers) for layers in models]
    sizes = [len(layers) for layers in models]
    if not models or min(sizes) == 0:
        raise LayersimError("models must be a non-empty list of non-empty lists of (num_examples x hidden) arrays.")
    if not include_same_model and len(models) < 2:
        raise LayersimError("include_same_model=False needs at least two models to compare across.")
    if include_same_model and sum(sizes) < 2:
        raise LayersimError("mean similarity to other layers needs at least two layers in all.")
    layers = [layer for model in models for layer in model]
    full = similarity_matrix(name, layers, **options)  # [l, m] = measure(layer l, layer m)
    owner = np.repeat(np.arange(len(models)), sizes)
    use = owner[:, None] != owner[None, :] if not include_same_model else ~np.eye(len(layers), dtype=bool)
    means = (full * use).sum(axis=1) / use.sum(axis=1)
    bounds = np.cumsum([0] + sizes)
    return [means[bounds[k] : bounds[k + 1]] for k in range(len(models))]


def localization_scores(
    neuronsim_per_layer: np.ndarray, svsim_per_layer: np.ndarray, *, standardize: bool = False
) -> np.ndarray:
    """Wu et al.'s localization score per layer: mean neuronsim minus mean svsim.

    Parameters
    ----------
    neuronsim_per_layer, svsim_per_layer : 1-D arrays of the same length, one value per layer (the
        outputs of :func:`mean_similarity_per_layer` for "neuronsim" and "svcca", for one model or
        concatenated over models).
    standardize : z-score each series across the given layers (mean 0, population std 1) before
        subtracting; the paper (default False) subtracts the raw means.

    Returns
    -------
    float64 array, one score per layer; higher means more localised.

    Raises
    ------
    LayersimError
        For inputs that are not 1-D of equal length, contain NaN/inf, or (standardize=True) are
        constant across layers or have fewer than 2 layers.
    """
    neuron = np.asarray(neuronsim_per_layer, dtype=np.float64)
    sv = np.asarray(svsim_per_layer, dtype=np.float64)
    if neuron.ndim != 1 or sv.ndim != 1 or neuron.shape != sv.shape or len(neuron) == 0:
        raise LayersimError(
            f"neuronsim_per_layer and svsim_per_layer must be 1-D arrays of the same non-zero length, "
            f"got shapes {neuron.shape} and {sv.shape}."
        )
    if not (np.isfinite(neuron).all() and np.isfinite(sv).all()):
        raise LayersimError("neuronsim_per_layer and svsim_per_layer must be finite.")
    if standardize:
        neuron, sv = _zscore(neuron, "neuronsim_per_layer"), _zscore(sv, "svsim_per_layer")
    return neuron - sv


def _zscore(values: np.ndarray, label: str) -> np.ndarray:
    std = values.std()
    if len(values) < 2 or not std > 1e-12 * max(1.0, float(np.abs(values).max())):
        raise LayersimError(f"{label} is constant across layers (or has one layer), so it cannot be standardised.")
    return (values - values.mean()) / std
