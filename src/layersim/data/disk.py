"""What a stage will write, before it writes it: the bytes of activation tables from their row counts, and a refusal
in one sentence when the volume has not that much free (issue 53: the paper configuration's training tables alone
are hundreds of GB; a full disk found after hours of work is the worst way to learn it)."""

from __future__ import annotations

import configparser
import math
import shutil
from pathlib import Path


from layersim.data.io.stored import BYTES_PER_VALUE, table_encoding
from layersim.errors import LayersimError

# DVC's default cache type copies an output into .dvc/cache where the filesystem has no reflinks, so the bytes are
# written twice; `dvc cache dir` on another volume, or cache.type hardlink/symlink, avoids that (docs/performance.md).
CACHE_COPIES = 2
DVC_DEFAULT_CACHE_TYPES = ("reflink", "copy")
# An attention row's keys besides its floats (stored in extract.table_precision, as the activations are): example_id
# (int64), choice, query, key (int16 each), which Parquet dictionary-encodes (data/io/parquet.py: every column but the
# floats). A map's rows run over (query, key) with its example and choice fixed, and each query over its keys, so
# example_id, choice and query are runs that RLE stores in a few bytes a map or a query; the key column is left: a
# dictionary index a row, of the bits that the longest input's units need (assumption: the index's bit-packed width,
# before Snappy, which shrinks the repeating 0..n-1 sequences further). The 14 bytes a row of the plain int types
# were 54 % of the tiny pipeline's attention rows (3 layers × 2 heads × 2 bytes) and put its extract 31 % too high.
ATTENTION_PLAIN_KEY_BYTES = 8 + 3 * 2


def cache_copies(types: str | None, reflinks: bool = False) -> int:
    """How many times an output's bytes are on disk, workspace and DVC cache together, for DVC's `cache.type`
    (a comma-separated list, tried in order; None: DVC's default reflink,copy): 2 where the first type that
    applies copies, 1 for hardlink or symlink (the workspace file is the cached one) or a reflink (blocks shared).
    Reflinks apply only on filesystems that have them (XFS, Btrfs, APFS; not ext4): `reflinks` says so."""
    for kind in [k.strip() for k in types.split(",")] if types else DVC_DEFAULT_CACHE_TYPES:
        if kind in ("hardlink", "symlink"):
            return 1
        if kind in ("reflink", "copy"):  # a reflink where the filesystem has none is a copy (measured on ext4)
            return 1 if kind == "reflink" and reflinks else CACHE_COPIES
    return CACHE_COPIES


def table_bytes(rows: int, layers: int, hidden: int, precision: str = "float32") -> int:
    """Bytes of one activation table: rows of every layer (the embeddings included) stored in `precision` (an
    encoding of layersim.data.io.stored: float32, float16, int24), without Parquet's compression, which float
    activations barely have (the scales in the footer: a few bytes a neuron and row group, not counted)."""
    return rows * (layers + 1) * hidden * BYTES_PER_VALUE[precision]


def gigabytes(size: float) -> str:
    return f"{size / 1e9:,.1f} GB"


def cache_types(root: Path | None) -> str | None:
    """DVC's cache.type as the project's .dvc/config and .dvc/config.local set it (None: DVC's default, or no
    project)."""
    found = None
    for name in ("config", "config.local") if root is not None else ():
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read(Path(root) / ".dvc" / name)
        except configparser.Error:
            continue
        found = parser.get("cache", "type", fallback=found)
    return found


def project_root(path: Path) -> Path | None:
    """The DVC project that holds `path`: its nearest folder with a .dvc folder (None: none does)."""
    return next((folder for folder in [Path(path).resolve(), *Path(path).resolve().parents]
                 if (folder / ".dvc").is_dir()), None)


def project_copies(root: Path | None, reflinks: bool = False) -> int:
    """:func:`cache_copies` for the project at `root`, as its DVC config sets cache.type: the one rule that the plan
    and the extract stage's own check both apply."""
    return cache_copies(cache_types(root), reflinks)


def check_free_space(folder: Path, tables: int, task: str) -> None:
    """Refuse before any work when the volume of `folder` has less free space than the extract stage's tables of
    `task` (`tables` bytes in the workspace) and, where the project's cache.type copies, DVC's cache copy of them."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    copies = project_copies(project_root(probe))
    needed, free = tables * copies, shutil.disk_usage(probe).free
    if needed > free:
        cache = " (with DVC's cache copy)" if copies > 1 else ""
        link = ", link DVC's cache (`dvc config cache.type hardlink,symlink`)" if copies > 1 else ""
        raise LayersimError(f"extract of {task} would write about {gigabytes(needed)} of activation tables{cache} "
                            f"but the volume of {folder} has {gigabytes(free)} free; lower extract.max_train_examples "
                            "(the train tables feed truncate's heads and align's maps), free space, or put DVC's cache "
                            f"on another volume (`dvc cache dir`){link}.")


def train_poolings(params, head: str) -> list[str]:
    """The poolings extract writes train tables in: the token the model's head reads (truncate's heads) and
    align.pooling (align's maps), among extract.poolings; words are validation points only."""
    return [q for q in params.extract.poolings if q in (head, params.align.pooling)]


def extract_rows_by_pooling(params, spec, rows: dict[str, int], runs: int, head: str) -> dict[str, int]:
    """The table rows the extract stage writes for one task, per pooling (its tables' encoding follows the pooling:
    layersim.data.io.stored.table_encoding): per run (ORIG, each seed, the RANDOM control) a validation table per
    pooling (extract.max_tokens word rows for "tokens", or fewer when `rows["words"]`, the validation split's words,
    says so), and per trained or pretrained run a train table in the poolings that truncate's heads (`head`) and
    align's maps read. `rows`: the examples of each split (times the choices of a multiple-choice task)."""
    p, choices = params.extract, spec.num_choices or 1
    words = min(p.max_tokens, rows.get("words", p.max_tokens))
    found = {q: runs * (words if q == "tokens" else rows["validation"] * choices) for q in p.poolings}
    trained = runs - validation_only_runs(params)  # the control and compared methods' runs: validation tables only
    for q in train_poolings(params, head):
        found[q] += trained * rows["train"] * choices
    return found


def extract_rows(params, spec, rows: dict[str, int], runs: int, head: str) -> int:
    """The table rows the extract stage writes for one task, every pooling's (:func:`extract_rows_by_pooling`)."""
    return sum(extract_rows_by_pooling(params, spec, rows, runs, head).values())


def extract_runs(params) -> int:
    """The runs extract writes tables of, per task: ORIG, every fine-tuned run (finetune.compare_methods' too) and
    the random-init controls (similarity.random_control, random_controls of them)."""
    return 1 + len(params.seeds) * (1 + len(params.finetune.compare_methods)) + _controls(params)


def validation_only_runs(params) -> int:
    """Runs of :func:`extract_runs` with validation tables only (for similarity): the random-init control and the
    runs of finetune.compare_methods."""
    return _controls(params) + len(params.seeds) * len(params.finetune.compare_methods)


def _controls(params) -> int:
    """The random-init controls extract writes tables of (validation only)."""
    s = params.similarity
    return 0 if s.random_control is None else s.random_controls


def extract_bytes(params, spec, rows: dict[str, int], runs: int, head: str, shape: dict[str, int]) -> int:
    """What the extract stage writes for one task (:func:`extract_rows`) in the workspace (DVC's cache copy, where
    cache.type copies, is :func:`project_copies`' business)."""
    return sum(table_bytes(count, shape["num_layers"], shape["hidden_size"],
                           table_encoding(params.extract.table_precision, pooling))
               for pooling, count in extract_rows_by_pooling(params, spec, rows, runs, head).items())


def attention_key_bytes(max_units: int) -> float:
    """An attention row's key bytes as Parquet writes them (see ATTENTION_PLAIN_KEY_BYTES): the key column's dictionary
    index, ⌈log2 max_units⌉ bits (at least 1), for maps of at most `max_units` words or tokens; the other keys are runs."""
    return max(1, math.ceil(math.log2(max(max_units, 2)))) / 8


def attention_bytes(maps: int, square_units: float, layers: int, heads: int, precision: str = "float32",
                    max_units: int = 512) -> int:
    """The attention tables of `maps` inputs (examples times choices, over runs) whose number of words or tokens has
    the mean square `square_units` (a map holds a row per (query, key): the square of its length, so the mean of the
    squares counts, not the square of the mean): every layer's heads as extract.table_precision `precision` stores
    attention tables (floats barely compress), and the
    row's keys, dictionary-encoded (:func:`attention_key_bytes`; `max_units`: the longest input's units, at most
    finetune.max_length tokens)."""
    row = layers * heads * BYTES_PER_VALUE[table_encoding(precision, "attention")] + attention_key_bytes(max_units)
    return round(maps * square_units * row)
