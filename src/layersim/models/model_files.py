"""What a model folder holds, read without loading a model: the local-folder convention, the tokenizer files,
a checked JSON reader and the tokenizer-fits-the-embedding rule. Shared by the registry and
layersim.models.local_models, below both (so that neither imports the other at load time)."""

from __future__ import annotations

import json
from pathlib import Path

from layersim.errors import LayersimError

LOCAL_PREFIX = "local/"      # model: local/<name> — the folder models/<name>/ of the repository
LOCAL_MODELS_DIR = Path("models")
# The files a tokenizer may be saved as (whichever of these a folder has).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model")


def read_json(path: Path, what: str, remedy: str) -> dict:
    """A JSON object from `path`; unreadable, cut short or not an object: one line naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        detail = getattr(err, "msg", None) or type(err).__name__
        raise LayersimError(f"{what} {path} cannot be read ({detail}); {remedy}.") from None
    if not isinstance(value, dict):
        raise LayersimError(f"{what} {path} holds a {type(value).__name__}, not a JSON object; {remedy}.")
    return value


def tokenizer_files(folder: str | Path) -> list[str]:
    """The tokenizer files a model folder holds."""
    return [name for name in TOKENIZER_FILES if (Path(folder) / name).is_file()]


def fits_embedding(tokenizer, vocab_size: object) -> bool:
    """Whether `tokenizer` can be the tokenizer of a model whose config gives `vocab_size` (True when it gives none):
    its tokens fit the embedding matrix and cover at least half of it (models round the matrix up, but a folder
    without its tokenizer files silently loads a handful of special tokens, turning every word into [UNK])."""
    return not isinstance(vocab_size, int) or vocab_size // 2 <= len(tokenizer) <= vocab_size
