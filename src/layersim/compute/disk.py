"""What a stage will write, before it writes it: the bytes of activation tables from their row counts, and a refusal
in one sentence when the volume has not that much free (issue 53: the paper configuration's training tables alone
are hundreds of GB; a full disk found after hours of work is the worst way to learn it)."""

from __future__ import annotations

import shutil
from pathlib import Path

from layersim.errors import LayersimError

FLOAT32 = 4
# DVC's default cache type copies an output into .dvc/cache where the filesystem has no reflinks, so the bytes are
# written twice; `dvc cache dir` on another volume, or cache.type hardlink/symlink, avoids that (docs/performance.md).
CACHE_COPIES = 2


def table_bytes(rows: int, layers: int, hidden: int) -> int:
    """Bytes of one activation table: float32 rows of every layer (the embeddings included), without Parquet's
    compression, which float activations barely have."""
    return rows * (layers + 1) * hidden * FLOAT32


def gigabytes(size: float) -> str:
    return f"{size / 1e9:,.1f} GB"


def check_free_space(folder: Path, needed: int, task: str) -> None:
    """Refuse before any work when the volume of `folder` has less free space than `needed` bytes (the extract
    stage's tables of `task` and DVC's cache copy of them)."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise LayersimError(f"extract of {task} would write about {gigabytes(needed)} of activation tables (with DVC's "
                            f"cache copy) but the volume of {folder} has {gigabytes(free)} free; lower "
                            "extract.max_train_examples (the train tables feed truncate's heads and align's maps), free "
                            "space, or put DVC's cache on another volume (`dvc cache dir`).")


def train_poolings(params, head: str) -> list[str]:
    """The poolings extract writes train tables in: the token the model's head reads (truncate's heads) and
    align.pooling (align's maps), among extract.poolings; words are validation points only."""
    return [q for q in params.extract.poolings if q in (head, params.align.pooling)]


def extract_bytes(params, spec, rows: dict[str, int], runs: int, head: str, shape: dict[str, int]) -> int:
    """What the extract stage writes for one task, with DVC's cache copy: per run (ORIG, each seed, the RANDOM
    control) a validation table per pooling (at most extract.max_tokens word rows for "tokens"), and per trained or
    pretrained run a train table in the poolings that truncate's heads (`head`) and align's maps read. `rows`: the
    examples of each split (times the choices of a multiple-choice task)."""
    p, choices = params.extract, spec.num_choices or 1
    per_example = [q for q in p.poolings if q != "tokens"]
    validation = runs * (rows["validation"] * choices * len(per_example) + p.max_tokens * ("tokens" in p.poolings))
    trained = runs - (params.similarity.random_control is not None)  # the control has validation tables only
    train = trained * rows["train"] * choices * len(train_poolings(params, head))
    return CACHE_COPIES * table_bytes(validation + train, shape["num_layers"], shape["hidden_size"])
