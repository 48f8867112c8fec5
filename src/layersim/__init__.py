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

``layersim.compare_models(model_a, model_b, inputs, …)`` compares every layer of two models in one call
(:mod:`layersim.experiments.compare_models`); it is imported on first use, so ``import layersim`` stays light.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # for type checkers and the docs' name check; at run time __getattr__ imports on first use
    from layersim.experiments.compare_models import MeasureComparison, ModelComparison, compare_models

__all__ = ["MeasureComparison", "ModelComparison", "compare_models"]
_LAZY = set(__all__)


def __getattr__(name: str):
    if name in _LAZY:  # torch and transformers load only when the comparison is first asked for
        # By name, not an import statement: no stage uses it, so their dvc.yaml deps need not name it
        # (tests/test_dvc_deps.py reads import statements).
        module = importlib.import_module("layersim.experiments.compare_models")
        return getattr(module, name)
    raise AttributeError(f"module 'layersim' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
