"""`-S key.sub=value` overrides of params.yaml, as `dvc exp run -S` writes them: applied to the document for the plan
(which writes nothing), and explained in one sentence when DVC's own parser refuses one (``layersim launch``): a key
params.yaml has no place for (with a did-you-mean), a key the file does not hold yet."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from layersim.errors import LayersimError
from layersim.params.validate import parse_params
from layersim.params.yaml_file import read_yaml

_HOW = "write KEY=VALUE as for `dvc exp run -S`, the value in YAML (e.g. 1e-4, [a, b], text)"


def with_overrides(doc: dict, overrides: list[str]) -> dict:
    """`doc` (params.yaml's document, changed in place) with each `key.sub=value` set, the value read as YAML 1.2 as
    DVC reads -S (1e-4 is a number); an item without '=' or a value that is not plain YAML is one sentence."""
    from ruamel.yaml import YAML, YAMLError

    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise LayersimError(f"-S {item!r}: expected key=value; {_HOW}.")
        try:
            value = YAML(typ="safe").load(text)
        except YAMLError as err:  # e.g. a !!python tag (no constructor in the safe loader), an unclosed list
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise LayersimError(f"-S {item!r}: the value {text[:80]!r} is not plain YAML ({problem}); {_HOW}.") from None
        *parents, last = key.lstrip("+").split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else {}
        node[last] = value
    return doc


def overridden(path: Path, overrides: list[str]) -> dict:
    """params.yaml's document at `path` (one sentence if it is missing or not YAML) with `overrides` set."""
    return with_overrides(read_yaml(path), overrides)


def refused_override(path: Path, overrides: list[str]) -> LayersimError | None:
    """Why DVC could not apply `overrides` to params.yaml, in one sentence, where layersim can say it (else None: DVC's
    own grammar error stands): the first one whose key is unknown (params validation's sentence, with its
    did-you-mean), or whose key the file does not hold yet (DVC changes only keys a file has; +key=value adds one)."""
    doc = read_yaml(path)
    for item in overrides:
        key = item.partition("=")[0]
        try:
            parse_params(with_overrides(copy.deepcopy(doc), [item]))
        except LayersimError as err:
            message = str(err).removeprefix("params.yaml: ")
            if message.startswith("unknown key"):
                return LayersimError(f"-S {item}: {message}")
            if message.startswith("-S "):  # a value DVC's grammar reads otherwise: its own error says more
                continue
        if not key.startswith("+") and not _holds(doc, key.split(".")):
            return LayersimError(f"-S {item}: {key} is a valid key but params.yaml does not hold it yet, and DVC's -S "
                                 f"changes only keys the file has; write -S +{item} to add it, or add it to the file.")
    return None


def _holds(doc: Any, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True
