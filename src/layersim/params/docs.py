"""docs/params.md, generated from the declarations in :mod:`layersim.params.schema`."""

from __future__ import annotations

import dataclasses

from layersim.params.schema import SECTIONS


def _default(value) -> str:
    if dataclasses.is_dataclass(value):  # a sub-section (finetune.lora): its own table follows
        return "{" + ", ".join(f"{spec.name}: {_default(getattr(value, spec.name))}"
                               for spec in dataclasses.fields(value)) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_default(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _accepts(spec: dataclasses.Field) -> str:
    meta, annotation = spec.metadata, str(spec.type)
    names = meta.get("names")
    if meta.get("check") is not None:
        return "see the doc"
    if annotation == "bool":
        return "true or false"
    if names is not None:
        listed = names()[0] if callable(names) else names
        return ("one of " if annotation == "str" else "a list from ") + ", ".join(listed)
    kind = "number" if annotation.startswith("float") else "integer"
    says = [bound.says.format(kind=kind) for bound in meta.get("bounds", ())]
    text = "; ".join(says) if says else f"a {kind}"
    return text + ("; or null" if "None" in annotation else "")


def _table(cls: type) -> list[str]:
    lines = ["| key | default | accepts | what it does |", "|---|---|---|---|"]
    for spec in dataclasses.fields(cls):
        default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
        doc = spec.metadata["doc"].replace("|", "\\|")
        lines.append(f"| `{spec.name}` | `{_default(default)}` | {_accepts(spec)} | {doc} |")
    return lines + [""]


def describe() -> str:
    """Markdown: one table per section, one row per key (default, what it accepts, what it does)."""
    lines = ["# params.yaml keys", "",
             "Generated from `src/layersim/params/schema.py` by `python -m layersim.params > docs/params.md`; "
             "a test keeps it current. `model`, `tasks`, `seeds` and `device` are described in params.yaml itself.", ""]
    for name, cls in SECTIONS.items():
        lines += [f"## {name}", "", *_table(cls)]
        for spec in dataclasses.fields(cls):  # sub-sections, e.g. finetune.lora
            if dataclasses.is_dataclass(spec.default):
                lines += [f"## {name}.{spec.name}", "", *_table(type(spec.default))]
    from layersim.params.user_tasks import UserTaskParams

    lines += ["## user_tasks.`<name>`", "",
              "Tasks on your own files, each under a name of its own (1 to 64 of a-z, 0-9, _ and -) to list in "
              "`tasks`, e.g. `user_tasks: {reviews: {train: user_data/reviews.csv, validation_fraction: 0.2, "
              "text: [review], label: stars}}`. The files live in `user_data/`, a dependency of download_task. Or on a "
              "hub dataset, read from its Parquet export like the paper tasks and locked in layersim.lock: "
              "`{imdb: {dataset: stanfordnlp/imdb, config: plain_text, splits: {train: train, validation: test}, "
              "text: [text], label: label, label_names: [neg, pos]}}`.", ""]
    lines += _table(UserTaskParams)
    return "\n".join(lines)
