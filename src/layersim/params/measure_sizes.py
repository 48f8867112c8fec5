"""Measures against the sizes params fix: refused before any stage works (the check_params stage)."""

from __future__ import annotations

from layersim.errors import LayersimError
from layersim.params import MODEL_HIDDEN_SIZE, Params
from layersim.similarity import check_computable
from layersim.data.tasks import get_task


def check_measure_sizes(params: Params) -> None:
    """Refuse a measure that cannot run on the sizes the similarity stage will see, where params fix them:
    the model's width, and at most this many rows per task for the per-example poolings (the built-in
    tasks' size, or extract.max_examples), times the choices of a multiple-choice task.

    Not part of :func:`layersim.params.parse_params`: it needs the measures' code, on which the stages that
    only read params must not depend. The check_params stage runs it before any other stage (dvc.yaml)."""
    model, download, extract, similarity = params.model, params.download, params.extract, params.similarity
    width = MODEL_HIDDEN_SIZE.get(model)
    if width is None:
        return
    for task in params.tasks:
        spec = get_task(task)
        generated = spec.hub is None and spec.user is None
        known = [size for size in (extract.max_examples, download.generated_validation_examples if generated else None)
                 if size is not None]
        if not known:
            continue
        rows = min(known) * max(1, spec.num_choices)
        for pooling, measures in similarity.measures.items():
            for measure in measures if pooling != "tokens" else ():
                try:
                    check_computable(measure, rows, width)
                except LayersimError as err:
                    raise LayersimError(f"params.yaml: similarity.measures.{pooling} has {measure!r}, which cannot run "
                                        f"on task {task!r} with model {model!r}: {err}") from None
