"""``layersim.compare_models``: every layer of one model against every layer of another on the same inputs, in one
call, with the numbers the similarity stage gives — each measure's layer × layer matrix, every cell's permutation
null (corrected over the matrix) and bootstrap intervals of the diagonal or of chosen cells.

Nothing here computes a similarity or pools a hidden state: texts are encoded and pooled by the extract stage's
functions (:func:`layersim.experiments.extract.pooled_layers`: the stage's ``cls``, ``mean``, ``last`` and
``tokens``, on the GPU when there is one), the numbers come from :mod:`layersim.similarity` (``stacked_matrix``,
``stacked_null``, ``bootstrap_pairs``, the stage's defaults and corrections from ``layersim.similarity.results``),
so a comparison equals the extract + similarity stages' on the same inputs. Other modules (any ``nn.Module``)
are read by forward hooks on named modules (:mod:`layersim.models.any_model`) over texts or a DataLoader."""

from __future__ import annotations

import dataclasses
import textwrap
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from layersim.compute.device import analysis_on, resolve_device, to_device
from layersim.data.batching import encode_task, sequential_batches
from layersim.data.tasks import TaskSpec
from layersim.data.words import align_rows
from layersim.errors import LayersimError, unknown_name
from layersim.experiments.compare_inputs import (cell_indices, check_arguments, check_batch, check_inputs,
                                                 constant_layers, few_rows_note, max_length_for)
from layersim.experiments.extract import (check_poolings, last_content_position, pool, pool_layers, pooled_layers,
                                          reads_last_token)
from layersim.models.any_model import (captured_outputs, load_any_tokenizer, load_model, model_label, module_names,
                                       named_modules)
from layersim.params import POOLINGS
from layersim.params.rules import check_value
from layersim.params.schema import ExtractParams, FinetuneParams, SimilarityParams
from layersim.similarity.inference.bootstrap import bootstrap_pairs
from layersim.similarity.comparisons import block_slices, stacked_matrix, stacked_null
from layersim.similarity.inference.exchangeability import unmovable
from layersim.similarity.registry import MEASURES, check_computable
from layersim.similarity.results import null_unavailable, reach_warning, settings
from layersim.training.states import refuse_kept_state

_LABEL_KEYS = ("labels", "label")  # batch entries that are targets, not model inputs
_SETTINGS = {f.name: f for f in dataclasses.fields(SimilarityParams)
             if f.name not in ("measures", "attention_measures", "random_control", "localization")}


@dataclass
class MeasureComparison:
    """One measure between the layers of model a (rows) and model b (columns)."""

    measure: str
    matrix: np.ndarray                      # [layer of a, layer of b]; NaN where a layer is constant
    null_mean: np.ndarray | None = None     # the permutation null's mean per cell (rows of b's layer shuffled)
    p_value: np.ndarray | None = None       # one-sided, P(null ≥ observed)
    p_adjusted: np.ndarray | None = None    # corrected over the matrix's cells (similarity.correction)
    at_chance: np.ndarray | None = None     # cells whose corrected p-value is ≥ the significance level
    cells: tuple[tuple[int, int], ...] = ()  # the cells with a bootstrap interval
    interval: tuple[np.ndarray, np.ndarray] | None = None  # (low, high), one per cell of `cells`
    interval_method: str | None = None
    unavailable: str | None = None          # why there is no null and no interval
    stacked: np.ndarray | None = None       # a's layers then b's against both, as the stages compute it


@dataclass
class ModelComparison:
    """What :func:`compare_models` returns: per measure a :class:`MeasureComparison`, and what was compared."""

    labels: tuple[str, str]
    layer_names: tuple[list[str], list[str]]
    pooling: str
    num_rows: int
    measures: dict[str, MeasureComparison]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, measure: str) -> MeasureComparison:
        if measure not in self.measures:
            raise unknown_name("compared measure", measure, self.measures)
        return self.measures[measure]

    def to_frame(self):
        """One pandas row per (measure, layer of a, layer of b): similarity, null mean, p-values, interval."""
        import pandas as pd

        rows = []
        for m in self.measures.values():
            bounds = {} if m.interval is None else {cell: (lo, hi) for cell, lo, hi in zip(m.cells, *m.interval)}
            for i, j in np.ndindex(m.matrix.shape):
                extra = {name: getattr(m, name)[i, j] for name in ("null_mean", "p_value", "p_adjusted", "at_chance")
                         if getattr(m, name) is not None}
                low, high = bounds.get((i, j), (np.nan, np.nan))
                rows.append({"measure": m.measure, "layer_a": i, "layer_b": j, "name_a": self.layer_names[0][i],
                             "name_b": self.layer_names[1][j], "similarity": m.matrix[i, j], **extra,
                             "ci_low": low, "ci_high": high})
        return pd.DataFrame(rows)

    def plot(self, measure: str):
        """A heatmap of one measure (a's layers on y, b's on x), as the stages draw theirs."""
        from layersim.reporting.plots import heatmap_grid

        m, label = self[measure], MEASURES[measure].label
        low, high = MEASURES[measure].bounded or (np.nanmin(self[measure].matrix), np.nanmax(self[measure].matrix))
        # Wrapped to the one column's 4.2 inches (about 7 points a character): a long title was cut at both edges.
        title = textwrap.fill(f"{label}, {self.pooling.upper()} — {self.labels[0]} vs {self.labels[1]}", 43)
        fig = heatmap_grid({label: (m.matrix, f"{self.labels[0]} layer", f"{self.labels[1]} layer")}, title, ncols=1,
                           vmin=low, vmax=high, colorbar_label=label)
        fig.axes[0].set_yticklabels(self.layer_names[0], fontsize=7)
        fig.axes[0].set_xticklabels(self.layer_names[1], fontsize=7)
        return fig


@dataclass
class _Side:
    """One compared model: its module, tokenizer (None for batches), and the hooked module names (None: the
    transformers hidden states, embeddings first, as the extract stage reads them)."""

    label: str
    model: nn.Module
    tokenizer: object | None
    hooked: list[str] | None

    @property
    def layer_names(self) -> list[str]:
        return self.hooked or ["emb"] + [str(k) for k in range(1, self.model.config.num_hidden_layers + 1)]


def compare_models(model_a, model_b, inputs, measures: Sequence[str] = ("linear_cka",), pooling: str = "cls", *,
                   layers_a: Sequence[str] | None = None, layers_b: Sequence[str] | None = None,
                   tokenizer_a=None, tokenizer_b=None, permutations: int | None = 100, bootstrap: int = 200,
                   seed: int = 0, cells="diagonal", labels: tuple[str, str] | None = None, device: str = "auto",
                   batch_size: int | None = None, max_length: int | None = None, max_tokens: int | None = None,
                   **similarity) -> ModelComparison:
    """Every layer of `model_a` against every layer of `model_b` on `inputs`, by each of `measures`.

    Models: a registry name ("minilm-l6", "tiny-bert", "roberta-base"), a Hugging Face hub id, a model folder, or
    an ``nn.Module`` (with `tokenizer_a`/`tokenizer_b`, a tokenizer or a folder, for texts). A transformers model's
    layers are its hidden states (embeddings first); `layers_a`/`layers_b` name modules to hook instead
    (``model.named_modules()`` names; needed for any other module). A hooked output of (rows, length, features) is
    pooled over its tokens, a wider one flattened per row.
    Inputs: texts (strings, or (text_a, text_b) pairs), encoded by each model's tokenizer as the extract stage does;
    or batches (a DataLoader): each a dict of tensors (the model's keyword inputs, "labels" dropped), a tensor, or a
    tuple whose first element is the input; each batch runs through both models, so a shuffling loader is fine.
    `pooling`: cls, mean, last or tokens (texts through transformers models only), as the extract stage pools.
    `permutations`: per cell of the null (linear CKA: exact moments; None: no null); `bootstrap`: resamples of the
    examples (the words of one text together) for the intervals of `cells` ("diagonal" when the depths match, or
    a list of (layer of a, layer of b)); 0: none. `similarity`: other similarity.* settings of params.yaml
    (correction, significance, rbf_sigma_scale, svcca_variance, shape_alpha, knn_k, …), with their defaults.
    """
    check_arguments(measures, batch_size, max_length, max_tokens, layers_a, layers_b, labels, device)
    measures, chosen = _checked(measures, pooling, cells, permutations, bootstrap, seed, similarity)
    options, uncertainty = settings(SimilarityParams(**chosen))
    where = resolve_device(device)
    check_inputs(inputs)
    texts = _texts(inputs)
    if pooling == "tokens" and texts is None:
        raise LayersimError("pooling 'tokens' needs texts (it finds each word's last sub-word); with batches use cls, "
                            "mean or last.")
    sides = [_side(model, tokenizer, layers, name) for model, tokenizer, layers, name in
             ((model_a, tokenizer_a, layers_a, "model_a"), (model_b, tokenizer_b, layers_b, "model_b"))]
    _label(sides, labels)
    for side, name in zip(sides, ("model_a", "model_b")):
        _check_side(side, name, pooling, texts is not None)
    chosen_cells = _cells(cells, sides)
    extract = ExtractParams()
    batch_size = batch_size or extract.batch_size
    if texts is not None:
        lengths = [max_length_for(side.model, max_length, FinetuneParams().max_length, name)
                   for side, name in zip(sides, ("model_a", "model_b"))]
        extracted = [_encode_texts(side, texts, pooling, batch_size, length, max_tokens, where)
                     for side, length in zip(sides, lengths)]
    else:
        extracted = [(layers, None) for layers in _from_batches(sides, inputs, pooling, where)]
    groups = None
    if pooling == "tokens":  # word rows lined up on their keys: the words both tokenizers' truncation kept
        keys, aligned = align_rows({side.label: (keys, layers) for side, (layers, keys) in zip(sides, extracted)})
        models, groups = aligned, keys[:, 0]
    else:
        models = {side.label: layers for side, (layers, _) in zip(sides, extracted)}
    with analysis_on(where):  # the nulls on the device the models ran on
        return _compare(models, sides, measures, pooling, options, uncertainty, permutations is not None,
                        chosen_cells, groups)


def _checked(measures, pooling, cells, permutations, bootstrap, seed, similarity) -> tuple[list[str], dict]:
    """The measures as a list and the similarity settings, or a one-sentence error, before any model is loaded."""
    measures = [measures] if isinstance(measures, str) else list(measures)
    if not measures:
        raise LayersimError(f"compare_models needs at least one measure; valid measures are: {', '.join(MEASURES)}.")
    for measure in measures:
        if measure not in MEASURES:
            raise unknown_name("similarity measure", measure, MEASURES)
    if pooling not in POOLINGS:
        raise unknown_name("pooling", pooling, POOLINGS)
    if cells != "diagonal" and (isinstance(cells, str) or not all(
            isinstance(c, (tuple, list)) and len(c) == 2 for c in cells)):
        raise LayersimError(f"cells {cells!r} must be 'diagonal' or a list of (layer of model_a, layer of model_b), "
                            "each an index or a layer name.")
    chosen = dict(similarity, bootstrap=bootstrap, seed=seed) | ({} if permutations is None else
                                                                 {"permutations": permutations})
    for key, value in chosen.items():
        if key not in _SETTINGS:
            raise unknown_name("compare_models setting", key, _SETTINGS)
        try:
            chosen[key] = check_value(key, _SETTINGS[key], value)
        except LayersimError as err:  # the schema's sentence, named for this call rather than params.yaml
            raise LayersimError(str(err).replace("params.yaml: ", "compare_models: ", 1)) from None
    return measures, chosen


def _texts(inputs) -> tuple[str, list] | None:
    """(format, texts) when `inputs` are texts or text pairs; None for batches."""
    if isinstance(inputs, str):
        raise LayersimError("inputs is a single string; pass a list of texts (or of (text_a, text_b) pairs).")
    if not isinstance(inputs, Sequence) or not len(inputs) or not isinstance(inputs[0], (str, tuple, list)) or (
            not isinstance(inputs[0], str) and not all(isinstance(t, str) for t in inputs[0])):
        return None
    pairs = [isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(s, str) for s in t) for t in inputs]
    if all(isinstance(t, str) for t in inputs):
        return "single", list(inputs)
    if all(pairs):
        return "pair", [tuple(t) for t in inputs]
    bad = next((t for t, ok in zip(inputs, pairs) if not ok and not isinstance(t, str)), inputs[0])
    raise LayersimError(f"inputs mix texts and pairs or hold {bad!r}; pass all texts, or all (text_a, text_b) pairs.")


def _side(model, tokenizer, layers, name: str) -> _Side:
    if isinstance(model, nn.Module):
        module, found = model, None
    elif isinstance(model, (str, Path)):
        refuse_kept_state(model, name)
        module, found = load_model(model, tokenizer=tokenizer is None)
    else:
        raise LayersimError(f"{name} is a {type(model).__name__}; pass a model name (registry or Hugging Face hub), "
                            "a model folder, or an nn.Module.")
    if tokenizer is not None:
        found = load_any_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    label = type(module).__name__ if isinstance(model, nn.Module) else model_label(str(model))
    return _Side(label, module, found, None if layers is None else list(layers))


def _label(sides: list[_Side], labels) -> None:
    if labels is not None:  # checked by check_arguments
        sides[0].label, sides[1].label = map(str, labels)
    elif sides[0].label == sides[1].label:
        sides[0].label, sides[1].label = f"{sides[0].label} (a)", f"{sides[1].label} (b)"


def _check_side(side: _Side, name: str, pooling: str, texts: bool) -> None:
    """Refuse, before any forward pass, what this model cannot give with these inputs."""
    config = getattr(side.model, "config", None)
    transformers = getattr(config, "model_type", None) is not None
    if side.hooked is None and not transformers:
        raise LayersimError(f"{name} is a {type(side.model).__name__}, not a transformers model: name the modules to "
                            f"compare with layers_{name[-1]}=[...] (e.g. {', '.join(module_names(side.model)[:8])}).")
    if side.hooked is not None:
        named_modules(side.model, side.hooked, name)
    if transformers:
        check_poolings(config, [pooling])
    if texts and side.tokenizer is None:
        raise LayersimError(f"texts need {name}'s tokenizer; pass tokenizer_{name[-1]}= (a tokenizer or a folder).")
    if pooling == "tokens" and side.hooked is not None:
        raise LayersimError(f"pooling 'tokens' needs {name}'s transformers hidden states (it finds each word's last "
                            f"sub-word); with hooked modules (layers_{name[-1]}) use cls, mean or last.")
    if (pooling == "last" and transformers and not reads_last_token(config) and side.tokenizer is None):
        raise LayersimError(f"pooling 'last' skips {name}'s special tokens, which needs its tokenizer; pass "
                            f"tokenizer_{name[-1]}= or use cls or mean.")


def _encode_texts(side: _Side, texts: tuple[str, list], pooling: str, batch_size: int, max_length: int,
                  max_tokens: int | None, device) -> tuple[list[np.ndarray], np.ndarray | None]:
    """(per-layer arrays, word keys) of the texts: the extract stage's encoding and pooling, or the hooks'."""
    form, rows = texts
    columns = {"text": rows} if form == "single" else {"text_a": [a for a, _ in rows], "text_b": [b for _, b in rows]}
    table = pa.table({"example_id": np.arange(len(rows), dtype=np.int64), **columns,
                      "label": np.zeros(len(rows), dtype=np.int64)})
    encoded = encode_task(table, TaskSpec("texts", form, ("accuracy",), ("0",)), side.tokenizer, max_length,
                          words=pooling == "tokens")
    if side.hooked is None:
        found = pooled_layers(side.model, side.tokenizer, encoded, [pooling], batch_size, device, max_tokens=max_tokens)
        return found.layers[pooling], found.word_keys
    batches = (batch for _, batch in sequential_batches(encoded, batch_size, side.tokenizer, with_labels=False))
    return _from_batches([side], batches, pooling, device)[0], None


@torch.inference_mode()
def _from_batches(sides: list[_Side], batches: Iterable, pooling: str, device) -> list[list[np.ndarray]]:
    """Each side's per-layer arrays over `batches`, every batch run through every side before the next."""
    for side in sides:
        side.model.eval().to(device)
    parts: list[list[list[np.ndarray]]] = [[] for _ in sides]
    for index, batch in enumerate(batches):
        for k, side in enumerate(sides):
            check_batch(side.model, batch, side.label, index)
            parts[k].append(_batch_layers(side, batch, pooling, device))
    if not parts[0]:
        raise LayersimError("inputs gave no batch; pass texts or a DataLoader with at least one batch.")
    return [[np.concatenate(layer) for layer in zip(*part)] for part in parts]


def _batch_layers(side: _Side, batch, pooling: str, device) -> list[np.ndarray]:
    if isinstance(batch, dict):
        batch = to_device({k: v for k, v in batch.items() if k not in _LABEL_KEYS}, device)
        args, kwargs, ids = (), batch, batch.get("input_ids")
    else:
        first = batch[0] if isinstance(batch, (tuple, list)) else batch  # (inputs, labels) from a TensorDataset
        args, kwargs, ids = (first.to(device),), {}, None
    mask = kwargs.get("attention_mask")
    config = getattr(side.model, "config", None)
    last_token_head = config is not None and reads_last_token(config)
    special = side.tokenizer.all_special_ids if side.tokenizer is not None else []
    if side.hooked is None:
        if ids is None:
            raise LayersimError("a transformers model's batches must be dicts of its inputs (input_ids, "
                                "attention_mask, …).")
        states = side.model(**kwargs, output_hidden_states=True).hidden_states
        mask = torch.ones_like(ids) if mask is None else mask
        return pool_layers(states, ids, mask, [pooling], special, None, last_token_head)[pooling]
    with captured_outputs(side.model, side.hooked) as outputs:
        side.model(*args, **kwargs)
    missing = [name for name, out in zip(side.hooked, outputs) if out is None]
    if missing:
        raise LayersimError(f"modules {missing} of {side.label} did not run in its forward pass; name modules it runs.")
    return [_pooled(out, ids, mask, pooling, special, last_token_head) for out in outputs]


def _pooled(out: torch.Tensor, ids, mask, pooling: str, special: list[int], last_token_head: bool) -> np.ndarray:
    """A hooked output as (rows, features): as is, pooled over its tokens (rows, length, features), or flattened."""
    if out.ndim == 3:
        if mask is None or tuple(mask.shape) != tuple(out.shape[:2]):
            mask = torch.ones(out.shape[:2], dtype=torch.long, device=out.device)
        last = None
        if pooling == "last":
            last = last_content_position(mask if ids is None else ids, mask, special, last_token_head or ids is None)
        out = pool(out, mask, pooling, last)
    return out.reshape(len(out), -1).float().cpu().numpy()


def _cells(cells, sides: list[_Side]) -> list[tuple[int, int]]:
    """The (layer of a, layer of b) cells to bootstrap, by index or layer name; checked before any forward pass."""
    names = [side.layer_names for side in sides]
    if cells == "diagonal":
        return [(k, k) for k in range(len(names[0]))] if len(names[0]) == len(names[1]) else []
    return [cell_indices(cell, *names) for cell in cells]


def _compare(models: dict[str, list], sides: list[_Side], measures: list[str], pooling: str, options: dict,
             uncertainty, with_null: bool, cells: list[tuple[int, int]], groups) -> ModelComparison:
    a, b = (side.label for side in sides)
    num_rows = len(models[a][0])
    for measure in measures:  # before any work: e.g. mixedsim needs more examples than neurons
        check_computable(measure, num_rows, {f"{label} layer {k}": layer.shape[1]
                                             for label, layers in models.items() for k, layer in enumerate(layers)})
    result = ModelComparison((a, b), (sides[0].layer_names, sides[1].layer_names), pooling, num_rows, {})
    if (constant := constant_layers(models, {side.label: side.layer_names for side in sides}, pooling)) is not None:
        result.notes.append(constant)
    if (few := few_rows_note(num_rows)) is not None:
        warnings.warn(few, stacklevel=3)
        result.notes.append(few)
    sizes = {label: len(layers) for label, layers in models.items()}
    rows, columns = block_slices(sizes, a, b)
    if with_null:
        shortfall = reach_warning(uncertainty, measures, num_rows, options, sizes[a] * sizes[b], "compare_models")
        if shortfall:
            warnings.warn(shortfall, stacklevel=3)
            result.notes.append(shortfall)
    if uncertainty.bootstrap and not cells:
        result.notes.append(f"no intervals: the models' depths differ ({sizes[a]} and {sizes[b]} layers); "
                            "name the cells to bootstrap with cells=[(i, j), …]")
    for measure in measures:
        opts = options.get(measure, {})
        stacked = stacked_matrix(measure, models, **opts)
        found = MeasureComparison(measure, stacked[rows, columns], stacked=stacked,
                                  unavailable=null_unavailable(measure, num_rows, opts) or unmovable(num_rows, groups))
        if with_null and not found.unavailable:
            chosen = np.zeros(stacked.shape, dtype=bool)
            chosen[rows, columns] = True  # the a × b cells only, one heatmap, one family of tests
            null = stacked_null(measure, models, permutations=uncertainty.permutations, seed=uncertainty.seed,
                                cells=chosen, groups=groups, **opts)  # word rows: whole examples permuted
            found.null_mean, found.p_value = null.null_mean[rows, columns], null.p_value[rows, columns]
            found.p_adjusted = uncertainty.corrected(found.p_value)
            found.at_chance = uncertainty.at_chance(found.p_value)
        if uncertainty.bootstrap and cells and not found.unavailable:
            interval = bootstrap_pairs(measure, [models[a][i] for i, _ in cells], [models[b][j] for _, j in cells],
                                       resamples=uncertainty.bootstrap, seed=uncertainty.seed, groups=groups, **opts)
            if interval.method == "none":  # no interval method covers for this measure: none, and why
                result.notes.append(f"{measure}: {interval.note}")
            else:
                found.cells, found.interval = tuple(cells), (interval.low, interval.high)
                found.interval_method = interval.method
        result.measures[measure] = found
    return result
