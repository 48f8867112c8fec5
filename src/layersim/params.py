"""params.yaml: one dataclass per section, validated before any stage does expensive work.

Every stage loads the whole file through :func:`load_params` (in :func:`layersim.cli.run_stage`, before
it reads or writes anything), so a mistyped key anywhere is caught at the first stage that runs,
before any download or training. What is checked:

- the file: UTF-8 YAML read exactly as DVC reads it (YAML 1.2: `010` is 10, `yes` and `1:00` are strings),
  so that a stage runs with the values `dvc params diff` shows; unreadable, nested hundreds deep, or with
  integers of thousands of digits: one line, and values in messages are shortened (an alias bomb's
  expansion is never printed);
- the shape: a mapping of known sections, each a mapping (or empty: the defaults); no key given twice
  in the YAML; unknown keys, with a did-you-mean suggestion;
- types (no booleans for numbers, no strings for numbers, no nested lists) and ranges (positive sizes,
  fractions in (0, 1], tolerances in [0, 1) as metrics are on a 0–1 scale, seeds NumPy can take, an upper
  bound on every size far above any real run, at least MIN_EXAMPLES examples);
- names: model, tasks, compare.models, poolings, measures and align methods from their registries,
  none repeated;
- rules across keys: warm-up shorter than training, evaluation within it, the poolings that
  similarity and align use extracted, attention measures only with attention maps, compare.models
  not repeating `model`, finetune.max_length within the position embeddings of every offline model.

No parameter names a layer index, and none depends on a model's depth or number of heads.
Errors name the key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from layersim.errors import LayersimError
from layersim.models import MODELS, get_model
from layersim.tasks import TASKS, get_task

# First token, mean of tokens, last sub-word of the last word: one row per (example, choice); "tokens":
# one row per word, its last sub-word (Wu et al.; layersim.words).
POOLINGS = ("cls", "mean", "last", "tokens")
EXAMPLE_POOLINGS = ("cls", "mean", "last")  # one row per (example, choice): what align can map


@dataclass(frozen=True)
class DownloadParams:
    max_train_examples: int | None = None        # None keeps every training example
    max_validation_examples: int | None = None
    generated_train_examples: int = 2000          # size of the built-in synth-* tasks
    generated_validation_examples: int = 500
    generated_seed: int = 0


@dataclass(frozen=True)
class FinetuneParams:
    batch_size: int = 4                 # Phang et al. §2: Adam, batch 4, lr 1e-5,
    learning_rate: float = 1e-5         # 1,000 warm-up steps, 10,000 steps
    warmup_steps: int = 1000
    max_steps: int = 10000
    weight_decay: float = 0.0
    max_length: int = 256               # tokens per (example, choice); longer inputs are truncated. At least
                                        # MIN_MAX_LENGTH, at most what the model's position embeddings hold
    eval_every: int = 1000              # steps between validation evaluations, at most max_steps; 0 evaluates
                                        # only at the end
    eval_batch_size: int = 32
    checkpoint_every: int = 500         # steps between resumable training checkpoints; 0 never checkpoints, and
                                        # so does any value >= max_steps (a run that short needs no resume point)


@dataclass(frozen=True)
class ExtractParams:
    poolings: tuple[str, ...] = POOLINGS
    batch_size: int = 32
    max_examples: int | None = None     # validation examples per task; None takes all
    max_train_examples: int | None = 10000  # train examples whose activations train truncate's fresh heads
    attention_examples: int = 100       # validation examples whose attention maps are kept (0: none)
    max_tokens: int = 20000             # "tokens": word rows per task (validation), the first words in order


# Which measures run on which points, by pooling. Phang et al. compare the CLS vectors of the validation
# examples with linear CKA; Wu et al.'s measures use one point per word (pooling "tokens").
DEFAULT_MEASURES = {"cls": ("linear_cka",), "tokens": ("linear_cka", "svcca", "pwcca", "neuronsim")}
LOCALIZATIONS = ("raw", "zscore")  # Wu et al.'s raw difference of means, or each series z-scored first


@dataclass(frozen=True)
class SimilarityParams:
    measures: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_MEASURES))  # pooling → measures
    attention_measures: tuple[str, ...] = ("jensen_shannon",)  # head-level, or an array measure over heads
    permutations: int = 100                       # permutation null per cell (linear CKA: exact moments instead)
    significance: float = 0.05                    # cells whose null p-value is at least this are hatched
    bootstrap: int = 200                          # resamples of the examples for the diagonals' 95% intervals
    chance_adjusted: bool = False                 # also report (value − null mean) / (1 − null mean)
    seed: int = 0                                 # permutations and bootstrap resamples
    localization: str = "raw"                     # raw (Wu et al.) or zscore
    rbf_sigma_scale: float = 1.0                  # RBF CKA bandwidth: this × the median pairwise distance
    svcca_variance: float = 0.99                  # SVCCA keeps the directions explaining this much variance
    pwcca_variance: float | None = 0.99           # Wu et al.'s pwsim: the same cut for PWCCA (None: every direction)

    @property
    def poolings(self) -> tuple[str, ...]:
        return tuple(self.measures)


@dataclass(frozen=True)
class CompareParams:
    models: tuple[str, ...] = ()        # other encoders (pretrained) compared with `model` on the same inputs
    probe_examples: int = 100           # validation examples of each task that every compared model encodes


@dataclass(frozen=True)
class TruncateParams:
    head_epochs: int = 20               # fresh heads (Tuned, TunedOrig) train on cached CLS activations
    head_learning_rate: float = 1e-3
    head_batch_size: int = 64
    head_weight_decay: float = 0.0
    tolerance: float = 0.01             # 1 point of the task's primary metric (metrics are on a 0–1 scale)


@dataclass(frozen=True)
class SkipParams:
    tolerance: float = 0.01             # a span is "cheap" if skipping it costs at most this much


# The default align.methods: every map of layersim.align.MAPS (checked by a test; spelled out here so
# that reading params does not import torch).
ALIGN_METHODS = ("linear", "cca", "svcca", "pwcca", "inn", "mlp")


@dataclass(frozen=True)
class AlignParams:                      # Ren et al. 2023; see layersim.align
    pooling: str = "mean"               # Ren §3.1: mean-pooled sentence representations
    methods: tuple[str, ...] = ALIGN_METHODS
    ridge: float = 0.0                  # linear: ridge penalty (on standardised features)
    svcca_variance: float = 0.99        # svcca: share of variance the kept directions explain
    inn_depth: int = 4                  # inn: affine coupling blocks
    inn_hidden: int = 256               # inn: width of each block's scale/translation network
    mlp_depth: int = 2                  # mlp: hidden layers
    mlp_hidden: int = 512
    steps: int = 600                    # inn and mlp: Adam steps (5% warm-up, cosine decay)
    learning_rate: float = 1e-3
    batch_size: int = 256
    matrix_steps: int = 200             # INN steps per cell of the layer × layer matrix (L² fits)
    synthetic_scale: float = 0.5        # weight scale of the random INN to recover: how non-linear it is
    seed: int = 0


@dataclass(frozen=True)
class Params:
    model: str
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    download: DownloadParams = field(default_factory=DownloadParams)
    finetune: FinetuneParams = field(default_factory=FinetuneParams)
    extract: ExtractParams = field(default_factory=ExtractParams)
    similarity: SimilarityParams = field(default_factory=SimilarityParams)
    compare: CompareParams = field(default_factory=CompareParams)
    truncate: TruncateParams = field(default_factory=TruncateParams)
    skip: SkipParams = field(default_factory=SkipParams)
    align: AlignParams = field(default_factory=AlignParams)


_SECTIONS = {"download": DownloadParams, "finetune": FinetuneParams, "extract": ExtractParams,
             "similarity": SimilarityParams, "compare": CompareParams, "truncate": TruncateParams, "skip": SkipParams,
             "align": AlignParams}
_TOP_LEVEL = ("model", "tasks", "seeds", *_SECTIONS)
_POSITIVE = {"batch_size", "learning_rate", "max_steps", "max_length", "eval_batch_size",
             "generated_train_examples", "generated_validation_examples", "max_train_examples",
             "max_validation_examples", "max_examples", "max_tokens", "head_epochs",
             "head_learning_rate", "head_batch_size", "rbf_sigma_scale", "probe_examples",
             "inn_depth", "inn_hidden", "mlp_depth", "mlp_hidden", "steps", "matrix_steps",
             "synthetic_scale", "permutations"}
_UNIT_INTERVAL = {"svcca_variance", "pwcca_variance", "significance"}  # fractions in (0, 1]
_TOLERANCE = {"tolerance"}           # score differences on the metrics' 0–1 scale: [0, 1)
_SEEDS = {"generated_seed", "seed"}  # like every entry of `seeds`: 0 … MAX_SEED
_NON_NEGATIVE = {"warmup_steps", "weight_decay", "eval_every", "checkpoint_every", "head_weight_decay",
                 "attention_examples", "ridge", "bootstrap", *_SEEDS}

# Upper bounds of the size params, far above any real run: a size is allocated or looped over, and a typo
# (`max_steps: 10000000000000`) must fail at once instead of exhausting memory or running for ever.
_STEPS, _EXAMPLES, _BATCH, _WIDTH = 10**8, 10**8, 2**16, 2**16
_AT_MOST = {
    "download.max_train_examples": (_EXAMPLES, "examples of a task"),
    "download.max_validation_examples": (_EXAMPLES, "examples of a task"),
    "download.generated_train_examples": (10**7, "examples of a generated task"),
    "download.generated_validation_examples": (10**7, "examples of a generated task"),
    "finetune.batch_size": (_BATCH, "examples per step"),
    "finetune.max_steps": (_STEPS, "training steps, 10,000 times the papers' 10,000"),
    "finetune.warmup_steps": (_STEPS, "training steps"),
    "finetune.eval_every": (_STEPS, "training steps"),
    "finetune.checkpoint_every": (_STEPS, "training steps"),
    "finetune.max_length": (2**16, "tokens per input"),
    "finetune.eval_batch_size": (_BATCH, "examples per batch"),
    "extract.batch_size": (_BATCH, "examples per batch"),
    "extract.max_examples": (_EXAMPLES, "examples of a task"),
    "extract.max_train_examples": (_EXAMPLES, "examples of a task"),
    "extract.attention_examples": (10**5, "attention maps are stored per example, layer and head"),
    "extract.max_tokens": (10**7, "word rows per task"),
    "similarity.permutations": (10**5, "permutations per cell; 10,000 resolve p = 0.0001"),
    "similarity.bootstrap": (10**5, "resamples; 10,000 give stable 95% intervals"),
    "compare.probe_examples": (10**6, "examples every compared model encodes"),
    "truncate.head_epochs": (10**4, "epochs over the cached activations"),
    "truncate.head_batch_size": (_BATCH, "examples per step"),
    "align.inn_depth": (256, "coupling blocks"),
    "align.inn_hidden": (_WIDTH, "units per layer"),
    "align.mlp_depth": (256, "hidden layers"),
    "align.mlp_hidden": (_WIDTH, "units per layer"),
    "align.steps": (10**7, "optimiser steps"),
    "align.matrix_steps": (10**6, "optimiser steps per cell of the layer × layer matrix"),
    "align.batch_size": (_BATCH, "examples per step"),
}
# Lower bounds of the example counts: with fewer points there is nothing to estimate (a metric over one
# example, a similarity of two points, a null from a handful of permutations of them).
MIN_EXAMPLES = 10
_AT_LEAST = {key: (MIN_EXAMPLES, "fewer examples leave nothing to compare or score") for key in (
    "download.max_train_examples", "download.max_validation_examples", "download.generated_train_examples",
    "download.generated_validation_examples", "extract.max_examples", "extract.max_train_examples",
    "extract.max_tokens", "compare.probe_examples")}

MAX_SEED = 2**32 - 1   # NumPy's legacy seeding (np.random.seed, used by fine-tuning) takes no larger seed
MIN_MAX_LENGTH = 8     # room for the special tokens of a sentence pair and some text; below it tokenizers
                       # silently stop truncating

# Longest input (special tokens included) that the position embeddings of the registry models whose
# config is known offline can encode: the tiny configs have 130 positions, and RoBERTa's start after
# the padding index (0 with the MiniLM tokenizer the tiny models use); all-MiniLM-L6-v2 has 512.
# tests/test_params.py checks these against the real models. Hub models are not known offline.
MODEL_MAX_LENGTH = {"tiny-bert": 130, "tiny-albert": 130, "tiny-electra": 130, "tiny-roberta": 129,
                    "minilm-l6": 512}

# Width of the registry models' layers (tests/test_params.py checks the offline ones against the real
# models; the hub ones are their published configs), for checks of measures against the sizes.
MODEL_HIDDEN_SIZE = {"tiny-bert": 32, "tiny-albert": 32, "tiny-electra": 32, "tiny-roberta": 32, "minilm-l6": 384,
                     "roberta-base": 768, "electra-base": 768, "bert-base-uncased": 768, "albert-large-v2": 1024}


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _shown(value: Any) -> str:
    """repr of a params value, bounded: a YAML alias bomb (a few lines that expand to billions of items) or a
    400-digit integer must not turn into an endless error message."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 2, 12, 12, 12
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 100, 100, 40


def _fail(key: str, value: Any, allowed: str) -> LayersimError:
    return LayersimError(f"params.yaml: {key} = {_shown(value)} is invalid; it must be {allowed}.")


def _repeated(items: list) -> Any:
    """The first item of `items` (hashable) that appeared before, or None."""
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def _check_number(key: str, value: Any, kind: type, optional: bool) -> Any:
    name = key.rsplit(".", 1)[-1]
    if value is None and optional:
        return None
    what = "an integer" if kind is int else "a number"
    if optional:
        what += " or null"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise _fail(key, value, what)
    if kind is float and not is_number:
        raise _fail(key, value, what)
    if kind is float and not _finite(value):
        raise _fail(key, value, "a finite number")
    if name in _POSITIVE and value <= 0:
        raise _fail(key, value, f"a positive {'integer' if kind is int else 'number'}")
    if name in _UNIT_INTERVAL and not 0 < value <= 1:
        raise _fail(key, value, "a number in (0, 1]")
    if name in _TOLERANCE and not 0 <= value < 1:
        raise _fail(key, value, "a number in [0, 1) (a score difference on the metrics' 0–1 scale)")
    if name in _NON_NEGATIVE and value < 0:
        raise _fail(key, value, f"a non-negative {'integer' if kind is int else 'number'}")
    if name in _SEEDS and value > MAX_SEED:
        raise _fail(key, value, f"an integer from 0 to {MAX_SEED}")
    if key in _AT_MOST and value > _AT_MOST[key][0]:
        limit, why = _AT_MOST[key]
        raise _fail(key, value, f"at most {limit:,} ({why})")
    if key in _AT_LEAST and value < _AT_LEAST[key][0]:
        limit, why = _AT_LEAST[key]
        raise _fail(key, value, f"at least {limit} ({why})")
    if name == "max_length" and value < MIN_MAX_LENGTH:
        raise _fail(key, value, f"an integer of at least {MIN_MAX_LENGTH} (the special tokens need room)")
    return float(value) if kind is float else value


def _suggestion(section: str | None, key: Any) -> str:
    """' (did you mean …?)' for a mistyped key: a close match in its own section (or among the top-level
    keys), else the same key in another section; '' when nothing fits."""
    own = [f.name for f in dataclasses.fields(_SECTIONS[section])] if section else list(_TOP_LEVEL)
    close = difflib.get_close_matches(str(key), own, n=1)
    if close:
        return f" (did you mean {section + '.' if section else ''}{close[0]}?)"
    elsewhere = [f"{name}.{key}" for name, cls in _SECTIONS.items()
                 if name != section and key in {f.name for f in dataclasses.fields(cls)}]
    return f" (did you mean {' or '.join(elsewhere)}?)" if elsewhere else ""


# Keys of earlier versions of params.yaml → what replaced them.
_RENAMED = {"similarity.poolings": "the poolings are the keys of similarity.measures, e.g. "
                                   "measures: {cls: [linear_cka], tokens: [linear_cka, svcca]}"}


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:  # `finetune:` with nothing under it, like a missing section, takes every default
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(name, raw, "a mapping of keys to values")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [key for key in raw if key not in fields]
    if unknown:
        key = unknown[0]
        if f"{name}.{key}" in _RENAMED:
            raise LayersimError(f"params.yaml: {name}.{key} is no longer a key; {_RENAMED[f'{name}.{key}']}.")
        raise LayersimError(f"params.yaml: unknown key '{name}.{str(key)[:100]}'{_suggestion(name, key)}; valid keys of "
                            f"{name} are: {', '.join(fields)}.")
    values = {}
    for key, value in raw.items():
        full = f"{name}.{key}"
        annotation = str(fields[key].type)
        if key == "models":
            values[key] = _check_models(full, value)
        elif full == "similarity.measures":
            values[key] = _check_measures_by_pooling(full, value)
        elif annotation == "bool":
            if not isinstance(value, bool):
                raise _fail(full, value, "true or false")
            values[key] = value
        elif key == "localization":
            if not isinstance(value, str) or value not in LOCALIZATIONS:
                raise _fail(full, value, f"one of {', '.join(LOCALIZATIONS)}")
            values[key] = value
        elif key == "pooling":  # align.pooling: maps between per-example representations
            if not isinstance(value, str) or value not in EXAMPLE_POOLINGS:
                raise _fail(full, value, f"one of {', '.join(EXAMPLE_POOLINGS)}")
            values[key] = value
        elif key in _CHOICES:
            choices, allow_empty = _CHOICES[key]()
            values[key] = _check_choices(full, value, choices, allow_empty)
        elif annotation.startswith("float"):
            values[key] = _check_number(full, value, float, optional="None" in annotation)
        else:
            values[key] = _check_number(full, value, int, optional="None" in annotation)
    return cls(**values)


def _known_name(key: str, value: Any, kind: str, lookup, valid, hint: str = "", entry: bool = False) -> Any:
    """`lookup(value)` (a registry's get_*); an unknown name is an error that names the params key (of
    which the value is an `entry` of a list, or the whole value), the value, a close registry name if
    there is one, and every valid name."""
    try:
        return lookup(value)
    except LayersimError:
        pass
    close = difflib.get_close_matches(value, list(valid), n=1) if isinstance(value, str) else []
    mean = f" (did you mean {close[0]!r}?)" if close else ""
    what = f"{key} has {_shown(value)}, which" if entry else f"{key} = {_shown(value)}"
    raise LayersimError(f"params.yaml: {what} is not a known {kind}{mean}; valid {kind}s are: "
                        f"{', '.join(sorted(valid))}{hint}.")


def _model(key: str, name: Any, entry: bool = False):
    return _known_name(key, name, "model", get_model, MODELS, " (or a Hugging Face hub id written owner/name)", entry)


def _weights(name: str) -> str:
    """What identifies a model's weights: its hub id when it has one, so that a registry name and the hub
    id it stands for count as the same model."""
    spec = get_model(name)
    return spec.hub_id or spec.name


def _check_models(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _fail(key, value, "a list of model names (registry names or owner/name hub ids)")
    for name in value:
        _model(key, name, entry=True)
    same = _repeated([_weights(name) for name in value])
    if same is not None:
        raise _fail(key, value, f"a list without repeated models ({same!r} is given twice)")
    return tuple(value)


def _align_method_names() -> tuple[tuple[str, ...], bool]:
    return ALIGN_METHODS, False  # not layersim.align.MAPS: reading params imports no torch


def _measure_names() -> tuple[tuple[str, ...], bool]:
    from layersim.similarity import MEASURES
    return tuple(MEASURES), False


def _attention_measure_names() -> tuple[tuple[str, ...], bool]:
    from layersim.similarity import HEAD_MEASURES, MEASURES
    return tuple(HEAD_MEASURES) + tuple(MEASURES), True


# List-valued keys drawn from a fixed set of names: key → () -> (valid names, empty list allowed).
_CHOICES = {"poolings": lambda: (POOLINGS, False), "measures": _measure_names,
            "attention_measures": _attention_measure_names, "methods": _align_method_names}


def _check_choices(key: str, value: Any, choices: tuple[str, ...], allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not (value or allow_empty):
        raise _fail(key, value, f"a {'' if allow_empty else 'non-empty '}list drawn from {', '.join(choices)}")
    for item in value:
        if not isinstance(item, str) or item not in choices:
            close = difflib.get_close_matches(item, choices, n=1) if isinstance(item, str) else []
            mean = f" (did you mean {close[0]!r}?)" if close else ""
            raise LayersimError(f"params.yaml: {key} has {_shown(item)}, which is invalid{mean}; each entry must be "
                                f"one of {', '.join(choices)}.")
    same = _repeated(value)
    if same is not None:
        raise _fail(key, value, f"a list without repeated names ({same!r} is given twice)")
    return tuple(value)


def _check_measures_by_pooling(key: str, value: Any) -> dict[str, tuple[str, ...]]:
    """similarity.measures: a mapping of pooling → non-empty list of measure names."""
    if not isinstance(value, dict) or not value:
        raise _fail(key, value, f"a mapping of poolings ({', '.join(POOLINGS)}) to lists of measures, e.g. "
                                "{cls: [linear_cka], tokens: [linear_cka, svcca]}")
    measures = {}
    for pooling, names in value.items():
        if pooling not in POOLINGS:
            raise LayersimError(f"params.yaml: {key} has the pooling {_shown(pooling)}, which is invalid; each key must be "
                                f"one of {', '.join(POOLINGS)}.")
        measures[pooling] = _check_choices(f"{key}.{pooling}", names, *_measure_names())
    return measures


def parse_params(raw: Any) -> Params:
    """Validate a parsed params.yaml document and return typed params."""
    if not isinstance(raw, dict):
        empty = " (an empty document)" if raw is None else ""
        raise LayersimError(f"params.yaml must be a mapping of sections, got {type(raw).__name__}{empty}.")
    unknown = [key for key in raw if key not in _TOP_LEVEL]
    if unknown:
        raise LayersimError(f"params.yaml: unknown key {_shown(unknown[0])}{_suggestion(None, unknown[0])}; valid "
                            f"top-level keys are: {', '.join(sorted(_TOP_LEVEL))}.")
    for key in ("model", "tasks", "seeds"):
        if key not in raw:
            raise LayersimError(f"params.yaml: the key {key!r} is missing.")
    model = raw["model"]
    if not isinstance(model, str):
        raise _fail("model", model, "a single model name (a scalar, not a list)")
    _model("model", model)
    tasks, seeds = raw["tasks"], raw["seeds"]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(task, str) for task in tasks):
        raise _fail("tasks", tasks, "a non-empty list of task names")
    for task in tasks:
        _known_name("tasks", task, "task", get_task, TASKS, entry=True)
    same = _repeated(tasks)
    if same is not None:
        raise _fail("tasks", tasks, f"a list without repeated names ({same!r} is given twice)")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                           for s in seeds):
        raise _fail("seeds", seeds, "a non-empty list of non-negative integers")
    if max(seeds) > MAX_SEED:
        raise _fail("seeds", seeds, f"a list of integers from 0 to {MAX_SEED}")
    same = _repeated(seeds)
    if same is not None:
        raise _fail("seeds", seeds, f"a list without repeated seeds ({same} is given twice)")
    sections = {name: _build_section(name, cls, raw.get(name)) for name, cls in _SECTIONS.items()}
    _check_across_sections(model, {**sections, "tasks": tasks})
    return Params(model=model, tasks=tuple(tasks), seeds=tuple(seeds), **sections)


def _check_across_sections(model: str, sections: dict[str, Any]) -> None:
    """Rules that tie keys of different sections (or the model) together."""
    finetune, extract, similarity = sections["finetune"], sections["extract"], sections["similarity"]
    compare, align = sections["compare"], sections["align"]
    if finetune.warmup_steps >= finetune.max_steps:
        raise LayersimError(f"params.yaml: finetune.warmup_steps = {finetune.warmup_steps} must be smaller than "
                            f"finetune.max_steps = {finetune.max_steps}.")
    if finetune.eval_every > finetune.max_steps:
        raise LayersimError(f"params.yaml: finetune.eval_every = {finetune.eval_every} is larger than "
                            f"finetune.max_steps = {finetune.max_steps}; it must be at most max_steps, or 0 to "
                            "evaluate only at the end.")
    # finetune.checkpoint_every >= max_steps is allowed: like 0, it saves no intermediate state.
    for name, where in [(model, "model"), *((other, "of compare.models") for other in compare.models)]:
        limit = MODEL_MAX_LENGTH.get(name)
        if limit is not None and finetune.max_length > limit:
            described = f"model {name!r}" if where == "model" else f"{name!r} {where}"
            raise LayersimError(f"params.yaml: finetune.max_length = {finetune.max_length} is too long for "
                                f"{described}; it must be at most {limit}, the tokens its position embeddings hold.")
    missing = [q for q in similarity.poolings if q not in extract.poolings]
    if missing:
        raise LayersimError(f"params.yaml: similarity.measures has the pooling {missing[0]!r}, which is not among "
                            f"extract.poolings = {list(extract.poolings)}; extract it or pick one of those.")
    if similarity.attention_measures and not extract.attention_examples:
        raise LayersimError(f"params.yaml: similarity.attention_measures = {list(similarity.attention_measures)} needs "
                            "attention maps, but extract.attention_examples = 0; set it above 0 or use [].")
    if align.pooling not in extract.poolings:
        raise LayersimError(f"params.yaml: align.pooling = {align.pooling!r} is not among "
                            f"extract.poolings = {list(extract.poolings)}; extract it or pick one of those.")
    if _weights(model) in {_weights(name) for name in compare.models}:
        raise LayersimError(f"params.yaml: compare.models = {list(compare.models)} repeats model = {model!r}; "
                            "list only the other encoders to compare with it.")
    if "cls" not in extract.poolings:
        raise LayersimError(f"params.yaml: extract.poolings = {list(extract.poolings)} must include 'cls'; "
                            "the truncate stage trains its fresh heads on CLS activations.")
    _check_measure_sizes(model, sections)


def _check_measure_sizes(model: str, sections: dict[str, Any]) -> None:
    """Refuse a measure that cannot run on the sizes the similarity stage will see, where params fix them:
    the model's width, and at most this many rows per task for the per-example poolings (the built-in
    tasks' size, or extract.max_examples), times the choices of a multiple-choice task."""
    from layersim.similarity import check_computable

    width = MODEL_HIDDEN_SIZE.get(model)
    download, extract, similarity = sections["download"], sections["extract"], sections["similarity"]
    if width is None:
        return
    for task in sections["tasks"]:
        spec = get_task(task)
        known = [size for size in (extract.max_examples,
                                   download.generated_validation_examples if spec.hub is None else None)
                 if size is not None]
        if not known:
            continue
        rows = min(known) * max(1, spec.num_choices)
        for pooling, measures in similarity.measures.items():
            for measure in measures if pooling != "tokens" else ():
                try:
                    check_computable(measure, rows, width)
                except LayersimError as err:
                    raise LayersimError(f"params.yaml: similarity.measures.{pooling} has {measure!r}, which cannot run "
                                        f"on task {task!r} with model {model!r}: {err}") from None


# params.yaml is read exactly as DVC reads it (ruamel.yaml's safe loader, YAML 1.2): `010` is 10, `1:00`,
# `yes` and `on` are strings. PyYAML follows YAML 1.1 (`010` = 8, `1:00` = 60, `yes` = true), so a run
# would train for another number of steps than `dvc params diff` shows.
def _yaml():
    from ruamel.yaml import YAML

    return YAML(typ="safe")


def _repeated_key(node: Any, path: tuple[str, ...] = (), seen: set[int] | None = None) -> str | None:
    """Describe the first key that a mapping of the YAML node tree gives twice, with its path and both
    lines, or None."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, MappingNode):
        first: dict[str, tuple[Node, Node]] = {}

        def at(key_node: Node, value_node: Node) -> str:
            shown = f" = {value_node.value}" if isinstance(value_node, ScalarNode) else ""
            return f"line {key_node.start_mark.line + 1}{shown}"

        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, ScalarNode) else None
            if key is not None and key != "<<":
                if key in first:
                    return (f"{'.'.join((*path, key))} is given twice ({at(*first[key])}, "
                            f"{at(key_node, value_node)}); each key may appear only once")
                first[key] = (key_node, value_node)
            found = _repeated_key(value_node, (*path, key or "?"), seen)
            if found:
                return found
    elif isinstance(node, SequenceNode):
        for item in node.value:
            found = _repeated_key(item, path, seen)
            if found:
                return found
    return None


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError as err:
        raise LayersimError(f"{path} does not exist; run stages from the repository root.") from err
    except IsADirectoryError as err:
        raise LayersimError(f"{path} is a folder, not a file; the params must be one YAML file.") from err
    except OSError as err:
        raise LayersimError(f"{path} cannot be read ({err.strerror or err}); check its permissions.") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise LayersimError(f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); "
                            "save it as UTF-8.") from err


def _parse_yaml(path: Path, text: str) -> Any:
    """The document as DVC parses it, with repeated keys refused (DVC's parser refuses them too, in a
    message without the key's path)."""
    from ruamel.yaml import YAMLError

    try:
        repeated = _repeated_key(_yaml().compose(text))
        if repeated:
            raise LayersimError(f"{path}: {repeated}.")
        return _yaml().load(text)
    except YAMLError as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = problem or str(err).splitlines()[0]
        raise LayersimError(f"{path} is not valid YAML ({detail}{where}).") from err
    except RecursionError as err:
        raise LayersimError(f"{path} nests too deeply to read (hundreds of levels); params.yaml needs at most "
                            "three (section, key, list).") from err
    except ValueError as err:  # an integer of more than 4,300 digits: Python's int conversion limit
        detail = "an integer with thousands of digits" if "digits" in str(err) else str(err).splitlines()[0]
        raise LayersimError(f"{path} has a value that cannot be read ({detail}); no params value needs more "
                            "than a few digits.") from err


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml."""
    path = Path(path)
    raw = _parse_yaml(path, _read_text(path))
    try:
        return parse_params(raw)
    except LayersimError as err:
        # parse_params knows no file name; name the file actually read (`--params other.yaml`).
        message = str(err)
        if path.name != "params.yaml" and message.startswith("params.yaml"):
            raise LayersimError(f"{path}{message[len('params.yaml'):]}") from None
        raise
    except RecursionError as err:
        raise LayersimError(f"{path} nests too deeply to check (hundreds of levels); params.yaml needs at most "
                            "three (section, key, list).") from err
