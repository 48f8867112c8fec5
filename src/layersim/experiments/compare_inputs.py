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


def few_rows_note(num_rows: int) -> str | None:
    """A note when the examples are too few for the numbers to say anything (the pipeline refuses below
    MIN_EXAMPLES; here the call runs and says so)."""
    if num_rows >= MIN_EXAMPLES:
        return None
    return (f"only {num_rows} examples: every similarity of so few points sits near its bound (linear CKA of 2 points "
            f"is 1 whatever the models) and a null cannot resolve small p-values; the pipeline asks for at least "
            f"{MIN_EXAMPLES}.")
