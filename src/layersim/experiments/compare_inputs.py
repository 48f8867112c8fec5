"""``compare_models``' arguments checked the way the pipeline checks params: each bad value is one
:class:`~layersim.errors.LayersimError` sentence that names it and what is valid, raised before any model runs
(the arguments), or before a batch reaches a model (each batch: its keys, dtypes, shapes and token ids)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from layersim.errors import LayersimError
from layersim.params.validate import ABSOLUTE_POSITION_FAMILIES
from layersim.params.vocabulary import MIN_EXAMPLES, MIN_MAX_LENGTH

MAX_BATCH = 2**16
# RoBERTa's and XLM-R's positions start after the padding index, MPNet's after its fixed index 1 (params.validate's
# limits: 129, 128 of 130); the other absolute-position families' at 0.
_AFTER_PADDING = ("roberta", "xlm-roberta")


def _whole(name: str, value, low: int, high: int, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise LayersimError(f"{name} = {value!r} is invalid; it must be None or a whole number from {low} to {high} "
                            f"({what}).")


def check_arguments(measures, batch_size, max_length, max_tokens, layers_a, layers_b, labels, device) -> None:
    """The arguments that need no model: types and ranges."""
    if measures is None or not (isinstance(measures, str) or (isinstance(measures, (list, tuple))
                                                              and all(isinstance(m, str) for m in measures))):
        raise LayersimError(f"measures = {measures!r} is invalid; pass a measure name or a list of them, e.g. "
                            "('linear_cka', 'svcca').")
    _whole("batch_size", batch_size, 1, MAX_BATCH, "examples per forward pass")
    _whole("max_length", max_length, MIN_MAX_LENGTH, 10**6, "tokens per input, special tokens included")
    _whole("max_tokens", max_tokens, 1, 10**8, "word rows kept with pooling 'tokens'")
    for name, layers in (("layers_a", layers_a), ("layers_b", layers_b)):
        if layers is not None and (isinstance(layers, str) or not isinstance(layers, (list, tuple)) or not layers
                                   or not all(isinstance(n, str) and n for n in layers)):
            raise LayersimError(f"{name} = {layers!r} is invalid; pass a non-empty list of module names as "
                                "model.named_modules() gives them, e.g. ['encoder.layer.0', 'encoder.layer.1'].")
    if labels is not None and (not isinstance(labels, (list, tuple)) or len(labels) != 2
                               or not all(isinstance(v, str) and v for v in labels) or labels[0] == labels[1]):
        raise LayersimError(f"labels {labels!r} must be two different names, model_a's then model_b's.")
    if not isinstance(device, str):
        raise LayersimError(f"device = {device!r} is invalid; use 'auto', 'cpu', 'cuda' or 'cuda:N'.")


def check_inputs(inputs) -> None:
    """What `inputs` can be: texts, (text_a, text_b) pairs, or an iterable of batches; anything else is named."""
    if isinstance(inputs, str):
        raise LayersimError("inputs is a single string; pass a list of texts (or of (text_a, text_b) pairs).")
    if isinstance(inputs, (bytes, bytearray, np.ndarray, torch.Tensor, Mapping)) or inputs is None or not isinstance(
            inputs, Iterable):
        raise LayersimError(f"inputs is a {type(inputs).__name__}; pass a list of texts, of (text_a, text_b) pairs, "
                            "or an iterable of batches (a DataLoader of dicts of tensors).")
    if isinstance(inputs, Sequence) and len(inputs):
        for k, item in enumerate(inputs):
            if not isinstance(item, (str, tuple, list, Mapping, torch.Tensor)):
                raise LayersimError(f"inputs[{k}] is of type {type(item).__name__} ({str(item)[:60]!r}); pass texts, "
                                    "(text_a, text_b) pairs, or batches (dicts of tensors, tensors).")
            if isinstance(item, str) and not item.strip():
                raise LayersimError(f"inputs[{k}] is an empty text; every text needs at least one word.")
        texts = [tuple(item) if isinstance(item, list) else item for item in inputs]
        if len(texts) > 1 and all(isinstance(t, (str, tuple)) for t in texts) and len(set(texts)) == 1:
            raise LayersimError(f"inputs are {len(texts)} copies of one text ({str(texts[0])[:60]!r}): every layer "
                                "would be the same for each and no similarity is defined; pass texts that differ.")


def max_length_for(model, asked: int | None, default: int, name: str) -> int:
    """The tokens per input for `model`: `asked`, refused above the model's absolute positions, or by default the
    smaller of `default` and those positions."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if kind not in ABSOLUTE_POSITION_FAMILIES or not isinstance(positions, int):
        return asked or default
    limit = positions - ((getattr(config, "pad_token_id", 0) or 0) + 1 if kind in _AFTER_PADDING else
                         2 if kind == "mpnet" else 0)
    if asked is None:
        return min(default, limit)
    if asked > limit:
        raise LayersimError(f"max_length = {asked} is too long for {name} (a {kind} model): its position embeddings "
                            f"hold {limit} tokens; pass max_length of at most {limit}.")
    return asked


def check_batch(model, batch, name: str, index: int) -> None:
    """One batch as `model` will get it: a dict of tensors whose keys its forward takes (labels aside), integer
    token ids inside its vocabulary and a mask of their shape; or a tensor; or a tuple whose first element is one."""
    where = f"batch {index} for {name}"
    if isinstance(batch, Mapping):
        bad = [key for key, value in batch.items() if not isinstance(value, torch.Tensor)]
        if bad:
            raise LayersimError(f"{where}: {bad[0]!r} is a {type(batch[bad[0]]).__name__}; every entry of a batch "
                                "dict must be a tensor.")
        takes = inspect.signature(model.forward).parameters
        # A transformers model's **kwargs are its attention options, not inputs: a batch key must be a named one.
        named_only = getattr(getattr(model, "config", None), "model_type", None) is not None
        if named_only or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values()):
            unknown = sorted(set(batch) - set(takes) - {"labels", "label"})
            if unknown:
                raise LayersimError(f"{where}: {unknown[0]!r} is not an input of {type(model).__name__}; its inputs "
                                    f"are: {', '.join(k for k, p in takes.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))}.")
        ids, mask = batch.get("input_ids"), batch.get("attention_mask")
        rows = next((value for value in batch.values() if value.ndim), None)
        if rows is not None and not len(rows):
            raise LayersimError(f"{where} has 0 rows (shape {tuple(rows.shape)}); every batch needs at least one input.")
        if mask is not None and mask.ndim == 2 and not mask.any(dim=1).all():
            row = int((~mask.any(dim=1)).nonzero()[0, 0])
            raise LayersimError(f"{where}: attention_mask row {row} is all zeros, so that input has no token to pool; "
                                "every row needs at least one 1.")
        _check_token_types(model, batch.get("token_type_ids"), where, name)
        if ids is not None:
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise LayersimError(f"{where}: input_ids are {ids.dtype}; token ids are integers (torch.long).")
            vocab = getattr(getattr(model, "config", None), "vocab_size", None)
            if ids.numel() and isinstance(vocab, int) and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
                raise LayersimError(f"{where}: input_ids run from {int(ids.min())} to {int(ids.max())}, outside "
                                    f"{name}'s vocabulary of {vocab} tokens (0 … {vocab - 1}); encode with its own "
                                    "tokenizer.")
            if mask is not None and tuple(mask.shape) != tuple(ids.shape):
                raise LayersimError(f"{where}: attention_mask has shape {tuple(mask.shape)} but input_ids "
                                    f"{tuple(ids.shape)}; the mask needs one entry per token.")
        return
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if not isinstance(first, torch.Tensor):
        raise LayersimError(f"{where} is a {type(batch).__name__}; a batch is a dict of tensors, a tensor, or a tuple "
                            "whose first element is the input tensor.")
    if first.ndim and not len(first):
        raise LayersimError(f"{where} has 0 rows (shape {tuple(first.shape)}); every batch needs at least one input.")


def _check_token_types(model, types, where: str, name: str) -> None:
    """token_type_ids within the model's segment embedding (BERT's type_vocab_size), integers as token ids are."""
    size = getattr(getattr(model, "config", None), "type_vocab_size", None)
    if types is None or not types.numel() or not isinstance(size, int):
        return
    if types.is_floating_point() or types.dtype == torch.bool:
        raise LayersimError(f"{where}: token_type_ids are {types.dtype}; segment ids are integers (torch.long).")
    if not (0 <= int(types.min()) and int(types.max()) < size):
        raise LayersimError(f"{where}: token_type_ids run from {int(types.min())} to {int(types.max())}, outside "
                            f"{name}'s {size} segment types (0 … {size - 1}); encode with its own tokenizer.")


def cell_indices(cell, names_a: list[str], names_b: list[str]) -> tuple[int, int]:
    """A bootstrap cell (layer of a, layer of b), each given by its index (0 …) or its name (``layer_names``:
    'emb', '1', …), as a pair of indices."""
    found = []
    for value, names in zip(cell, (names_a, names_b)):
        if isinstance(value, str) and value in names:
            found.append(names.index(value))
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < len(names):
            found.append(int(value))
    if len(found) < 2:
        def listed(names):
            return ", ".join(names) if len(names) <= 4 else f"{names[0]}, {names[1]} … {names[-1]}"
        raise LayersimError(f"cell {tuple(cell)!r} is outside the {len(names_a)} × {len(names_b)} layer matrix; valid "
                            f"cells are (0 … {len(names_a) - 1}, 0 … {len(names_b) - 1}), or by layer name "
                            f"({listed(names_a)} of model_a; {listed(names_b)} of model_b).")
    return found[0], found[1]


def constant_layers(models: dict[str, list[np.ndarray]], names: dict[str, list[str]], pooling: str) -> str | None:
    """A note naming the layers that are the same for every input (their rows and columns are NaN: e.g. the
    embedding layer's [CLS] state); refused when every layer of a model is (the inputs say nothing to it)."""
    from layersim.similarity import is_constant

    constant = {label: [name for name, layer in zip(names[label], layers) if is_constant(layer)]
                for label, layers in models.items()}
    for label, found in constant.items():
        if len(found) == len(models[label]):
            raise LayersimError(f"every layer of {label} is the same for each of the {len(models[label][0])} inputs, "
                                "so no similarity is defined (NaN); pass inputs that the model tells apart (e.g. "
                                "texts that differ, a mask that keeps their tokens).")
    listed = [f"{label} {name}" for label, found in constant.items() for name in found]
    if not listed:
        return None
    why = " (with cls pooling the embedding layer holds the same first-token embedding for every input)" if (
        pooling == "cls" and any(name == "emb" for found in constant.values() for name in found)) else ""
    return f"NaN where a layer is the same for every input (no similarity is defined): {', '.join(listed)}{why}."


def few_rows_note(num_rows: int) -> str | None:
    """A note when the examples are too few for the numbers to say anything (the pipeline refuses below
    MIN_EXAMPLES; here the call runs and says so)."""
    if num_rows >= MIN_EXAMPLES:
        return None
    return (f"only {num_rows} examples: every similarity of so few points sits near its bound (linear CKA of 2 points "
            f"is 1 whatever the models) and a null cannot resolve small p-values; the pipeline asks for at least "
            f"{MIN_EXAMPLES}.")
