"""The params values in a stage's command line, filled in by the stage after validation, never by a shell.

dvc.yaml's commands run in a shell, and DVC writes `${...}` values into them before any stage code runs, also
under `dvc repro -s` and `--downstream`, which skip the check_params gate. So the commands carry placeholders
instead, `@model`, `@task`, `@method` and `@seed`, which no shell changes; the stage's argument parser
(:func:`layersim.cli.parser`) replaces them with validated values: `@model` with params.yaml's `model`, `@task`
and `@seed` with the matrix item being run, found by matching the stage name that DVC passes every command in
the environment (``DVC_STAGE``, e.g. ``finetune@rte-1``) against the validated tasks and seeds, joined as DVC
names matrix items (docs/params-safety.md).
"""

from __future__ import annotations

import re

from layersim.data.run_environment import STAGE_ENV
from layersim.errors import LayersimError
from layersim.params.schema import Params

PLACEHOLDER = re.compile(r"@(model|task|method|seed)\b")


def has_placeholders(argv: list[str]) -> bool:
    return any(PLACEHOLDER.search(arg) for arg in argv)


def fill_placeholders(argv: list[str], params: Params, stage: str | None) -> list[str]:
    """`argv` with each placeholder replaced by its validated value; `stage` is DVC_STAGE (None: unset)."""
    used = {match.group(1) for arg in argv for match in PLACEHOLDER.finditer(arg)}
    if not used:
        return list(argv)
    values = {"model": params.model}
    if used & {"task", "method", "seed"}:
        values.update(matrix_item(stage, params, with_seed="seed" in used, with_method="method" in used))
    return [PLACEHOLDER.sub(lambda match: str(values[match.group(1)]), arg) for arg in argv]


def matrix_item(stage: str | None, params: Params, *, with_seed: bool, with_method: bool = False) -> dict:
    """The matrix item {task[, method][, seed]} whose DVC name ends `stage` (`<stage>@<task>`,
    `<stage>@<task>-<seed>` or, for a method of finetune.compare_methods, `<stage>@<task>-<method>-<seed>`)."""
    axes = ["task"] + ["method"] * with_method + ["seed"] * with_seed
    wanted = " and ".join(f"@{axis}" for axis in axes)
    if not stage or "@" not in stage:
        raise LayersimError(f"the command names its matrix item as {wanted}, which DVC fills in through the "
                            f"{STAGE_ENV} environment variable ({stage or 'unset'} here); run it as "
                            "`dvc repro -s <stage>@<item>`, or by hand with the "
                            f"{', '.join(axes)} in place of {wanted}.")
    key = stage.rpartition("@")[2]
    items = [{"task": task} for task in params.tasks]
    if with_method:
        items = [item | {"method": method} for item in items for method in params.finetune.compare_methods]
    if with_seed:
        items = [item | {"seed": seed} for item in items for seed in params.seeds]
    found = [item for item in items if "-".join(str(value) for value in item.values()) == key]
    if len(found) != 1:
        names = ", ".join("-".join(str(value) for value in item.values()) for item in items[:12])
        raise LayersimError(f"{STAGE_ENV} = {stage!r} names no single matrix item of params.yaml's "
                            f"{', '.join(axes)} (items: {names or 'none'}{' …' if len(items) > 12 else ''}); "
                            "run `dvc repro` again after editing params.yaml so that DVC regenerates its stages.")
    return found[0]
