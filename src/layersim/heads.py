"""Fresh task heads trained on cached layer representations: the Tuned and TunedOrig variants of
Phang et al. §4, where only the output head is trained on top of a frozen (truncated) encoder.

Every head in the registry reads only the first token (CLS / <s>), so a head can be trained from
the CLS activation tables that the extract stage writes, with no encoder run. The head is the
shape shared by BERT's pooler + classifier and RoBERTa's classification head: dense → tanh →
dropout → linear. Multiple choice scores each (example, choice) row and takes a softmax over the
choices; regression has one output trained with squared error.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from layersim.training_steps import GradientSteps
from layersim.errors import LayersimError
from layersim.linalg import Standardizer
from layersim.tasks import TaskSpec

log = logging.getLogger("layersim")


@dataclass(frozen=True)
class HeadParams:
    epochs: int = 20
    learning_rate: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.0
    dropout: float = 0.1


class Head(nn.Module):
    def __init__(self, hidden_size: int, num_outputs: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(x)))))


@dataclass
class TrainedHead:
    """A head and the train-row standardisation it was fitted with."""

    head: Head
    mean: torch.Tensor
    scale: torch.Tensor
    num_choices: int

    @torch.inference_mode()
    def logits(self, features: np.ndarray) -> np.ndarray:
        """Logits shaped like the task model's: (n, labels), (n, 1) for regression, (n, choices)."""
        self.head.eval()
        x = (torch.from_numpy(np.asarray(features, np.float32)) - self.mean) / self.scale
        out = self.head(x)
        if self.num_choices > 1:
            out = out.view(-1, self.num_choices)
        return out.numpy()


def train_head(spec: TaskSpec, features: np.ndarray, labels: np.ndarray, params: HeadParams,
               seed: int) -> TrainedHead:
    """Fit a fresh head on (rows, hidden) `features`. For multiple choice, rows are (example,
    choice) in example order and `labels` holds one label per example."""
    num_choices = spec.num_choices if spec.format == "multiple_choice" else 1
    if len(features) != len(labels) * num_choices:
        raise LayersimError(f"{len(features)} feature rows do not match {len(labels)} labels × {num_choices} "
                            f"choices for task {spec.name!r}.")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    scaler = Standardizer().fit(features)
    mean, scale = (torch.from_numpy(v.astype(np.float32)) for v in (scaler.mean_, scaler.scale_))
    x = torch.from_numpy(scaler.transform(features).astype(np.float32)).view(len(labels), num_choices, -1)
    y = torch.from_numpy(np.asarray(labels, np.float32 if spec.regression else np.int64))
    head = Head(x.shape[-1], spec.num_labels, params.dropout)
    optimizer = torch.optim.AdamW(head.parameters(), lr=params.learning_rate, weight_decay=params.weight_decay)
    loss_fn = nn.MSELoss() if spec.regression else nn.CrossEntropyLoss()
    head.train()
    steps = GradientSteps(optimizer, total=params.epochs)
    started = time.perf_counter()
    for epoch in range(params.epochs):
        if epoch == 1:
            _estimate(params.epochs, time.perf_counter() - started, spec.name)
        for batch in torch.randperm(len(labels), generator=generator).split(params.batch_size):
            out = head(x[batch])  # (batch, choices, outputs)
            if spec.regression:
                loss = loss_fn(out.view(-1), y[batch])
            elif num_choices > 1:
                loss = loss_fn(out.view(len(batch), num_choices), y[batch])
            else:
                loss = loss_fn(out.view(len(batch), -1), y[batch])
            steps.take(loss, epoch + 1)
        bad_epoch = steps.diverged_at(epoch + 1)
        if bad_epoch is not None:
            raise LayersimError(f"training a fresh head for task {spec.name!r}: the loss became NaN or infinite in "
                                f"epoch {bad_epoch}; lower truncate.head_learning_rate (now "
                                f"{params.learning_rate:g}).")
    return TrainedHead(head, mean, scale, num_choices)


def _estimate(epochs: int, first_epoch_seconds: float, task: str) -> None:
    """Say how long the requested epochs will take, when it is long enough to wonder."""
    total = epochs * first_epoch_seconds
    if total > 60:
        log.info("training a fresh head for %s: %d epochs at %.2f s each, about %.0f min in all "
                 "(truncate.head_epochs)", task, epochs, first_epoch_seconds, total / 60)


def majority_baseline(spec: TaskSpec, train_labels: np.ndarray, validation_labels: np.ndarray) -> np.ndarray:
    """Logits that always predict the most frequent training class (Phang's red dotted line);
    for regression, the training mean; for multiple choice, the most frequent answer position."""
    n = len(validation_labels)
    if spec.regression:
        return np.full((n, 1), float(np.mean(train_labels)))
    width = spec.num_choices if spec.format == "multiple_choice" else spec.num_labels
    logits = np.zeros((n, width))
    logits[:, np.bincount(np.asarray(train_labels, np.int64), minlength=width).argmax()] = 1.0
    return logits
