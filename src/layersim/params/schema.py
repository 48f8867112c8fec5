"""Every key of params.yaml, declared once: its type, default, range, allowed names and doc.

One dataclass per section; each field is a :func:`~layersim.params.rules.knob`. The numbers below are
the paper configuration of Phang et al. (2021) where it fixes them. `docs/params.md` is generated from
these declarations (`python -m layersim.params`), and a test keeps it current.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layersim.params.align import AlignParams
from layersim.params.launch import LaunchParams
from layersim.models.matrix_roles import ADAPTER_ROLES_AUTO, MATRIX_TYPES
from layersim.params.rules import (FRACTION, NON_NEGATIVE, POSITIVE, SEED, TOLERANCE, Bound, at_least, at_most,
                                   knob, nested)

# Names and ranges shared by several sections: layersim.params.vocabulary.
from layersim.params.vocabulary import (COMPILE_SETTINGS, DEFAULT_POOLINGS, POOLING_NAMES, PRECISIONS,
                                       TABLE_PRECISIONS, TRUNCATE_HEADS, FINETUNE_METHODS, LOCALIZATIONS,
                                       DEFAULT_MEASURES, _STEPS, _BATCH, MAX_PERMUTATIONS, ENOUGH, ROOM, EXAMPLES, STEPS, BATCH, LEARNING_RATE,
                                       _attention_measure_names, _grounding_measure_names, _models,
                                       _measures_by_pooling)

# A revision of a hub repository: a commit, tag or branch (refs/convert/parquet included); nothing that
# could climb out of a path or hold shell syntax.
_REVISION = r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}"


def _task_revisions(key: str, value) -> dict[str, str]:
    """download.revisions: a mapping of paper task → hub revision of its dataset."""
    import re

    from layersim.errors import LayersimError
    from layersim.params.rules import fail, shown
    from layersim.data.tasks import PAPER_TASKS

    if not isinstance(value, dict):
        raise fail(key, value, "a mapping of paper tasks to revisions of their dataset on the hub, e.g. "
                               "{rte: 0b7c9a3e…} (a commit, tag or branch); {} uses refs/convert/parquet")
    for task, revision in value.items():
        if task not in PAPER_TASKS:
            raise LayersimError(f"params.yaml: {key} has the task {shown(task)}, which has no hub dataset; each key "
                                f"must be one of {', '.join(PAPER_TASKS)}.")
        if not isinstance(revision, str) or not re.fullmatch(_REVISION, revision) or ".." in revision:
            raise fail(f"{key}.{task}", revision, "a commit, tag or branch of the dataset's repository: letters, "
                                                  "digits and . _ / - (no '..'), at most 100 characters")
    return dict(value)


@dataclass(frozen=True)
class DownloadParams:
    max_train_examples: int | None = knob(None, "training examples kept per task (null: all)", POSITIVE,
                                          EXAMPLES, ENOUGH)
    max_validation_examples: int | None = knob(None, "validation examples kept per task (null: all)", POSITIVE,
                                               EXAMPLES, ENOUGH)
    generated_train_examples: int = knob(2000, "size of the built-in synth-* tasks: training", POSITIVE,
                                         at_most(10**7, "examples of a generated task"), ENOUGH)
    generated_validation_examples: int = knob(500, "size of the built-in synth-* tasks: validation", POSITIVE,
                                              at_most(10**7, "examples of a generated task"), ENOUGH)
    generated_seed: int = knob(0, "seed of the generated tasks", SEED)
    revisions: dict[str, str] = knob({}, "paper task → revision of its dataset's Parquet export on the hub "
                                         "(commit, tag or branch; unlisted: refs/convert/parquet, the commit "
                                         "read is recorded in the task table)", check=_task_revisions)


def _adapter_roles(key: str, value) -> str | tuple[str, ...]:
    """finetune.lora.target_modules: auto, or a list of the layers' matrix roles (layersim.models.weight_matrices)."""
    from layersim.params.rules import check_names, fail

    if value == "auto":
        return value
    if not isinstance(value, list):
        raise fail(key, value, f"auto ({' and '.join(ADAPTER_ROLES_AUTO)}) or a non-empty list drawn from "
                               f"{', '.join(MATRIX_TYPES)}")
    return check_names(key, value, MATRIX_TYPES)


@dataclass(frozen=True)
class LoraParams:  # Hu et al. 2021, through peft; used when finetune.method is lora
    rank: int = knob(8, "rank r of each adapted matrix's update B·A (Hu et al.; peft's default)", POSITIVE,
                     at_most(4096, "the rank of an update no wider than the model"))
    alpha: float = knob(16.0, "scale of the update: B·A is multiplied by alpha / rank", POSITIVE,
                        at_most(10**6, "a scale of the update"))
    learning_rate: float | None = knob(None, "LoRA's own peak learning rate (null: finetune.learning_rate); "
                                             "adapters need a larger one (Hu et al.: 4e-4 to 5e-4 on RoBERTa-base)",
                                       LEARNING_RATE)
    dropout: float = knob(0.1, "dropout on the adapters' input while training",
                          Bound(lambda v: 0 <= v < 1, "a number in [0, 1)"))
    target_modules: str | tuple[str, ...] = knob("auto", f"the matrices adapted in every layer, by role ("
                                                 f"{', '.join(MATRIX_TYPES)}), named per architecture; auto: "
                                                 f"{' and '.join(ADAPTER_ROLES_AUTO)} (Hu et al. §4.2)",
                                                 check=_adapter_roles)


@dataclass(frozen=True)
class FinetuneParams:
    batch_size: int = knob(4, "examples per step (Phang et al. §2: Adam, batch 4)", POSITIVE,
                           at_most(_BATCH, "examples per step"))
    learning_rate: float = knob(1e-5, "peak learning rate (Phang: 1e-5)", LEARNING_RATE)
    warmup_steps: int = knob(1000, "linear warm-up steps, then linear decay (Phang: 1,000)", NON_NEGATIVE, STEPS)
    max_steps: int = knob(10000, "training steps (Phang: 10,000)", POSITIVE,
                          at_most(_STEPS, "training steps, 10,000 times the papers' 10,000"))
    weight_decay: float = knob(0.0, "AdamW weight decay", NON_NEGATIVE)
    max_length: int = knob(256, "tokens per (example, choice), special tokens included; longer inputs are "
                                "truncated; at most what the model's position embeddings hold", POSITIVE,
                           at_most(2**16, "tokens per input"), ROOM)
    eval_every: int = knob(1000, "steps between validation evaluations, at most max_steps (0: only at the end)",
                           NON_NEGATIVE, STEPS)
    eval_batch_size: int = knob(32, "examples per evaluation batch", POSITIVE, BATCH)
    checkpoint_every: int = knob(500, "steps between resumable training states (0, or any value >= max_steps: "
                                      "never); changing it reruns nothing", NON_NEGATIVE, STEPS)
    keep_states: int = knob(0, "intermediate weights kept per run (data/states), evenly spaced over its steps, fewer "
                               "than max_steps; the final model is the end point (0: none)", NON_NEGATIVE, STEPS)
    precision: str = knob("auto", "arithmetic of fine-tuning and of scoring task models (autocast): fp32, bf16, "
                                  "fp16 (GPU only, with loss scaling); auto: bf16 on a GPU that has it, else fp32",
                          names=PRECISIONS)
    max_grad_norm: float = knob(0.0, "clip the gradients' total norm to this before each step (0: no clipping, "
                                     "the papers' setting)", NON_NEGATIVE)
    compile: str = knob("auto", "training steps compiled (torch.compile; CUDA graphs on a GPU, batches padded to a "
                                "multiple of 64 tokens) so that small batches are not bound by kernel launches: on, "
                                "off; auto: on a GPU only (on the CPU a compile costs more than it saves)",
                        names=COMPILE_SETTINGS)
    method: str = knob("full", "full: every weight trains; lora: low-rank adapters on finetune.lora's matrices "
                               "(peft), merged into the weights when training ends, so the checkpoint is a plain "
                               "model every later stage reads unchanged", names=FINETUNE_METHODS)
    compare_methods: tuple[str, ...] = knob((), "methods fine-tuned with the same seeds beside `method`, whose runs "
                                                "similarity and weights compare with method's and ORIG (e.g. [lora])",
                                            names=lambda: (FINETUNE_METHODS, True))
    lora: LoraParams = knob(LoraParams(), "LoRA's settings (method or compare_methods lora)", check=nested(LoraParams))
    require_convergence: bool = knob(False, "a run that did not converge (final training loss near the trivial "
                                            "predictor's, validation score not significantly above the best "
                                            "constant's: layersim.training.convergence) fails its stage "
                                            "instead of a warning and a flag on every figure that uses it")


@dataclass(frozen=True)
class ExtractParams:
    poolings: tuple[str, ...] = knob(DEFAULT_POOLINGS, "which points are extracted: head (the token the model's own "
                                                       "head reads: cls, or last for decoders and XLNet), cls, mean, "
                                                       "last (one row per example and choice), tokens (one row per "
                                                       "word)", names=POOLING_NAMES)
    batch_size: int = knob(32, "examples per forward pass", POSITIVE, BATCH)
    max_examples: int | None = knob(None, "validation examples per task (null: all)", POSITIVE, EXAMPLES, ENOUGH)
    max_train_examples: int | None = knob(20000, "train examples whose activations train truncate's heads and "
                                                 "align's maps, a seeded draw (null: all; 20,000 keeps the paper "
                                                 "configuration within 150 GB: docs/paper-configuration.md)",
                                          POSITIVE, EXAMPLES, ENOUGH)
    attention_examples: int = knob(100, "validation examples whose attention maps are kept (0: none)", NON_NEGATIVE,
                                   at_most(10**5, "attention maps are stored per example, layer and head"))
    attention_unit: str = knob("words", "attention between words (Wu et al.: to a word summed over its sub-words, from "
                                        "a word averaged) or the model's tokens", names=("words", "tokens"))
    max_tokens: int = knob(20000, "tokens pooling: word rows per task (validation), the first words in order",
                           POSITIVE, at_most(10**7, "word rows per task"), ENOUGH)
    table_precision: str = knob("auto", "what the activation and attention tables store (read back as float32 "
                                        "before any arithmetic): float32; float16 (2 bytes a value) or int24 "
                                        "(3 bytes; attention maps float16), each neuron as residuals about its mean "
                                        "with a power-of-two scale; auto: word rows (tokens) int24, the other tables "
                                        "float16, as measured on every measure, head and map: "
                                        "docs/paper-configuration.md",
                                names=TABLE_PRECISIONS)


@dataclass(frozen=True)
class SimilarityParams:
    measures: dict[str, tuple[str, ...]] = knob(DEFAULT_MEASURES, "pooling → the measures run on its points",
                                                check=_measures_by_pooling)
    attention_measures: tuple[str, ...] = knob(("jensen_shannon",), "head-level measures of attention maps, or an "
                                                                    "array measure over heads",
                                               names=_attention_measure_names)
    permutations: int = knob(100, "permutation null per cell (linear CKA: exact moments instead; random rotations "
                                  "when the tables are streamed)", POSITIVE,
                             at_most(MAX_PERMUTATIONS, "permutations per cell, which resolve p = 0.0001; "
                                     "more would take hours per task"))
    significance: float = knob(0.05, "cells whose null p-value is at least this are hatched", FRACTION)
    correction: str = knob("fdr_bh", "multiple comparisons over each heatmap's cells: fdr_bh (Benjamini–Hochberg), "
                                     "holm, none", names=("fdr_bh", "holm", "none"))
    bootstrap: int = knob(200, "resamples of the examples for the diagonals' 95% intervals (0: none)",
                          NON_NEGATIVE, at_most(10**4, "resamples, which give stable 95% intervals; more would "
                                                "take hours per task"))
    chance_adjusted: bool = knob(False, "also report (value − null mean) / (1 − null mean)")
    seed: int = knob(0, "seed of the permutations and bootstrap resamples", SEED)
    random_control: int | None = knob(0, "init seed of the RANDOM control: the pretrained config with fresh weights "
                                         "(transformers' from_config), compared like every run (null: none)", SEED)
    length_classes: int = knob(1, "block nulls of several rows an example (words, choices, shared texts): each "
                                  "cluster cut to a multiple of this many rows, its first rows kept, so that "
                                  "clusters of nearly equal length can be exchanged (more rows can move; the rows "
                                  "left out leave the test's value too; in-memory tables); 1: exact lengths",
                               POSITIVE, at_most(100, "rows cut from a cluster's end"))
    random_controls: int = knob(1, "how many random-init controls, init seeds random_control, random_control + 1, "
                                   "…: the first is RANDOM in every figure; the others (validation tables only, no "
                                   "attention) give the above-random headline its spread over random draws",
                                POSITIVE, at_most(100, "controls, each a forward pass over every validation example"))
    localization: str = knob("raw", "Wu et al.'s raw difference of means, or zscore: each series z-scored first",
                             names=LOCALIZATIONS)
    rbf_sigma_scale: float = knob(1.0, "RBF CKA bandwidth: this × the median pairwise distance", POSITIVE,
                                  Bound(lambda v: 1e-3 <= v <= 1e3, "a number from 0.001 to 1000 (a kernel narrower "
                                        "or wider is the identity or a constant: every RBF value undefined)"))
    rbf_exact_max_rows: int = knob(10_000, "RBF CKA is exact (n × n kernels, 8·n² bytes per layer) up to this many "
                                   "points, Nyström-approximated above", at_least(2, "a kernel needs two points"),
                                   at_most(10**7, "points"))
    rbf_landmarks: int = knob(1500, "Nyström landmarks per layer above rbf_exact_max_rows (seeded by similarity.seed)",
                              at_least(2, "a kernel needs two points"), at_most(10**5, "landmarks"))
    svcca_variance: float = knob(0.99, "SVCCA keeps the directions explaining this share of variance", FRACTION)
    pwcca_variance: float | None = knob(0.99, "the same cut for PWCCA, Wu et al.'s pwsim (null: every direction)",
                                        FRACTION)
    shape_alpha: float = knob(1.0, "shape_metric's whitening, netrep's alpha on the data as given (not linear in how "
                                   "much; < 1 needs rows > width + 1): 1 none (= procrustes), 0 full (CCA-like)",
                              Bound(lambda v: 0 <= v <= 1, "a number in [0, 1]"))
    rsa_rdm: str = knob("correlation", "rsa's RDM (rsatoolbox calc_rdm)", names=("correlation", "euclidean"))
    rsa_compare: str = knob("spearman", "rsa's RDM comparison", names=("spearman", "pearson", "cosine"))
    knn_k: int = knob(10, "neighbours per example of knn_jaccard, mutual_knn, rank_similarity, second_order_cosine "
                          "and cknna", POSITIVE, at_most(10**4, "neighbours per example"))
    knn_metric: str = knob("cosine", "knn_jaccard's distance between examples", names=("cosine", "euclidean"))
    gulp_ridge: float = knob(0.0, "gulp's ridge λ on each layer's trace-1 covariance (Boix-Adserà et al.'s GULP; 0: "
                                  "least squares, which needs rows > width + 1)", NON_NEGATIVE,
                             at_most(1e6, "a ridge this large makes every hat matrix ∝ the layer's covariance"))

    @property
    def poolings(self) -> tuple[str, ...]:
        return tuple(self.measures)


@dataclass(frozen=True)
class CompareParams:
    models: tuple[str, ...] = knob((), "other encoders (pretrained) compared with `model` on the same inputs",
                                   check=_models)
    probe_examples: int = knob(100, "validation examples of each task that every compared model encodes", POSITIVE,
                               at_most(10**6, "examples every compared model encodes"), ENOUGH)


@dataclass(frozen=True)
class TruncateParams:
    head: str = knob("auto", "the head trained on layer k's head-token states: own (Tuned continues the fine-tuned "
                     "model's head, TunedOrig trains the head fine-tuning starts from; Phang et al.), fresh (a new "
                     "dense-tanh-linear head on standardised states) or auto (own where the family's head can be "
                     "copied: BERT, RoBERTa, ALBERT, ELECTRA; fresh otherwise)", names=TRUNCATE_HEADS)
    head_epochs: int = knob(20, "most epochs of the heads (Tuned, TunedOrig) over the cached CLS activations",
                            POSITIVE, at_most(10**4, "epochs over the cached activations"))
    head_learning_rate: float = knob(1e-3, "learning rate of the heads", LEARNING_RATE)
    head_batch_size: int = knob(64, "examples per step of the heads", POSITIVE,
                                at_most(_BATCH, "examples per step"))
    head_weight_decay: float = knob(0.0, "weight decay of the heads", NON_NEGATIVE)
    head_holdout: float = knob(0.1, "share of the train examples held out to stop the heads early (never the "
                               "validation split)", Bound(lambda v: 0 <= v < 1, "a number in [0, 1)"))
    head_patience: int = knob(3, "epochs without a better held-out score before a head stops", POSITIVE,
                              at_most(10**4, "epochs"))
    tolerance: float = knob(0.01, "\"within 1 point\" of the full model, on the metric's 0–1 scale", TOLERANCE)


@dataclass(frozen=True)
class SkipParams:
    tolerance: float = knob(0.01, "a span is cheap if skipping it costs at most this much", TOLERANCE)


WU_DEPTH = 12  # freeze.layers count layers out of Wu et al.'s 12 and are scaled to the model's depth


def _freeze_layers(key: str, value) -> tuple[int, ...]:
    """freeze.layers: distinct integers from 1 to 12 (layers out of 12, scaled to the model's depth)."""
    from layersim.params.rules import fail

    ok = (isinstance(value, list) and all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= WU_DEPTH
                                          for k in value) and len(set(value)) == len(value))
    if not ok:
        raise fail(key, value, f"a list of distinct integers from 1 to {WU_DEPTH} (layers frozen out of "
                               f"{WU_DEPTH}, scaled to the model's depth), e.g. [4, 6]; [] runs no frozen fine-tuning")
    return tuple(value)


def _freeze_seeds(key: str, value) -> tuple[int, ...] | None:
    """freeze.seeds: null (every seed of `seeds`) or a list of them (checked against `seeds` later)."""
    from layersim.params.rules import fail

    if value is None:
        return None
    if not (isinstance(value, list) and value and all(isinstance(k, int) and not isinstance(k, bool) for k in value)
            and len(set(value)) == len(value)):
        raise fail(key, value, "null (every seed of seeds) or a non-empty list of distinct seeds from seeds")
    return tuple(value)


@dataclass(frozen=True)
class FreezeParams:  # Wu et al. 2020, Table 1
    layers: tuple[int, ...] = knob((4, 6), "layers frozen at the bottom and at the top, out of 12 (Wu: 4 and 6); "
                                           "scaled to the model's depth, round(k × L / 12)", check=_freeze_layers)
    seeds: tuple[int, ...] | None = knob(None, "seeds of the frozen fine-tuning runs (null: every seed of seeds)",
                                         check=_freeze_seeds)
    recipe: str = knob("wu", "wu: Hugging Face's defaults as Wu ran them (batch 8, lr 5e-5, Adam eps 1e-8, no warm-up, "
                             "linear decay, 3 epochs = 3 × ⌈train examples / 8⌉ steps), the unfrozen runs trained in the "
                             "freeze stage too; finetune: the finetune section's recipe, the unfrozen runs the finetune "
                             "stage's (layersim.training.recipes)", names=("wu", "finetune"))
    timing_steps: int = knob(5, "training steps per timed block; unfrozen and frozen blocks alternate on the same "
                                "batches in one process", POSITIVE, at_most(10**4, "steps per timed block"))
    timing_rounds: int = knob(5, "timed rounds (one block per configuration each, after one warm-up round); the "
                                 "median ratio over rounds is reported", POSITIVE, at_most(10**4, "timed rounds"))


@dataclass(frozen=True)
class ExportParams:  # a smaller model that keeps the score (the export stage)
    selection_examples: int = knob(2000, "train examples (a seeded sample) on which the exported model's layers are "
                                   "chosen, so that the choice never sees the validation score it reports",
                                   POSITIVE, at_most(10**7, "train examples"))
    timing_examples: int = knob(64, "validation examples timed through the full and the exported model (batch 1 and "
                                "batch 32)", POSITIVE, at_most(10**5, "timed examples"))
    timing_repeats: int = knob(3, "timed passes over those examples per model and batch size (the median is "
                               "reported)", POSITIVE, at_most(1000, "timed passes"))


@dataclass(frozen=True)
class WeightsParams:  # Shuttleworth et al. 2025, "LoRA vs Full Fine-tuning: An Illusion of Equivalence"
    top_k: int = knob(10, "intruder dimensions are counted among the fine-tuned matrix's top k singular vectors "
                          "(Shuttleworth et al.: 10)", POSITIVE, at_most(4096, "singular vectors"))
    threshold: float = knob(0.5, "a top singular vector is an intruder when its largest |cosine| with every "
                                 "pretrained singular vector is below this (Shuttleworth et al.: 0.5)",
                            Bound(lambda v: 0 < v <= 1, "a number in (0, 1]"))
    null_draws: int = knob(100, "draws of the intruder count's null per adapted matrix: the update's singular values "
                                "kept, its singular vectors drawn at random (0: no null; p resolves 1 / (draws + 1))",
                           NON_NEGATIVE, at_most(100_000, "draws"))


@dataclass(frozen=True)
class GroundingParams:  # ReSi's grounding tests (Klabunde et al. 2025) on the pipeline's own runs: which measure to trust
    enabled: bool = knob(False, "run the grounding stage: rank the measures of similarity.measures, per pooling, by "
                                "layer monotonicity and by how well they tell fine-tuning seeds apart from the "
                                "pretrained model (AUPRC); false: the stage only records that it is off")
    measures: tuple[str, ...] = knob((), "more measures to rank beside similarity.measures, on each of its poolings: "
                                         "the grounding stage computes their values itself from the same tables (the "
                                         "tests need no null or interval, so a measure costs only its values)",
                                     names=_grounding_measure_names)
    bootstrap: int = knob(1000, "paired bootstrap draws (runs and layers resampled) for the intervals of each test's "
                                "score and of each measure's rank", POSITIVE, at_most(10**6, "bootstrap draws"))
    seed: int = knob(0, "seed of the bootstrap draws", SEED)

    def ranked(self, measures: tuple[str, ...]) -> tuple[str, ...]:
        """The measures ranked on a pooling whose similarity.measures are `measures`: those, then ours not among
        them."""
        return tuple(dict.fromkeys((*measures, *self.measures)))


@dataclass(frozen=True)
class Params:
    model: str
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    device: str = "auto"
    download: DownloadParams = field(default_factory=DownloadParams)
    finetune: FinetuneParams = field(default_factory=FinetuneParams)
    extract: ExtractParams = field(default_factory=ExtractParams)
    similarity: SimilarityParams = field(default_factory=SimilarityParams)
    compare: CompareParams = field(default_factory=CompareParams)
    truncate: TruncateParams = field(default_factory=TruncateParams)
    skip: SkipParams = field(default_factory=SkipParams)
    align: AlignParams = field(default_factory=AlignParams)
    freeze: FreezeParams = field(default_factory=FreezeParams)
    export: ExportParams = field(default_factory=ExportParams)
    weights: WeightsParams = field(default_factory=WeightsParams)
    grounding: GroundingParams = field(default_factory=GroundingParams)
    launch: LaunchParams = field(default_factory=LaunchParams)
    # Tasks declared on the user's files (layersim.params.user_tasks): name → its TaskSpec.
    user_tasks: dict = field(default_factory=dict)


SECTIONS = {"download": DownloadParams, "finetune": FinetuneParams, "extract": ExtractParams,
            "similarity": SimilarityParams, "compare": CompareParams, "truncate": TruncateParams,
            "skip": SkipParams, "align": AlignParams, "freeze": FreezeParams,
            "export": ExportParams, "weights": WeightsParams, "grounding": GroundingParams, "launch": LaunchParams}
TOP_LEVEL = ("model", "tasks", "seeds", "device", *SECTIONS, "user_tasks")
# The device param: auto (the first GPU if there is one, else the CPU), cpu, cuda or cuda:N.
DEVICE = r"auto|cpu|cuda(:[0-9]{1,2})?"
