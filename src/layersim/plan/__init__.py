"""What a params.yaml will cost before anything runs (issue 53): per stage the rows, the bytes written (workspace and
DVC cache, given the cache type), the FLOPs and an estimated time on a stated device, and the total.
`python -m layersim.plan` prints it; the arithmetic of each stage is :mod:`layersim.plan.stages`, what the plan knows
of tasks and models before they are downloaded :mod:`layersim.plan.sizes`."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from layersim.data import disk
from layersim.data.tasks import get_task
from layersim.errors import LayersimError
from layersim.models.model_files import LOCAL_PREFIX
from layersim.params.model_kind import own_head_pooling
from layersim.plan import stages
from layersim.plan.sizes import model_size, task_size
from layersim.plan.cost import StageCost
from layersim.plan.timing import GPUS, Device, device, dvc_seconds, known_seconds, seconds, terms, where  # noqa: F401 (the plan's API)

ORDER = ("check_params", "download", "finetune", "finetune_compared", "finetune_pretrained", "extract", "similarity", "grounding", "compare",
         "truncate", "skip", "export", "align", "freeze", "weights", "dynamics", "summary",
         "report")


def plan(params, root: Path = Path(".")) -> list[StageCost]:
    """Every stage's cost (summed over its matrix items) for `params` in the project at `root`."""
    return [total_of(name, items) for name, items in plan_items(params, root).items()]


def total_of(stage: str, items: list[StageCost]) -> StageCost:
    """One stage's matrix items summed (the first item's notes: every item of a stage notes the same)."""
    whole = StageCost(stage, notes=items[0].notes)
    for item in items:
        whole.add(item)
    return whole


def plan_items(params, root: Path = Path(".")) -> dict[str, list[StageCost]]:
    """Each stage's matrix items (what `layersim launch` runs as separate tasks: a task, or a task and seed), by stage,
    in :data:`ORDER`; stages without a matrix are one item."""
    model = model_size(params.model, root)
    sizes = {name: task_size(params, name, root) for name in params.tasks}
    named = list(params.compare.models) + stages.paired_models(params)
    others = {name: model_size(name, root) for name in named}
    head = own_head_pooling(params.model)
    items: dict[str, list[StageCost]] = {"download": [stages.download(params, model, sizes, others)]}
    for name, task in sizes.items():
        spec = get_task(name)
        runs = [stages.finetune(params, model, task, 1) for _ in params.seeds]  # finetune@task-seed: one item a seed
        compared = [replace(stages.finetune(params, model, task, len(params.finetune.compare_methods)),
                            stage="finetune_compared") for _ in params.seeds] if params.finetune.compare_methods else []
        per_task = [*runs, *compared,
                    stages.extract(params, spec, model, task, head), stages.similarity(params, model, task),
                    stages.grounding(params, model, task),
                    stages.truncate(params, model, task, spec.num_labels), stages.skip(params, model, task),
                    stages.export(params, model, task), stages.align(params, model, task),
                    stages.freeze(params, model, task), stages.weights(params, model, task),
                    stages.dynamics(params, model, task)]
        for cost in [replace(c, stage="finetune_pretrained") for c in _pretrained(params, others, task)] + per_task:
            items.setdefault(cost.stage, []).append(cost)
    items["compare"] = [stages.compare(params, model, sizes, others)]
    for cost in stages.bookends(params, len(sizes)):
        items.setdefault(cost.stage, []).append(cost)
    return {name: items[name] for name in ORDER if name in items}


def makespan(seconds: list[float], workers: int) -> float:
    """The wall time of independent items of these `seconds` on `workers` (each item on one, longest first, each to the
    least loaded: `layersim launch`'s tasks of one stage in parallel)."""
    loads = [0.0] * max(1, workers)
    for value in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += value
    return max(loads)


def _pretrained(params, others, task) -> list[StageCost]:
    """Each pretraining model's run; the task's one finetune_pretrained process is counted by stages.bookends."""
    return [replace(stages.finetune(params, others[name], task, 1, kept_states=False), processes=0)
            for name in params.align.pretraining_models]


def total(costs: list[StageCost]) -> StageCost:
    whole = StageCost("total")
    for cost in costs:
        whole.add(cost)
    return whole


cache_types = disk.cache_types


def copies(root: Path, reflinks: bool = False) -> int:
    return disk.project_copies(root, reflinks)


def human(value: float, unit: str = "B") -> str:
    """A size or count in the SI prefix that fits it: 573.0 GB, 2.4 PFLOP."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def known_tasks(params, root: Path):
    """`params` with only the tasks whose size the plan knows now: a user task is sized from its downloaded tables,
    so before download_task has run it is left out (an unknown size must not stop a run)."""
    known = []
    for name in params.tasks:
        try:
            task_size(params, name, root)
        except LayersimError:
            continue
        known.append(name)
    return replace(params, tasks=tuple(known))


def written_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`: what earlier runs left in data/."""
    return sum((Path(top) / name).stat().st_size for top, _, files in os.walk(folder) for name in files
               if not (Path(top) / name).is_symlink())


def check_fits(params, root: Path = Path(".")) -> str:
    """Refuse in one sentence, before any stage works, when what the plan for `params` writes into the project at
    `root` (its DVC-cached outputs, and DVC's cache copy of them where cache.type copies) is more than the free space
    of the volume; return what was compared, for the log. Outputs already in data/ are subtracted: a params change
    after a finished run rewrites some of them, not all (extract checks its own tables again before writing). A
    model whose size is known only once downloaded skips the check; so do tasks of unknown size. A local model's
    folder that cannot be read is refused here, before any stage (its config.json broken or missing)."""
    try:
        costs = plan(known_tasks(params, root), root)
    except LayersimError as err:
        if params.model.startswith(LOCAL_PREFIX):  # a local folder is there to read: what fails is the folder
            raise
        return f"the disk plan is skipped: {err}"
    n = copies(root)
    needed = max(0, total(costs).bytes - written_bytes(Path(root) / "data")) * n
    free = shutil.disk_usage(root).free
    copied = " and DVC's copy of them in .dvc/cache" if n > 1 else ""
    said = f"this run's plan writes about {human(needed)} (its outputs{copied})"
    if needed <= free:
        return f"{said}; {human(free)} free"
    link = ", link DVC's cache to the workspace (`dvc config cache.type hardlink,symlink`)" if n > 1 else ""
    raise LayersimError(f"{said} but the volume of {Path(root).resolve()} has {human(free)} free; shrink it "
                        "with extract.table_precision: float16, extract.max_train_examples or extract.max_examples"
                        f"{link}, or free space (`python -m layersim.plan` shows where the bytes go).")
