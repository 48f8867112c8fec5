"""layersim: how fine-tuning changes the layers of transformer encoders.

The library's packages, by role, lowest layer first (a lower one never imports a higher one;
docs/architecture.md walks each stage through them):

0. ``layersim.errors``, ``layersim.compute`` — the error type; linear algebra, devices, the optimiser step.
1. ``layersim.similarity``, ``layersim.align`` — pure math on arrays: measures, nulls, intervals, maps.
2. ``layersim.models`` — the model registry, loading, and running an encoder layer by layer.
3. ``layersim.data`` — tasks, word points, batches and the Parquet tables between stages.
4. ``layersim.params`` — params.yaml: every key declared and checked once; the hub lock.
5. ``layersim.training`` — fine-tuning, evaluation, the convergence check, probe heads.
6. ``layersim.reporting`` — figures, headline metrics and the report page.
7. ``layersim.experiments`` — one orchestration module per pipeline stage.
8. ``layersim.cli`` — what every stage script shares: params, logging, errors as one line.
"""

__version__ = "0.1.0"
