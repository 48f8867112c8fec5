"""Task metrics and prediction over a validation set."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from sklearn import metrics as skm
from tqdm.auto import tqdm

from layersim.data.batching import EncodedTask, in_table_order, length_sorted_batches
from layersim.compute.device import autocast, to_device
from layersim.errors import LayersimError
from layersim.data.tasks import TaskSpec


def _pearson(labels, predictions) -> float:
    return _correlation(stats.pearsonr, labels, predictions)


def _spearman(labels, predictions) -> float:
    return _correlation(stats.spearmanr, labels, predictions)


def _correlation(statistic, labels, predictions) -> float:
    # A constant prediction (e.g. a model exiting at the embeddings) has no correlation with
    # anything; report 0 rather than NaN, without scipy's warning.
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    value = statistic(predictions, labels)[0]
    return float(value) if np.isfinite(value) else 0.0


METRICS = {
    "accuracy": lambda y, p: float(skm.accuracy_score(y, p)),
    "f1": lambda y, p: float(skm.f1_score(y, p, zero_division=0.0)),
    "mcc": lambda y, p: float(skm.matthews_corrcoef(y, p)),
    "pearson": _pearson,
    "spearman": _spearman,
}


def predictions_from_logits(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """Class index (or regression value) per example from the head's outputs."""
    if spec.regression:
        return logits.reshape(-1)
    return logits.argmax(axis=-1)


def compute_metrics(spec: TaskSpec, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every metric of the task, in percent-free [0, 1] / [-1, 1] units as scikit-learn reports them."""
    return prediction_metrics(spec, predictions_from_logits(spec, logits), labels)


def prediction_metrics(spec: TaskSpec, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every metric of the task for `predictions` (:func:`predictions_from_logits`) of `labels`."""
    unknown = [m for m in spec.metrics if m not in METRICS]
    if unknown:
        raise LayersimError(f"task {spec.name!r} asks for unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}.")
    return {name: METRICS[name](labels, predictions) for name in spec.metrics}


@torch.inference_mode()
def predict(model, encoded: EncodedTask, tokenizer, batch_size: int, device: torch.device,
            progress: bool = False, precision: str = "fp32") -> np.ndarray:
    """Logits of a task model over every example, in table order (run in batches of similar length)."""
    model.eval()
    outputs = []
    batches = length_sorted_batches(encoded, batch_size, tokenizer, with_labels=False)
    for indices, batch in tqdm(batches, total=-(-len(encoded) // batch_size), desc="evaluate",
                               disable=not progress, leave=False):
        with autocast(device, precision):
            outputs.append((indices, model(**to_device(batch, device)).logits.float().cpu().numpy()))
    return in_table_order(outputs, len(encoded))


def score(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int,
          device: torch.device, precision: str = "fp32") -> dict[str, float]:
    """Every metric of `spec` for `model` on `encoded`."""
    return compute_metrics(spec, predict(model, encoded, tokenizer, batch_size, device, precision=precision),
                           encoded.labels)
