"""What a model's kind decides in params: the pooling its own head reads, and whether that head can be copied.

params.yaml names two values by what they mean rather than by a token, so that one file serves encoders and
decoders alike (`dvc exp run -S model=tiny-gpt2` needs no other setting):

* the pooling ``head`` — the token the model's own classification head reads: ``cls`` for encoders (the
  first token: [CLS], <s>), ``last`` (the last non-pad token) for decoders and XLNet, whose first token has seen
  nothing of the input; it may stand in ``extract.poolings``, as a key of ``similarity.measures`` and as
  ``align.pooling``;
* ``truncate.head: auto`` — the fine-tuned head copied (``own``, Phang et al.) where layersim can copy the
  family's head, a fresh head otherwise.

Both are resolved when params are read (:func:`resolve_model_kind`), so that every stage sees the concrete
pooling and head, and tables and figures are named by the token they hold (``cls.parquet``, ``last.png``).
The family comes from the model registry, or for another hub id or folder from its downloaded config.json
once the download stage has written it (before that, an encoder is assumed and extract checks the real config).
Reading params imports no torch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from layersim.models.registry import MODELS, read_json

# Families whose own classification head reads each row's last non-pad token, not the first: the decoders,
# which have no multiple-choice head in transformers, and XLNet (its <cls> is last). The same as head_token
# "last" in layersim.models.layer_stacks.FAMILIES (tests/test_params.py checks), spelled out here so that
# reading params imports no torch. Such a model has no first-token ("cls") representation.
DECODERS = ("gpt2", "llama", "mistral", "qwen2")
LAST_TOKEN_HEADS = (*DECODERS, "xlnet")

# Families whose fine-tuned head truncate.head "own" can copy (layersim.models.task_heads.own_head; checked by
# tests/test_params.py): the others train a fresh head (truncate.head: fresh).
OWN_HEAD_ARCHITECTURES = ("albert", "bert", "electra", "roberta")

HEAD = "head"  # the pooling name that stands for the model's own head token
DOWNLOADED = Path("data/models")  # where download_model puts a model (dvc.yaml: data/models/<model>/pretrained)


def head_pooling(folder) -> str:
    """The pooling of the token the own classification head of the model in `folder` reads (its config.json,
    read without loading the model), on which truncate trains its fresh heads: "last" (the last non-pad
    token) for decoders and XLNet, "cls" otherwise."""
    config = read_json(Path(folder) / "config.json", "model config", "re-run the stage that wrote the folder")
    return _pooling_of(config.get("model_type"))


def _pooling_of(kind: str | None) -> str:
    return "last" if kind in LAST_TOKEN_HEADS else "cls"


def architecture(name: str) -> str | None:
    """The family of a registry model; None for a hub id or a local folder (known only once downloaded)."""
    spec = MODELS.get(name)
    return spec.architecture if spec else None


def family(name: str) -> str | None:
    """The family of a registry model, else the model_type of its downloaded (or local) config.json; None when
    neither is there yet."""
    known = architecture(name)
    if known is not None:
        return known
    for config in (DOWNLOADED / name / "pretrained" / "config.json", Path(name) / "config.json"):
        try:
            return json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            continue
    return None


def model_noun(name: str) -> str:
    """What a sentence calls model `name`: "decoder" (DECODERS), "encoder" (every other family), or "model" while
    its family is unknown (a hub model not downloaded yet)."""
    kind = family(name)
    return "model" if kind is None else "decoder" if kind in DECODERS else "encoder"


def own_head_pooling(name: str) -> str:
    """What ``head`` means for model `name`: "last" for decoders and XLNet, "cls" otherwise."""
    return _pooling_of(family(name))


def _resolved(poolings, head: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(head if pooling == HEAD else pooling for pooling in poolings))


def resolve_model_kind(model: str, sections: dict[str, Any]) -> dict[str, Any]:
    """`sections` with ``head`` poolings and ``truncate.head: auto`` made concrete for `model` (see the module
    docstring); a ``head`` key of similarity.measures merges with the key it stands for."""
    head = own_head_pooling(model)
    extract, similarity, align, truncate = (sections[name] for name in ("extract", "similarity", "align", "truncate"))
    measures: dict[str, tuple[str, ...]] = {}
    for pooling, names in similarity.measures.items():
        key = head if pooling == HEAD else pooling
        measures[key] = tuple(dict.fromkeys((*measures.get(key, ()), *names)))
    kind = family(model)
    copyable = kind is None or kind in OWN_HEAD_ARCHITECTURES  # unknown before download: Phang's default, checked later
    return {**sections,
            "extract": dataclasses.replace(extract, poolings=_resolved(extract.poolings, head)),
            "similarity": dataclasses.replace(similarity, measures=measures),
            "align": dataclasses.replace(align, pooling=head if align.pooling == HEAD else align.pooling),
            "truncate": dataclasses.replace(truncate, head=("own" if copyable else "fresh") if truncate.head == "auto"
                                            else truncate.head)}
