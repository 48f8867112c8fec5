"""params.yaml: one dataclass per section, validated before any stage does expensive work.

Every stage loads the whole file through :func:`load_params`, so a mistyped key anywhere is caught
at the first stage that runs, before any download or training. Errors name the key, the bad value
and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from layersim.errors import LayersimError
from layersim.models import get_model
from layersim.tasks import get_task

POOLINGS = ("cls", "mean", "last")  # first token, mean of tokens, last sub-word (Wu et al.)


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
    max_length: int = 256               # tokens per (example, choice); longer inputs are truncated
    eval_every: int = 1000              # steps between validation evaluations; 0 evaluates only at the end
    eval_batch_size: int = 32
    checkpoint_every: int = 500         # steps between resumable training checkpoints; 0 never checkpoints


@dataclass(frozen=True)
class ExtractParams:
    poolings: tuple[str, ...] = POOLINGS
    batch_size: int = 32
    max_examples: int | None = None     # validation examples per task; None takes all
    max_train_examples: int | None = 10000  # train examples whose activations train truncate's fresh heads
    attention_examples: int = 100       # validation examples whose attention maps are kept (0: none)


DEFAULT_MEASURES = ("linear_cka", "svcca", "pwcca", "neuronsim")


@dataclass(frozen=True)
class SimilarityParams:
    poolings: tuple[str, ...] = ("cls",)          # Phang et al. compare CLS; Wu et al. the last sub-word
    measures: tuple[str, ...] = DEFAULT_MEASURES  # layersim.similarity.MEASURES
    attention_measures: tuple[str, ...] = ("jensen_shannon",)  # head-level, or an array measure over heads
    rbf_sigma_scale: float = 1.0                  # RBF CKA bandwidth: this × the median pairwise distance
    svcca_variance: float = 0.99                  # SVCCA keeps the directions explaining this much variance


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
_POSITIVE = {"batch_size", "learning_rate", "max_steps", "max_length", "eval_batch_size",
             "generated_train_examples", "generated_validation_examples", "max_train_examples",
             "max_validation_examples", "max_examples", "max_train_examples", "head_epochs",
             "head_learning_rate", "head_batch_size", "rbf_sigma_scale", "probe_examples",
             "inn_depth", "inn_hidden", "mlp_depth", "mlp_hidden", "steps", "matrix_steps",
             "synthetic_scale"}
_UNIT_INTERVAL = {"svcca_variance"}  # fractions in (0, 1]
_NON_NEGATIVE = {"warmup_steps", "weight_decay", "eval_every", "checkpoint_every", "generated_seed", "head_weight_decay", "tolerance",
                 "attention_examples", "ridge", "seed"}


def _fail(key: str, value: Any, allowed: str) -> LayersimError:
    return LayersimError(f"params.yaml: {key} = {value!r} is invalid; it must be {allowed}.")


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
    if not math.isfinite(value):
        raise _fail(key, value, f"a finite {'integer' if kind is int else 'number'}")
    if name in _POSITIVE and value <= 0:
        raise _fail(key, value, f"a positive {'integer' if kind is int else 'number'}")
    if name in _UNIT_INTERVAL and not 0 < value <= 1:
        raise _fail(key, value, "a number in (0, 1]")
    if name in _NON_NEGATIVE and value < 0:
        raise _fail(key, value, f"a non-negative {'integer' if kind is int else 'number'}")
    return float(value) if kind is float else value


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(name, raw, "a mapping of keys to values")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise LayersimError(f"params.yaml: unknown key {name}.{unknown[0]}; valid keys of {name} are: "
                            f"{', '.join(fields)}.")
    values = {}
    for key, value in raw.items():
        full = f"{name}.{key}"
        annotation = str(fields[key].type)
        if key == "models":
            values[key] = _check_models(full, value)
        elif key == "pooling":
            if value not in POOLINGS:
                raise _fail(full, value, f"one of {', '.join(POOLINGS)}")
            values[key] = value
        elif key in _CHOICES:
            choices, allow_empty = _CHOICES[key]()
            values[key] = _check_choices(full, value, choices, allow_empty)
        elif annotation.startswith("float"):
            values[key] = _check_number(full, value, float, optional=False)
        else:
            values[key] = _check_number(full, value, int, optional="None" in annotation)
    return cls(**values)


def _check_models(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _fail(key, value, "a list of model names (registry names or owner/name hub ids)")
    if len(set(value)) != len(value):
        raise _fail(key, value, "a list without repeated names")
    for name in value:
        get_model(name)
    return tuple(value)


def _align_method_names() -> tuple[tuple[str, ...], bool]:
    from layersim.align import MAPS
    return tuple(MAPS), False


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
        if item not in choices:
            raise _fail(key, item, f"one of {', '.join(choices)}")
    return tuple(dict.fromkeys(value))


def parse_params(raw: Any) -> Params:
    """Validate a parsed params.yaml document and return typed params."""
    if not isinstance(raw, dict):
        raise LayersimError(f"params.yaml must be a mapping of sections, got {type(raw).__name__}.")
    known = {"model", "tasks", "seeds", *_SECTIONS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LayersimError(f"params.yaml: unknown key {unknown[0]!r}; valid top-level keys are: "
                            f"{', '.join(sorted(known))}.")
    for key in ("model", "tasks", "seeds"):
        if key not in raw:
            raise LayersimError(f"params.yaml: the key {key!r} is missing.")
    model = raw["model"]
    if not isinstance(model, str):
        raise _fail("model", model, "a single model name (a scalar, not a list)")
    get_model(model)
    tasks, seeds = raw["tasks"], raw["seeds"]
    if not isinstance(tasks, list) or not tasks:
        raise _fail("tasks", tasks, "a non-empty list of task names")
    for task in tasks:
        get_task(task)
    if len(set(tasks)) != len(tasks):
        raise _fail("tasks", tasks, "a list without repeated names")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                           for s in seeds):
        raise _fail("seeds", seeds, "a non-empty list of non-negative integers")
    if len(set(seeds)) != len(seeds):
        raise _fail("seeds", seeds, "a list without repeated seeds")
    sections = {name: _build_section(name, cls, raw.get(name)) for name, cls in _SECTIONS.items()}
    finetune = sections["finetune"]
    if finetune.warmup_steps >= finetune.max_steps:
        raise LayersimError(f"params.yaml: finetune.warmup_steps = {finetune.warmup_steps} must be smaller than "
                            f"finetune.max_steps = {finetune.max_steps}.")
    similarity, extract = sections["similarity"], sections["extract"]
    missing = [q for q in similarity.poolings if q not in extract.poolings]
    if missing:
        raise LayersimError(f"params.yaml: similarity.poolings has {missing[0]!r}, which is not among "
                            f"extract.poolings = {list(extract.poolings)}; extract it or pick one of those.")
    if similarity.attention_measures and not extract.attention_examples:
        raise LayersimError(f"params.yaml: similarity.attention_measures = {list(similarity.attention_measures)} needs "
                            "attention maps, but extract.attention_examples = 0; set it above 0 or use [].")
    if sections["align"].pooling not in extract.poolings:
        raise LayersimError(f"params.yaml: align.pooling = {sections['align'].pooling!r} is not among "
                            f"extract.poolings = {list(extract.poolings)}; extract it or pick one of those.")
    if model in sections["compare"].models:
        raise LayersimError(f"params.yaml: compare.models = {list(sections['compare'].models)} repeats model = {model!r}; "
                            "list only the other encoders to compare with it.")
    if "cls" not in sections["extract"].poolings:
        raise LayersimError(f"params.yaml: extract.poolings = {list(sections['extract'].poolings)} must include 'cls'; "
                            "the truncate stage trains its fresh heads on CLS activations.")
    return Params(model=model, tasks=tuple(tasks), seeds=tuple(seeds), **sections)


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where `2e-05` (no dot) is a string; DVC writes floats that way
    (`dvc exp run -S finetune.learning_rate=2e-5`), so floats are resolved as YAML 1.2 does."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_Yaml12Loader)
    except FileNotFoundError as err:
        raise LayersimError(f"{path} does not exist; run stages from the repository root.") from err
    except yaml.YAMLError as err:
        raise LayersimError(f"{path} is not valid YAML ({str(err).splitlines()[0]}).") from err
    return parse_params(raw)
