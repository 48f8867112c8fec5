"""The names and ranges several sections of params.yaml share (layersim.params.schema declares the sections).

Kept apart from the declarations so that the schema reads as one dataclass per section; spelled out here,
never imported from the code that implements them, so that reading params imports no torch or measure code.
"""

from __future__ import annotations

from layersim.params.rules import POSITIVE, Bound, at_least, at_most, check_names

# First token, mean of tokens, last sub-word of the last word: one row per (example, choice); "tokens":
# one row per word, its last sub-word (Wu et al.; layersim.data.words).

POOLINGS = ("cls", "mean", "last", "tokens")
# What params may name: also "head", the token the model's own head reads (cls, or last for decoders and XLNet),
# resolved per model when params are read (layersim.params.model_kind).
POOLING_NAMES = ("head", *POOLINGS)
# What the stages read by default: the head's token (similarity, truncate, dynamics), mean (align's maps; skip without
# tokens) and words. "last" (one more table per run: 15 GB in the paper configuration) only where a measure names it.
DEFAULT_POOLINGS = ("head", "mean", "tokens")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # layersim.compute.device (checked by a test)
COMPILE_SETTINGS = ("auto", "on", "off")  # finetune.compile: layersim.compute.compiled (checked by a test)
FINETUNE_METHODS = ("full", "lora")  # layersim.training.train (lora: layersim.training.adapters)
TABLE_PRECISIONS = ("auto", "float32", "float16", "int24")  # layersim.data.io.stored.TABLE_PRECISIONS (a test checks)
HEAD_KINDS = ("own", "fresh")  # layersim.training.heads.HEAD_KINDS (checked by a test)
TRUNCATE_HEADS = ("auto", *HEAD_KINDS)  # auto: own where the family's head can be copied, else fresh
EXAMPLE_POOLINGS = ("cls", "mean", "last")  # one row per (example, choice): what align can map
EXAMPLE_POOLING_NAMES = ("head", *EXAMPLE_POOLINGS)
LOCALIZATIONS = ("raw", "zscore")  # Wu et al.'s raw difference of means, or each series z-scored first
# The default align.methods: every map of layersim.align.MAPS (checked by a test; spelled out here so
# that reading params does not import torch).
ALIGN_METHODS = ("linear", "cca", "svcca", "pwcca", "inn", "mlp")
# Which measures run on which points, by pooling. Phang et al. compare the CLS vectors of the validation
# examples with linear CKA; Wu et al.'s measures use one point per word (pooling "tokens").
DEFAULT_MEASURES = {"head": ("linear_cka",), "tokens": ("linear_cka", "svcca", "pwcca", "neuronsim")}

MIN_MAX_LENGTH = 8     # room for the special tokens of a sentence pair and some text; below it tokenizers
                       # silently stop truncating
# With fewer examples there is nothing to estimate: a metric over one example, a similarity of two
# points, a null from a handful of permutations of them.
MIN_EXAMPLES = 10
_STEPS, _EXAMPLES, _BATCH, _WIDTH = 10**8, 10**8, 2**16, 2**16
MAX_PERMUTATIONS = 10**4  # nulls show no progress: ~5 min for svcca, pwcca, neuronsim on a 60-row toy, 2 cores
ENOUGH = at_least(MIN_EXAMPLES, "fewer examples leave nothing to compare or score")
ROOM = Bound(lambda v: v >= MIN_MAX_LENGTH, f"an integer of at least {MIN_MAX_LENGTH} (the special tokens need room)")
EXAMPLES = at_most(_EXAMPLES, "examples of a task")
STEPS = at_most(_STEPS, "training steps")
BATCH = at_most(_BATCH, "examples per batch")
# Adam steps of this size only diverge (and above 3e38 the rate is not even a float32)
LEARNING_RATE = (POSITIVE, at_most(10, "a larger step only diverges"))


# The measure names of layersim.similarity's registries (checked by a test; spelled out here so that
# reading params imports no measure code: every stage validates params, and must not depend on it).
MEASURE_NAMES = ("linear_cka", "rbf_cka", "debiased_cka", "svcca", "pwcca", "mean_cca", "neuronsim", "mixedsim",
                 "procrustes", "shape_metric", "rsa", "knn_jaccard", "distance_correlation", "rsm_norm", "mutual_knn",
                 "rank_similarity", "second_order_cosine", "cknna",
                 "linear_regression", "size_and_shape", "aligned_cosine", "hard_correlation_match",
                 "soft_correlation_match", "gulp", "eigenspace_overlap", "magnitude_difference",
                 "concentricity_difference", "uniformity_difference")
HEAD_MEASURE_NAMES = ("jensen_shannon", "matrix_norm", "pearson")
# The measures without a permutation null (layersim.similarity's Measure.no_null: differences of summaries), which
# similarity.permutations cannot concern (checked by a test).
NO_NULL_MEASURE_NAMES = ("magnitude_difference", "concentricity_difference", "uniformity_difference")


def _measure_names() -> tuple[tuple[str, ...], bool]:
    return MEASURE_NAMES, False


def _grounding_measure_names() -> tuple[tuple[str, ...], bool]:
    return MEASURE_NAMES, True


def _attention_measure_names() -> tuple[tuple[str, ...], bool]:
    return HEAD_MEASURE_NAMES + MEASURE_NAMES, True


def _models(key: str, value):
    from layersim.params.names import check_models
    return check_models(key, value)


def _measures_by_pooling(key: str, value) -> dict[str, tuple[str, ...]]:
    """similarity.measures: a mapping of pooling → non-empty list of measure names."""
    from layersim.errors import LayersimError
    from layersim.params.rules import fail, shown

    if not isinstance(value, dict) or not value:
        raise fail(key, value, f"a mapping of poolings ({', '.join(POOLING_NAMES)}) to lists of measures, e.g. "
                               "{head: [linear_cka], tokens: [linear_cka, svcca]}")
    measures = {}
    for pooling, names in value.items():
        if pooling not in POOLING_NAMES:
            raise LayersimError(f"params.yaml: {key} has the pooling {shown(pooling)}, which is invalid; each key "
                                f"must be one of {', '.join(POOLING_NAMES)}.")
        measures[pooling] = check_names(f"{key}.{pooling}", names, *_measure_names())
    return measures
