"""Task tables (data/tasks/<task>/splits/{train,validation}.parquet): the checked reader, their digest, and what the
activation tables of a task's runs must hold (weights, task tables and shape, from the checkpoints)."""


import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError
from layersim.data.tasks import subsample
from layersim.data.io.parquet import ParquetReader, first_non_finite
from layersim.data.layout import FinetunedRun


def run_expectations(checkpoints: str | os.PathLike, runs, task_dir: str | os.PathLike | None = None
                     ) -> dict[str, dict[str, Any]]:
    """Run name → the metadata its activation tables must hold, from the fine-tuned checkpoints of `runs`
    (layersim.data.layout.FinetunedRun; or seeds: finetune.method's runs) in ``checkpoints`` (each verified against
    its files): the digest of the weights they were extracted from ("orig": the pretrained weights the runs were
    fine-tuned from), the digest of the task tables, and the model's num_layers and hidden_size. With `task_dir`,
    the checkpoints must have been fine-tuned on the task tables it holds now (a table edited by hand and one
    stage re-run alone would mix versions)."""
    from layersim.models.registry import model_shape, verified_info

    now = task_tables_digest(task_dir) if task_dir is not None else None
    expect, bases, tasks = {}, {}, {}
    for entry in runs:
        found = entry if isinstance(entry, FinetunedRun) else FinetunedRun("", entry)
        folder, run = found.folder(checkpoints), found.name
        info = verified_info(folder)
        bases[run], tasks[run] = info.get("base_digest"), info.get("task_digest")
        if now is not None and tasks[run] != now:
            raise LayersimError(f"checkpoint {folder} was fine-tuned on other task tables than {task_dir} holds now "
                                f"(digest {str(tasks[run])[:12]}, now {now[:12]}); re-run the finetune stage.")
        expect[run] = {"model_digest": info.get("digest"), "task_digest": tasks[run], **model_shape(folder)}
    for what, values in (("pretrained weights", bases), ("task tables", tasks)):
        if len(set(values.values())) > 1:
            raise LayersimError(f"the checkpoints in {checkpoints} were fine-tuned from different {what} "
                                f"({', '.join(f'{run}: {str(d)[:12]}' for run, d in values.items())}), expected "
                                "one; re-run the finetune stage.")
    first = next(iter(expect.values()))
    expect["orig"] = {**first, "model_digest": next(iter(bases.values()))}
    return expect


# --- task tables -------------------------------------------------------------------------------

def task_tables_digest(folder: str | os.PathLike) -> str:
    """SHA-256 over a task folder's tables (train and validation, names and bytes): recorded by finetune
    and extract, and checked by every stage after them against the tables they read."""
    import hashlib

    from layersim.models.registry import file_digest

    digest = hashlib.sha256()
    for split in ("train", "validation"):
        path = Path(folder) / f"{split}.parquet"
        if not path.is_file():
            raise LayersimError(f"task table {path} does not exist; run the download_task stage first.")
        digest.update(f"{split}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def read_task_table(folder: str | os.PathLike, task, split: str, max_examples: int | None = None) -> pa.Table:
    """The normalized `split` table of `task` (a TaskSpec) from a download folder, checked; at most
    `max_examples` rows, the same seeded choice for every stage that asks."""
    path = Path(folder) / f"{split}.parquet"
    if not path.is_file():
        raise LayersimError(f"task table {path} does not exist; run the download_task stage for {task.name!r} first.")
    reader = ParquetReader(path, "task table", "download_task")
    meta = reader.metadata
    if meta.get("task") != task.name or meta.get("split") != split:
        raise LayersimError(f"{path} holds task {meta.get('task')!r} split {meta.get('split')!r}, "
                            f"expected task {task.name!r} split {split!r}; re-run the download_task stage.")
    text = {name: pa.list_(pa.string()) if name == "choices" else pa.string() for name in task.text_columns}
    # cluster_id: which examples share a text (layersim.data.tasks.spec.cluster_ids); a table written before it
    # existed is refused here with the advice to re-run download_task.
    reader.check_types({"example_id": pa.int64(), "cluster_id": pa.int64(), **text, "label": task.label_type},
                       f" for task {task.name!r}")
    table = reader.read(reader.schema.names)
    for name in table.column_names:
        if table.column(name).null_count:
            raise LayersimError(f"task table {path} column {name} has {table.column(name).null_count} missing "
                                "values, expected none; re-run the download_task stage.")
    ids = table.column("example_id").to_numpy()
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        raise LayersimError(f"task table {path} holds example_id {int(unique[counts > 1][0])} more than once, "
                            "expected unique ids; re-run the download_task stage.")
    row = first_non_finite(table.column("label").to_numpy())
    if row is not None:
        raise LayersimError(f"task table {path} holds a non-finite label at example_id {int(ids[row])}, expected a "
                            "number; re-run the download_task stage.")
    return subsample(table, max_examples, seed=0)
