"""Local models: ``model: local/<folder>`` names a transformers model that the user saved in ``models/<folder>/`` of
the repository (docs/params-safety.md, point 4). Its files were written by hand or by another tool, so each is
checked before the weights load or anything is written, cheapest first: the config, its model type, that weights
and a tokenizer are there, that the tokenizer loads and fits the model's vocabulary, and last the weights. A broken
folder is one sentence naming the file and how to save it again, never a transformers traceback. compare_models checks
any other model folder it is given the same way (:func:`load_model_folder`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from layersim.errors import LayersimError
from layersim.models.model_files import (LOCAL_MODELS_DIR, LOCAL_PREFIX, TOKENIZER_FILES, fits_embedding, read_json,
                                         tokenizer_files)

# What transformers' from_pretrained reads weights from in a folder: one file, or the index of its shards.
LOADABLE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                    "pytorch_model.bin.index.json")


def local_model_dir(name: str, root: Path = Path()) -> Path:
    """The folder of the local model `name` (``local/<folder>``): ``models/<folder>`` under `root` (the working
    directory: the repository root, where stages run); refused if it is missing or leads outside models/ (a symbolic
    link)."""
    folder = root / LOCAL_MODELS_DIR / name[len(LOCAL_PREFIX):]
    if not (folder / "config.json").is_file():
        raise LayersimError(f"model {name!r} needs a transformers model folder at {folder}/ (config.json, "
                            "weights, tokenizer files), which does not exist; save one there with "
                            "save_pretrained.")
    if not folder.resolve().is_relative_to((root / LOCAL_MODELS_DIR).resolve()):
        raise LayersimError(f"model {name!r}: {folder} leads outside {LOCAL_MODELS_DIR}/ (a symbolic link); "
                            "copy the model into the folder instead.")
    return folder


class LocalModel(NamedTuple):
    folder: Path
    model: Any  # the bare encoder (transformers' AutoModel)
    tokenizer: Any


def load_local_model(name: str) -> LocalModel:
    """The folder, bare encoder and tokenizer of the local model `name`, every file of the folder checked first."""
    return load_model_folder(local_model_dir(name), f"model {name!r}")


def load_model_folder(folder: Path, what: str, tokenizer: bool = True) -> LocalModel:
    """The bare encoder and tokenizer (None unless `tokenizer`) of a transformers model folder written by hand or by
    another tool, every file checked first; `what` names the model in the one-sentence errors."""
    save_model = f"save the model there again with model.save_pretrained('{folder}')"
    config = read_json(folder / "config.json", f"{what}: its config", save_model)
    _check_model_type(what, folder, config.get("model_type"), save_model)
    if not any((folder / weights).is_file() for weights in LOADABLE_WEIGHTS):
        raise LayersimError(f"{what}: {folder}/ has no weights file ({' or '.join(LOADABLE_WEIGHTS[::2])}); "
                            f"{save_model}.")
    found = _load_tokenizer(what, folder, config.get("vocab_size")) if tokenizer else None
    return LocalModel(folder, _load_weights(what, folder, save_model), found)


def _check_model_type(what: str, folder: Path, model_type: object, save_model: str) -> None:
    """The config's model_type must be one this transformers knows: it picks the classes that read the folder."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if not isinstance(model_type, str):
        raise LayersimError(f"{what}: {folder}/config.json has no model_type (save_pretrained writes one); "
                            f"{save_model}.")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise LayersimError(f"{what}: {folder}/config.json has model_type {model_type[:100]!r}, which "
                            f"transformers {transformers.__version__} does not know; save a model of a type it knows "
                            "(e.g. bert, roberta, gpt2) there with save_pretrained, or upgrade transformers if the "
                            "type is newer.")


def _load_tokenizer(what: str, folder: Path, vocab_size: object):
    """The folder's tokenizer, which must be there, load, and fit the model's vocabulary (without its files
    transformers loads a handful of special tokens instead, and every word would become the unknown token)."""
    from transformers import AutoTokenizer

    save_tokenizer = f"save the model's own tokenizer there with tokenizer.save_pretrained('{folder}')"
    present = tokenizer_files(folder)
    if not present:
        raise LayersimError(f"{what}: {folder}/ has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
                            f"{save_tokenizer}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - broken files fail in any reader: ValueError, KeyError, TypeError, …
        detail = str(err).splitlines()[0][:200] if str(err) else ""
        raise LayersimError(f"{what}: the tokenizer in {folder}/ cannot be loaded ({type(err).__name__}: "
                            f"{detail}; files present: {', '.join(present)}); {save_tokenizer}.") from None
    if not fits_embedding(tokenizer, vocab_size):
        raise LayersimError(f"{what}: the tokenizer in {folder}/ has {len(tokenizer)} tokens but the model's "
                            f"embedding has {vocab_size}: it is not this model's tokenizer (files present: "
                            f"{', '.join(present)}); {save_tokenizer}.")
    return tokenizer


def _load_weights(what: str, folder: Path, save_model: str):
    from safetensors import SafetensorError
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(folder)
    except (OSError, ValueError, TypeError, RuntimeError, SafetensorError) as err:  # e.g. a weights file cut short
        raise LayersimError(f"{what}: {folder}/ cannot be loaded as a transformers model "
                            f"({str(err).splitlines()[0][:200]}); {save_model}.") from None
