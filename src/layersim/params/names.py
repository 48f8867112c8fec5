"""Names in params.yaml that come from a registry: the model, the tasks, compare.models."""

from __future__ import annotations

import difflib
import re
from typing import Any

from layersim.errors import LayersimError
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
    close = difflib.get_close_matches(value, list(valid), n=1) if isinstance(value, str) else []
    mean = f" (did you mean {close[0]!r}?)" if close else ""
    what = f"{key} has {shown(value)}, which" if entry else f"{key} = {shown(value)}"
    raise LayersimError(f"params.yaml: {what} is not a known {kind}{mean}; valid {kind}s are: "
                        f"{', '.join(compact(valid))}{hint}.")


def compact(names) -> list[str]:
    """Sorted names, a numbered family of three or more (multiberts-0 … multiberts-24) written as its range."""
    numbered: dict[str, list[int]] = {}
    for name in names:
        match = re.fullmatch(r"(.*-)([0-9]+)", name)
        if match:
            numbered.setdefault(match.group(1), []).append(int(match.group(2)))
    families = {prefix: sorted(n) for prefix, n in numbered.items() if len(n) >= 3}
    shown_names = [name for name in names if not any(name.startswith(p) and name[len(p):].isdigit() for p in families)]
    shown_names += [f"{p}{n[0]} … {p}{n[-1]}" for p, n in families.items()]
    return sorted(shown_names)


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
