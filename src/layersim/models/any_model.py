"""Any model, as ``layersim.compare_models`` takes it: loaded from a registry name, a Hugging Face hub id or a model
folder (:func:`load_model`), and the outputs of named submodules of any ``nn.Module``, captured by forward hooks
(:func:`captured_outputs`), for a model that is not a transformers encoder or a chosen set of a transformers model's
modules. (A transformers encoder's own layers come from its ``hidden_states``, as the extract stage reads them;
:mod:`layersim.models.layer_stacks` knows where each architecture keeps them.)"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from layersim.errors import LayersimError, hub_unreachable
from layersim.models.registry import (MODEL_INFO_FILE, OFFLINE_CHOICES, ensure_pad_token, get_model, load_encoder,
                                      load_tokenizer, snapshot_model)

_LISTED = 12  # module names an error lists


def load_model(name: str | Path):
    """(bare encoder, tokenizer) of a model folder (one layersim wrote is verified first: its digest), a registry
    name (a tiny or packaged model is snapshotted to a temporary folder first) or a Hugging Face hub id."""
    path = Path(name)
    if path.is_dir():
        if (path / MODEL_INFO_FILE).is_file():
            return load_encoder(path), load_tokenizer(path)
        return _pretrained(path, f"folder {str(path)!r}")
    spec = get_model(str(name))  # one sentence for anything that is neither
    if spec.source == "hub":
        return _pretrained(spec.hub_id, f"model {spec.name!r}", hub=True)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
        snapshot_model(spec.name, folder)
        return load_encoder(folder), load_tokenizer(folder)


def load_any_tokenizer(source: str | Path):
    """The tokenizer saved in a folder, or of a hub id (transformers' AutoTokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def _pretrained(source, what: str, hub: bool = False):
    from transformers import AutoModel

    try:
        model, tokenizer = AutoModel.from_pretrained(source), load_any_tokenizer(source)
    except OSError as err:
        if hub:
            raise hub_unreachable("model", str(source), err, OFFLINE_CHOICES) from err
        raise LayersimError(f"{what} is not a transformers model ({str(err).splitlines()[0][:200]}); give a folder "
                            "written by save_pretrained.") from None
    ensure_pad_token(model, tokenizer)
    return model, tokenizer


def module_names(model: nn.Module) -> list[str]:
    """The names a caller may hook: every named submodule but the model itself, in registration order."""
    return [name for name, _ in model.named_modules() if name]


def named_modules(model: nn.Module, names: Sequence[str], what: str = "model") -> list[nn.Module]:
    """The submodules of `model` at `names` (dotted paths, as ``model.named_modules()`` gives them), or a
    one-sentence error naming the first unknown one and the valid names."""
    if isinstance(names, (str, bytes)) or not names:
        raise LayersimError(f"layers of {what} must be a non-empty list of module names, got {names!r}; e.g. "
                            f"{module_names(model)[:_LISTED]}.")
    known = dict(model.named_modules())
    for name in names:
        if not name or name not in known:
            valid = module_names(model)
            more = f" … ({len(valid)} in all)" if len(valid) > _LISTED else ""
            raise LayersimError(f"{what} has no module {name!r}; valid names are: "
                                f"{', '.join(valid[:_LISTED])}{more}.")
    return [known[name] for name in names]


def _tensor(output, name: str) -> torch.Tensor:
    """The tensor a hooked module returned: itself, or the first element of a tuple or model output (transformers'
    layers return (hidden, attention, …) in some versions)."""
    while not isinstance(output, torch.Tensor):
        if isinstance(output, dict) and output:
            output = next(iter(output.values()))
        elif isinstance(output, (tuple, list)) and output:
            output = output[0]
        else:
            raise LayersimError(f"module {name!r} returned a {type(output).__name__}, not a tensor; hook a module "
                                "whose output is the representation (rows first).")
    return output


@contextlib.contextmanager
def captured_outputs(model: nn.Module, names: Sequence[str], what: str = "model") -> Iterator[list]:
    """While open, each forward pass of `model` leaves in the yielded list the output of every module of `names`,
    in that order (the list is cleared by the caller between passes); the hooks are removed on exit. A module that
    runs twice in one pass (shared weights) keeps its last output."""
    modules = named_modules(model, names, what)
    outputs: list = [None] * len(modules)

    def hook(position: int, name: str):
        def record(module, inputs, output):
            outputs[position] = _tensor(output, name).detach()
        return record

    handles = [module.register_forward_hook(hook(k, name)) for k, (module, name) in enumerate(zip(modules, names))]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def model_label(given: str) -> str:
    """A model's name as the user gave it: a registry or hub name, or a folder's path (its last two parts when long:
    a folder's own name alone, e.g. a task or seed folder, says little); a checkpoint of the finetune stage is
    named as the pipeline names it, FT:<task> seed <k>."""
    info = Path(given) / MODEL_INFO_FILE
    try:
        record = json.loads(info.read_text(encoding="utf-8")) if info.is_file() else {}
    except (OSError, ValueError):
        record = {}
    if isinstance(record, dict) and record.get("task") and record.get("seed") is not None:
        return f"FT:{record['task']} seed {record['seed']}"
    parts = Path(given).parts
    return given if len(given) <= 40 or len(parts) <= 2 else "…/" + "/".join(parts[-2:])
