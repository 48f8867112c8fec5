"""Similarity measures between layer representations: pure math on ``(num_examples x hidden)`` arrays.

The bottom layer of the library: NumPy/SciPy only, no I/O, no models. The measures of Wu et al.
2020 and relatives, by module:

* :mod:`~layersim.similarity.cka` — linear CKA (``linear_cka``, ``cka_matrix``, and
  ``LinearCKAAccumulator`` for row batches of data larger than memory);
* :mod:`~layersim.similarity.kernels` — RBF CKA and debiased linear CKA;
* :mod:`~layersim.similarity.cca` — SVCCA, PWCCA, mean R²_CCA, canonical correlations;
* :mod:`~layersim.similarity.neurons` — neuronsim and mixedsim (neuron-level);
* :mod:`~layersim.similarity.moments` — the CCA family, neuronsim and mixedsim from streamed second moments
  (``LayerMoments``, ``moments_matrix``): memory in the widths, not the number of examples;
* :mod:`~layersim.similarity.attention` — head-level and distributed attention similarities;
* :mod:`~layersim.similarity.shape` — orthogonal Procrustes and Williams et al.'s shape metrics (netrep's
  partial whitening ``alpha``), in memory and from streamed moments;
* :mod:`~layersim.similarity.rsa` — RSA: rank correlation of dissimilarity matrices (rsatoolbox's conventions);
* :mod:`~layersim.similarity.neighbours` — k-NN Jaccard neighbourhood overlap (Klabunde et al.'s survey);
* :mod:`~layersim.similarity.rsm` — distance correlation and the RSM norm difference (Frobenius), ReSi's measures
  of the layers' Euclidean distance matrices;
* :mod:`~layersim.similarity.knn_measures` — mutual k-NN, rank similarity, second-order cosine similarity and
  CKNNA on cosine neighbourhoods (ReSi; Huh et al.'s platonic-representation measures);
* :mod:`~layersim.similarity.subspaces` — ReSi's linear regression R², GULP (with a ridge) and the eigenspace
  overlap score: what one layer's span predicts of another's;
* :mod:`~layersim.similarity.aligned` — ReSi's size-and-shape Procrustes and aligned cosine similarity;
* :mod:`~layersim.similarity.matching` — hard (Li et al.) and soft (Khosla & Williams) correlation matching of neurons;
* :mod:`~layersim.similarity.summaries` — ReSi's magnitude, concentricity and uniformity differences (one summary
  per layer: no permutation null);
* :mod:`~layersim.similarity.registry` — ``MEASURES`` by name, ``similarity_matrix`` and
  ``check_computable`` (can a measure run on these sizes, before any work);
* :mod:`~layersim.similarity.localization` — Wu et al.'s localization score;
* :mod:`~layersim.similarity.inference` — how sure a value is: permutation nulls (whole examples moved where an
  example gives several rows), the rotation null from streamed moments, corrections over a family of cells,
  bootstrap intervals and fine-tuning seeds;
* :mod:`~layersim.similarity.blocks` — contiguous blocks of layers in a layer × layer matrix;
* :mod:`~layersim.similarity.pruning` — layer-pruning predictors: ShortGPT's Block Influence and Gromov et al.'s
  angular distance between layers l and l+n, the spans they predict droppable, and their rank correlation with
  measured skip scores;
* :mod:`~layersim.similarity.weight_space` — what fine-tuning did to one weight matrix: Shuttleworth et al.'s
  intruder dimensions, the top singular values before and after, the update's relative norm and numerical rank.
"""

from layersim.similarity.attention import (
    HEAD_MEASURES,
    AttentionMaps,
    attention_similarity,
    attention_similarity_matrix,
    head_similarities,
)
from layersim.similarity.cca import canonical_correlations, kept_dimensions, mean_cca_r2, pwcca, svcca
from layersim.similarity.cka import LinearCKAAccumulator, cka_matrix, is_constant, linear_cka
from layersim.similarity.kernels import debiased_cka, rbf_cka
from layersim.similarity.localization import localization_scores, mean_similarity_per_layer
from layersim.similarity.moments import MOMENT_MEASURES, LayerMoments, moments_matrix
from layersim.similarity.neurons import NeuronScores, mixedsim, mixedsim_per_neuron, neuronsim, neuronsim_per_neuron
from layersim.similarity.inference.null import (NullMatrix, NullResult, chance_adjusted, permutation_matrix, permutation_test,
                                     streamed_linear_cka_null)
from layersim.similarity.registry import (
    MEASURES,
    Measure,
    check_computable,
    get_measure,
    similarity,
    similarity_matrix,
)
from layersim.similarity.inference.rotation_null import rotation_null

__all__ = [
    "HEAD_MEASURES",
    "MEASURES",
    "MOMENT_MEASURES",
    "LayerMoments",
    "AttentionMaps",
    "LinearCKAAccumulator",
    "Measure",
    "NeuronScores",
    "NullMatrix",
    "NullResult",
    "attention_similarity",
    "attention_similarity_matrix",
    "canonical_correlations",
    "chance_adjusted",
    "check_computable",
    "cka_matrix",
    "debiased_cka",
    "get_measure",
    "head_similarities",
    "is_constant",
    "kept_dimensions",
    "linear_cka",
    "localization_scores",
    "mean_cca_r2",
    "mean_similarity_per_layer",
    "mixedsim",
    "mixedsim_per_neuron",
    "moments_matrix",
    "neuronsim",
    "neuronsim_per_neuron",
    "permutation_matrix",
    "permutation_test",
    "pwcca",
    "rbf_cka",
    "rotation_null",
    "streamed_linear_cka_null",
    "similarity",
    "similarity_matrix",
    "svcca",
]
