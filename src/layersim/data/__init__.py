"""Data and tasks: the task registry (paper, generated and user tasks), word points, tokenised batches
and the Parquet tables that pass between stages."""
