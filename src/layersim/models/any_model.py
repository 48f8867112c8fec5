"""Any model, as ``layersim.compare_models`` takes it: loaded from a registry name, a Hugging Face hub id or a model
folder (:func:`load_model`), and the outputs of named submodules of any ``nn.Module``, captured by forward hooks
(:func:`captured_outputs`), for a model that is not a transformers encoder or a chosen set of a transformers model's
modules. (A transformers encoder's own layers come from its ``hidden_states``, as the extract stage reads them;
:mod:`layersim.models.layer_stacks` knows where each architecture keeps them.)"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from layersim.errors import LayersimError, did_you_mean, hub_unreachable, unknown_name
from layersim.models.local_models import load_model_folder
from layersim.models.registry import (MODEL_INFO_FILE, MODELS, OFFLINE_MODELS, ensure_pad_token, get_model, is_path,
                                      load_encoder, load_tokenizer, snapshot_model)

_LISTED = 12  # module names an error lists


# What works without network in compare_models: the offline registry and any model folder on disk.
_OFFLINE_CHOICES = (*OFFLINE_MODELS, "or a model folder's path (any save_pretrained folder)")


def load_model(name: str | Path, tokenizer: bool = True):
    """(bare encoder, tokenizer) of a model folder (one layersim wrote is verified first: its digest; any other
    folder's files are checked as a local model's are), a registry name (a tiny or packaged model is snapshotted to a
    temporary folder first) or a Hugging Face hub id; the tokenizer is None unless `tokenizer`. transformers' loading
    report and progress bars are kept quiet; weights it had to initialise at random are warned about in one line."""
    path = Path(name)
    with _quiet_loading(str(name)):
        if path.is_dir():
            if (path / MODEL_INFO_FILE).is_file():
                return load_encoder(path), load_tokenizer(path) if tokenizer else None
            _check_folder(path)
            found = load_model_folder(path, f"model folder {str(path)!r}", tokenizer)
            if found.tokenizer is not None:
                ensure_pad_token(found.model, found.tokenizer)
            return found.model, found.tokenizer
        if isinstance(name, Path) or is_path(str(name)) or (path.parent != Path() and path.parent.is_dir()):
            raise _missing_folder(path)
        if "/" not in str(name) and str(name) not in MODELS:
            raise unknown_name("model", str(name), MODELS, hint="or a Hugging Face hub id written owner/name, or a "
                                                                "model folder's path")
        spec = get_model(str(name))
        if spec.source == "hub":
            return _from_hub(spec, tokenizer)
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:
            snapshot_model(spec.name, folder)
            return load_encoder(folder), load_tokenizer(folder) if tokenizer else None


def _check_folder(path: Path) -> None:
    """A folder without config.json is not a transformers model folder: one sentence naming what it holds."""
    if (path / "config.json").is_file():
        return
    inside = sorted(p.name for p in path.iterdir())[:6]
    raise LayersimError(f"folder {str(path)!r} is not a transformers model folder: it has no config.json (it holds "
                        f"{', '.join(inside) or 'nothing'}); pass a folder written by save_pretrained.")


def _missing_folder(path: Path) -> LayersimError:
    """The error for a path that names no folder: a file, or nothing (with a close sibling's name if there is one)."""
    if path.exists():
        return LayersimError(f"model {str(path)!r} is a file, not a model folder; pass the folder that holds it "
                             f"({str(path.parent)!r}), written by save_pretrained.")
    parent = path.parent if path.parent.is_dir() else None
    close = did_you_mean(path.name, [p.name for p in parent.iterdir() if p.is_dir()]) if parent else ""
    return LayersimError(f"no model folder at {str(path)!r}{close}; a model is a folder's path (any save_pretrained "
                         "folder), a registry name or a Hugging Face hub id (owner/name).")


def load_any_tokenizer(source: str | Path):
    """The tokenizer saved in a folder, or of a hub id (transformers' AutoTokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def _from_hub(spec, tokenizer: bool):
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(spec.hub_id)
        found = load_any_tokenizer(spec.hub_id) if tokenizer else None
    except OSError as err:
        raise hub_unreachable("model", spec.name, err, _OFFLINE_CHOICES) from err
    if found is not None:
        ensure_pad_token(model, found)
    return model, found


_REPORT_ROW = re.compile(r"^\s*(\S+)\s*\|\s*(UNEXPECTED|MISSING|MISMATCH|CONVERSION)\b", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def _quiet_loading(what: str) -> Iterator[None]:
    """transformers' progress bars and LOAD REPORT table silenced while a model loads: a checkpoint's dropped task
    head (UNEXPECTED keys) is expected. Weights it initialised at random (MISSING) are a real problem for a
    comparison: one warning names them (the pooler aside, which no hidden state goes through). A report of weights of
    another shape or a failed conversion, which transformers raises on next, is left as it is: its error points to it."""
    from transformers.utils import logging as hf_logging

    missing: list[str] = []

    logger = logging.getLogger("transformers.modeling_utils")  # where from_pretrained logs its report
    shown, level = logger.getEffectiveLevel(), logger.level  # the report is read even where the user silenced it

    def keep(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" not in str(record.msg):
            return record.levelno >= shown
        rows = _REPORT_ROW.findall(_ANSI.sub("", record.getMessage()))
        if any(status in ("MISMATCH", "CONVERSION") for _, status in rows):
            return record.levelno >= shown
        missing.extend(key for key, status in rows if status == "MISSING" and not key.startswith("pooler."))
        return False

    bars = hf_logging.is_progress_bar_enabled()
    logger.addFilter(keep)
    # Below WARNING, not at it: transformers verifies a tensor-parallel plan (and warns of every layer not sharded)
    # when this logger's own level is WARNING or above; `keep` applies the user's level to every other record.
    logger.setLevel(min(shown, logging.INFO))
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.removeFilter(keep)
        logger.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()
    if missing:
        warnings.warn(f"model {what!r}: transformers initialised {len(missing)} weights at random that its checkpoint "
                      f"lacks ({', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}); those layers are not the "
                      "saved model's.", stacklevel=4)


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
