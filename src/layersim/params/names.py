"""Names in params.yaml that come from a registry: the model, the tasks, compare.models."""

from __future__ import annotations

import re
from typing import Any

from layersim.errors import LayersimError, compact, did_you_mean
from layersim.models.registry import MODELS, get_model
from layersim.params.rules import fail, repeated, shown
from layersim.data.tasks import get_task, known_tasks


def known_name(key: str, value: Any, kind: str, lookup, valid, hint: str = "", entry: bool = False) -> Any:
    """`lookup(value)` (a registry's get_*); an unknown name is an error that names the params key (of
    which the value is an `entry` of a list, or the whole value), the value, a close registry name if
    there is one, and every valid name."""
    try:
        return lookup(value)
    except LayersimError:
        pass
    mean = did_you_mean(value, valid)
    what = f"{key} has {shown(value)}, which" if entry else f"{key} = {shown(value)}"
    raise LayersimError(f"params.yaml: {what} is not a known {kind}{mean}; valid {kind}s are: "
                        f"{', '.join(compact(valid))}{hint}.")


def check_model(key: str, name: Any, entry: bool = False):
    if isinstance(name, str) and "/" in name:  # a hub id or local/<folder>: the rule it breaks
        try:
            return get_model(name)
        except LayersimError as err:
            problem = str(err).removeprefix("model ")  # "'x/y;z' is not a valid Hugging Face hub id: …"
            if entry:
                problem = problem.replace(" is not", ", which is not", 1)
            raise LayersimError(f"params.yaml: {key} {'has' if entry else '='} {problem}") from None
    return known_name(key, name, "model", get_model, MODELS, " (or a Hugging Face hub id written owner/name, or "
                                                             "local/<folder> for a folder of models/)", entry)


def check_task(key: str, name: Any) -> None:
    if isinstance(name, str) and re.search(r"[/\\]|\.(csv|tsv|jsonl|json|parquet)$", name):
        file = re.split(r"[/\\]", name)[-1]
        stem = re.sub(r"[^a-z0-9_-]", "", file.split(".")[0].lower()) or "mine"
        raise LayersimError(f"params.yaml: {key} has {shown(name)}, a file rather than a task name; move the file "
                            f"into user_data/, declare a task on it (user_tasks: {{{stem}: {{train: user_data/{file}, "
                            f"validation_fraction: 0.2}}}}; docs/params.md) and list {stem!r} in {key}.")
    known_name(key, name, "task", get_task, known_tasks(), " (or a task of your own files, declared under "
                                                           "user_tasks: docs/params.md)", entry=True)


def weights(name: str) -> str:
    """What identifies a model's weights: its hub id when it has one, so that a registry name and the hub
    id it stands for count as the same model."""
    spec = get_model(name)
    return spec.hub_id or spec.name


def check_models(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise fail(key, value, "a list of model names (registry names or owner/name hub ids)")
    for name in value:
        check_model(key, name, entry=True)
    same = repeated([weights(name) for name in value])
    if same is not None:
        raise fail(key, value, f"a list without repeated models ({same!r} is given twice)")
    return tuple(value)
