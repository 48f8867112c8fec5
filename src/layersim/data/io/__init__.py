"""Atomic writers and checked readers for the tables, JSON and figures passed between stages, by concern:

- :mod:`~layersim.data.io.atomic` — atomic writes (temporary, fsync, rename) of files and folders, JSON, PNG;
- :mod:`~layersim.data.io.parquet` — Parquet with layersim's metadata, a finished-writer row count, and the
  checked reader (page CRCs, schema, expected metadata), every failure one line;
- :mod:`~layersim.data.io.activations`, :mod:`~layersim.data.io.attention` — the activation and attention tables;
- :mod:`~layersim.data.io.stored` — how their values are stored (float32, or float16 scaled per column), decoded;
- :mod:`~layersim.data.io.task_tables` — the task tables, their digest, and what the runs' tables must hold;
- :mod:`~layersim.data.layout` — where each task's and run's files lie (re-exported here).
"""

from layersim.data.io.activations import ActivationTable, ActivationWriter, activation_schema, layer_column
from layersim.data.io.atomic import _HOST, atomic_path, remove_stale_temporaries, write_figure, write_json  # noqa: F401
from layersim.data.io.attention import AttentionTable
from layersim.data.io.parquet import (INTEGRITY_KEY, METADATA_KEY, first_non_finite, table_metadata, with_metadata,
                                      write_parquet)
from layersim.data.io.task_tables import read_task_table, run_expectations, task_tables_digest
from layersim.data.layout import (FinetunedRun, finetune_metrics, finetuned, finetuned_runs, stage_details, stage_metrics,
                                  task_tables)

__all__ = ["INTEGRITY_KEY", "METADATA_KEY", "ActivationTable", "ActivationWriter", "AttentionTable", "activation_schema",
           "FinetunedRun", "atomic_path", "finetune_metrics", "finetuned", "finetuned_runs", "first_non_finite", "layer_column", "read_task_table", "remove_stale_temporaries",
           "run_expectations", "stage_details", "stage_metrics", "table_metadata", "task_tables", "task_tables_digest", "with_metadata", "write_figure", "write_json",
           "write_parquet"]
