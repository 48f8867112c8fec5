"""Layer injection (Ren et al. 2023 §4.5): feed one model's mapped last-layer representation to
another model's fine-tuned head and measure the task score.

The representation is the first token's (CLS) last-layer state, which is what every supported head
reads (see :func:`layersim.encoders.inject_first_token`); the rest of the target model runs as is.
"""

from __future__ import annotations

import numpy as np
import torch

from layersim.batching import EncodedTask
from layersim.encoders import inject_first_token
from layersim.tasks import TaskSpec
from layersim.truncation import full_score


def injected_score(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, vectors: np.ndarray, batch_size: int,
                   device: torch.device) -> float:
    """The task score of `model` with its last-layer CLS state replaced by `vectors` (one per
    (example, choice) row of `encoded`, in order)."""
    with inject_first_token(model, torch.tensor(np.asarray(vectors, dtype=np.float32))):
        return full_score(model, spec, encoded, tokenizer, batch_size, device)


def random_like(train: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """Random representations with the per-dimension mean and spread of `train` (the baseline that
    carries no information about the input)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, train.shape[1])) * train.std(axis=0) + train.mean(axis=0)).astype(np.float32)
