"""The activation tables the similarity stage reads, and the layers, matrices and nulls it builds from them: shared by
the similarity stage and the grounding stage (which recomputes every run's matrices for its tests)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from layersim.data.io import ActivationTable, AttentionTable, run_expectations
from layersim.errors import LayersimError
from layersim.data.layout import run_labels as finetuned_labels_of
from layersim.models.random_control import RANDOM_RUN, random_run_metadata
from layersim.similarity.comparisons import (RANDOM, moments_stacked_matrix, moments_stacked_null, stacked_matrix,
                                             stacked_null, stream_layers, stream_rows, streamed_moments)
from layersim.similarity.inference.exchangeability import (STREAMED_SAMPLE_ROWS, block_permutations, example_sample,
                                                           unmovable)
from layersim.similarity.moments import LayerMoments
from layersim.similarity.registry import check_computable


def run_labels(runs, random_control: int | None = None) -> dict[str, str]:
    """Run name in the activation folder → label in figures (`runs`: seeds, or layersim.data.layout.FinetunedRun):
    ORIG, FT[i] for finetune.method's i-th seed (as in Phang), e.g. LoRA[i] for a compared method's; with
    `random_control` (its init seed), the random-init control last."""
    labels = {"orig": "ORIG"} | finetuned_labels_of(runs)
    return labels if random_control is None else labels | {RANDOM_RUN: RANDOM}


def run_metadata(checkpoints: Path, runs, random_control: int | None = None) -> dict[str, dict]:
    """Run name → the metadata its activation tables must hold (layersim.data.io.run_expectations), the random-init
    control's (layersim.models.registry.random_run_metadata) included when `random_control` is its seed."""
    known = run_expectations(checkpoints, runs)  # the weights the tables must come from
    if random_control is not None:
        known[RANDOM_RUN] = random_run_metadata(known["orig"], random_control)
    return known


def layer_sources(tables: dict, labels: dict, measures, options, log=lambda *args: None):
    """(`matrix_of(measure)`, `layers()`, `streamed_null(measure, cells, permutations, seed)`) over the runs'
    stacked layers: every measure from moments streamed from the tables in row batches (one pass for all) when
    that takes less memory (then `layers` is None and `streamed_null` gives the nulls the moments determine),
    otherwise every measure on the layers, read once (and `streamed_null` is None)."""
    widths = [table.hidden_size for table in tables.values() for _ in range(table.num_layers + 1)]
    num_rows = next(iter(tables.values())).num_rows
    streamed = stream_layers(measures, num_rows, widths)
    models, moments, matrices = {}, [], {}

    def layers():
        if not models:
            models.update({labels[run]: table.layers() for run, table in tables.items()})
        return models

    def accumulated():
        if not moments:
            rows = stream_rows(widths)
            log("streaming the layers' moments from the activation tables, %d rows at a time", rows)
            batches = zip(*(table.iter_batches(rows) for table in tables.values()))
            gathered = streamed_moments(tqdm(batches, total=-(-num_rows // rows), desc="moments", mininterval=2))
            moments.extend([gathered, LayerMoments(gathered)])  # the second keeps each layer's basis for reuse
        return moments

    def matrix_of(measure):
        if not streamed:
            return stacked_matrix(measure, layers(), **options.get(measure, {}))
        if measure not in matrices:
            sums, bases = accumulated()
            matrices[measure] = moments_stacked_matrix(measure, sums, moments=bases, **options.get(measure, {}))
        return matrices[measure]

    groups = next(iter(tables.values())).cluster_id  # the null's blocks: clusters of examples sharing a text
    sample = {}

    def examples(seed):
        """A random sample of whole examples in memory: a block null needs the rows (exchangeability module)."""
        if not sample:
            rows = example_sample(groups, STREAMED_SAMPLE_ROWS, seed)
            log("block nulls from a sample of %d rows of whole clusters of examples", len(rows))
            sample.update(rows=rows, models={labels[run]: _rows_of(table, rows) for run, table in tables.items()})
        return sample["rows"], sample["models"]

    def streamed_null(measure, cells, permutations, seed):
        if not block_permutations(num_rows, groups).plain:  # rows of one cluster: whole clusters, from a sample
            rows, models = examples(seed)
            if unmovable(len(rows), groups[rows]):
                return None
            return stacked_null(measure, models, permutations=permutations, seed=seed, cells=cells,
                                groups=groups[rows], **options.get(measure, {}))
        sums, bases = accumulated()
        return moments_stacked_null(measure, sums, cells, permutations=permutations, seed=seed,
                                    observed=matrix_of(measure), moments=bases, **options.get(measure, {}))

    return (matrix_of, layers, None) if not streamed else (matrix_of, None, streamed_null)


def _rows_of(table: ActivationTable, rows: np.ndarray) -> list[np.ndarray]:
    """Every layer of the table at the given (sorted) rows, read one batch at a time."""
    parts, start = [], 0
    for batch in table.iter_batches():
        chosen = rows[(rows >= start) & (rows < start + len(batch[0]))] - start
        parts.append([layer[chosen] for layer in batch])
        start += len(batch[0])
    return [np.concatenate(layer) for layer in zip(*parts)]


def pooling_tables(activations: Path, task: str, pooling: str, labels: dict[str, str], known: dict[str, dict],
                   measures: Sequence[str]) -> dict[str, ActivationTable]:
    """Each run's activation table of one pooling (run name → table), checked against the metadata `known` gives
    (:func:`run_metadata`) and against ORIG's rows, and every measure checked computable on their sizes: all before
    any work (e.g. mixedsim needs more examples than neurons)."""
    tables = {run: ActivationTable(activations / f"{run}.{pooling}.parquet", expect={
                  "task": task, "split": "validation", "run": run, "pooling": pooling, **known[run]})
              for run in labels}
    for table in tables.values():
        tables["orig"].check_comparable(table)
    for measure in measures:
        check_computable(measure, tables["orig"].num_rows, tables["orig"].hidden_size)
    return tables


def attention_inputs(activations: Path, task: str, labels: dict[str, str], known: dict[str, dict],
                     poolings: Sequence[str]) -> tuple[dict[str, AttentionTable], np.ndarray]:
    """Each run's attention table (run name → table, checked against the metadata `known` gives and against ORIG's
    pairs) and each attention example's cluster (its ``(example, choice)`` maps in table order; the choices of an
    example share its cluster): the activation tables' ``cluster_id`` of its example_id, read from ORIG's tables of
    `poolings`, for the attention null's blocks (layersim.similarity.inference.attention_null). An example in none
    of them is its own cluster when the task declares no shared text; otherwise LayersimError, before any work."""
    tables = {run: AttentionTable(activations / "attention" / f"{run}.parquet",
                                  expect={"task": task, "split": "validation", "run": run,
                                          "model_digest": known[run]["model_digest"]})
              for run in labels}
    for table in tables.values():
        tables["orig"].check_comparable(table)
    cluster_of, shared = {}, None
    for pooling in poolings:
        table = ActivationTable(activations / f"orig.{pooling}.parquet", expect={
            "task": task, "split": "validation", "run": "orig", "pooling": pooling, **known["orig"]})
        cluster_of.update(zip(table.example_id.tolist(), table.cluster_id.tolist()))
        shared = shared or table.metadata.get("shared")
    examples = tables["orig"].map_examples
    missing = sorted({e for e in examples.tolist() if e not in cluster_of})
    if missing and shared:
        raise LayersimError(f"attention example {missing[0]} (and {len(missing) - 1} more) is in no activation table "
                            f"of {', '.join(poolings)}, so the attention null cannot tell which examples share their "
                            f"{shared}; set extract.max_examples to at least extract.attention_examples or add a "
                            "per-example pooling (cls, head, mean) to similarity.measures.")
    ids = max(cluster_of.values(), default=-1) + 1  # an unknown example: a cluster of its own, past every known id
    return tables, np.array([cluster_of.get(e, ids + e) for e in examples.tolist()], dtype=np.int64)
