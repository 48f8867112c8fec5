"""Output heads trained on cached first-token (CLS / <s>) representations of one layer: the Tuned and
TunedOrig variants of Phang et al. §4, where only the output head is trained on top of a frozen
(truncated) encoder.

Every task head of the registry reads only the first token, so a head trains from the CLS
activation tables that the extract stage writes, with no encoder run. Two kinds of head:

- the task model's own head (layersim.models.task_heads.own_head): Tuned continues training the fine-tuned
  model's head on layer k's states; TunedOrig trains the head that fine-tuning starts from (the
  pretrained pooler where there is one, a seeded random classifier) on the pretrained model's layer k;
- a fresh head (``truncate.head: fresh``): dense → tanh → dropout → linear on standardised states,
  the shape shared by BERT's pooler + classifier and RoBERTa's classification head.

Training sees every train row it is given, streamed from the table a few row groups at a time in a
seeded random order, and stops early on a held-out share of the train examples (never the
validation split), keeping the epoch with the lowest held-out loss (epoch 0, the starting head, included;
the loss, not the metric: a metric stuck at the majority class for a few epochs would stop training early). Multiple choice scores each (example,
choice) row and takes a softmax over the choices; regression has one output trained with squared error.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from layersim.errors import LayersimError
from layersim.data.io import ActivationTable
from layersim.compute.linalg import Standardizer
from layersim.data.tasks import TaskSpec
from layersim.compute.training_steps import GradientSteps

log = logging.getLogger("layersim")

HEAD_KINDS = ("own", "fresh")


@dataclass(frozen=True)
class HeadParams:
    epochs: int = 20                 # at most; early stopping may end sooner
    learning_rate: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.0
    dropout: float = 0.1             # the fresh head's
    holdout: float = 0.0             # share of train examples held out for early stopping (0: none)
    patience: int = 3                # epochs without a better held-out score before stopping
    chunk_rows: int = 65536          # rows read from a table at a time
    device: torch.device = torch.device("cpu")  # where the head trains (layersim.compute.device)


class Head(nn.Module):
    """The fresh head: dense → tanh → dropout → linear."""

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(x)))))


class Standardized(nn.Module):
    """A module applied to ``(x - mean) / scale``, with the statistics of its training rows."""

    def __init__(self, module: nn.Module, mean: np.ndarray, scale: np.ndarray):
        super().__init__()
        self.module = module
        self.register_buffer("mean", torch.from_numpy(np.asarray(mean, np.float32)))
        self.register_buffer("scale", torch.from_numpy(np.asarray(scale, np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module((x - self.mean) / self.scale)


@dataclass
class TrainedHead:
    """A head (raw first-token states → outputs) and what training it did."""

    head: nn.Module
    num_choices: int
    epochs_run: int = 0
    best_epoch: int = 0
    held_out_loss: float | None = None

    @torch.inference_mode()
    def logits(self, features: np.ndarray) -> np.ndarray:
        """Logits shaped like the task model's: (n, labels), (n, 1) for regression, (n, choices)."""
        self.head.eval()
        device = next(self.head.parameters()).device
        out = self.head(torch.from_numpy(np.require(features, np.float32, "W")).to(device))  # tables' arrays are read-only
        if self.num_choices > 1:
            out = out.view(-1, self.num_choices)
        return out.cpu().numpy()


class Rows:
    """Train rows of one layer, in whole examples (`num_choices` rows each), read chunk by chunk.

    From an array (all in one chunk) or from layer k of an activation table, whose row groups are read
    a few at a time in a random order (memory: one chunk, not the table)."""

    def __init__(self, num_choices: int, array: np.ndarray | None = None,
                 table: ActivationTable | None = None, layer: int = 0, chunk_rows: int = 65536):
        self.num_choices = num_choices
        self._array, self._table, self._layer, self._chunk_rows = array, table, layer, chunk_rows
        self.num_rows = len(array) if array is not None else table.num_rows
        self.hidden_size = array.shape[1] if array is not None else table.hidden_size
        self._whole: np.ndarray | None = None  # the layer of a table read in one chunk, read once

    def chunks(self, rng: np.random.Generator | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(example indices, their rows as (examples, choices, hidden) float32); a random chunk order
        with `rng`, table order without."""
        if self._array is not None:
            yield np.arange(self.num_rows // self.num_choices), self._by_example(self._array, 0)
            return
        groups = self._table.row_groups()
        order = rng.permutation(len(groups)) if rng is not None else np.arange(len(groups))
        per_chunk = max(1, self._chunk_rows // max(1, int(np.median([n for _, n in groups]))))
        for at in range(0, len(order), per_chunk):
            picked = sorted(order[at:at + per_chunk].tolist())
            rows = np.concatenate([np.arange(groups[g][0], groups[g][0] + groups[g][1]) for g in picked])
            yield rows[::self.num_choices] // self.num_choices, self._by_example(self._read(picked, len(groups)),
                                                                                 int(rows[0]))

    def _read(self, picked: list[int], num_groups: int) -> np.ndarray:
        """Layer k of the row groups `picked`, from the table; when they are all of its row groups (a table that
        fits in one chunk: every epoch reads all of it) read once and kept."""
        if len(picked) < num_groups:
            return self._table.layer_of_row_groups(self._layer, picked)
        if self._whole is None:
            self._whole = self._table.layer_of_row_groups(self._layer, picked)
        return self._whole

    def _by_example(self, array: np.ndarray, first_row: int) -> np.ndarray:
        if len(array) % self.num_choices or first_row % self.num_choices:
            raise LayersimError(f"{len(array)} rows from row {first_row} are not whole examples of "
                                f"{self.num_choices} choices; re-run the extract stage.")
        return np.asarray(array, np.float32).reshape(len(array) // self.num_choices, self.num_choices, -1)


def fresh_head(spec: TaskSpec, rows: Rows, is_train: np.ndarray, params: HeadParams, seed: int) -> nn.Module:
    """A seeded fresh head on states standardised with the statistics of the train examples' rows
    (`is_train`: one flag per example)."""
    scaler = Standardizer().fit_batches(x[is_train[index]].reshape(-1, rows.hidden_size)
                                        for index, x in rows.chunks())
    torch.manual_seed(seed)
    return Standardized(Head(rows.hidden_size, spec.num_labels, params.dropout), scaler.mean_, scaler.scale_)


def held_out_examples(num_examples: int, share: float, seed: int) -> np.ndarray:
    """A seeded random `share` of the example indices 0..num_examples-1 (at least one when share > 0,
    never all), sorted."""
    if share <= 0 or num_examples < 2:
        return np.zeros(0, np.int64)
    count = min(num_examples - 1, max(1, round(share * num_examples)))
    return np.sort(np.random.default_rng([seed, 7]).choice(num_examples, count, replace=False))


def train_head(spec: TaskSpec, features: np.ndarray | Rows, labels: np.ndarray, params: HeadParams, seed: int,
               head: nn.Module | None = None, what: str = "a fresh head") -> TrainedHead:
    """Train `head` (default: a fresh one) on `features` — a (rows, hidden) array or :class:`Rows` —
    with one label per example. For multiple choice, rows are (example, choice) in example order."""
    num_choices = spec.num_choices if spec.format == "multiple_choice" else 1
    rows = features if isinstance(features, Rows) else Rows(num_choices, np.asarray(features, np.float32))
    labels = np.asarray(labels)
    if rows.num_rows != len(labels) * num_choices:
        raise LayersimError(f"{rows.num_rows} feature rows do not match {len(labels)} labels × {num_choices} "
                            f"choices for task {spec.name!r}.")
    held = held_out_examples(len(labels), params.holdout, seed)
    is_train = np.ones(len(labels), bool)
    is_train[held] = False
    device = params.device
    if head is None:
        head = fresh_head(spec, rows, is_train, params, seed)  # seeds torch's generator, which dropout draws from
    else:  # a given head (Tuned: the fine-tuned one) draws its dropout from torch's generator too: seeded alike
        torch.manual_seed(seed)
    head = head.to(device)
    held_x = _gather(rows, ~is_train).to(device)
    y = torch.from_numpy(labels.astype(np.float32 if spec.regression else np.int64)).to(device)
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=params.learning_rate, weight_decay=params.weight_decay)
    loss_fn = nn.MSELoss() if spec.regression else nn.CrossEntropyLoss()
    steps = GradientSteps(optimizer, total=params.epochs, device=device)
    # The starting head is a candidate too: for Tuned on the last layer it is already the fine-tuned head.
    held_y = y[torch.from_numpy(held).to(device)]
    best = (_loss(head, held_x, held_y, loss_fn, spec), 0, copy.deepcopy(head.state_dict())) \
        if len(held) else (np.inf, 0, None)  # loss, epoch, state
    started = time.perf_counter()
    epoch = 0
    for epoch in range(1, params.epochs + 1):
        if epoch == 2:
            _estimate(params.epochs, time.perf_counter() - started, spec.name, what)
        head.train()
        for index, x in rows.chunks(rng):
            keep = is_train[index]
            x, target = torch.from_numpy(x[keep]).to(device), y[torch.from_numpy(index[keep]).to(device)]
            for batch in torch.randperm(len(x), generator=generator).split(params.batch_size):
                steps.take(_example_loss(head(x[batch]), target[batch], loss_fn, spec), epoch)
        bad_epoch = steps.diverged_at(epoch)
        if bad_epoch is not None:
            raise LayersimError(f"training {what} for task {spec.name!r}: the loss became NaN or infinite in "
                                f"epoch {bad_epoch}; lower truncate.head_learning_rate (now "
                                f"{params.learning_rate:g}).")
        if not len(held):
            continue
        loss = _loss(head, held_x, held_y, loss_fn, spec)
        if loss < best[0]:
            best = (loss, epoch, copy.deepcopy(head.state_dict()))
        elif epoch - best[1] >= params.patience:
            break
    if best[2] is not None:
        head.load_state_dict(best[2])
    return TrainedHead(head, num_choices, epochs_run=epoch, best_epoch=best[1] if best[2] is not None else epoch,
                       held_out_loss=None if best[2] is None else float(best[0]))


def _gather(rows: Rows, chosen: np.ndarray) -> torch.Tensor:
    """The rows of the examples flagged in `chosen` (one flag per example), in example order, as an
    (examples, choices, hidden) tensor."""
    parts = [x[chosen[index]] for index, x in rows.chunks()] if chosen.any() else []
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros((0, rows.num_choices, rows.hidden_size),
                                                                         np.float32))


@torch.inference_mode()
def _loss(head: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, spec: TaskSpec) -> float:
    """The training loss of `head` on held-out examples (x: examples × choices × hidden), dropout off."""
    head.eval()
    return float(_example_loss(head(x), y, loss_fn, spec))


def _example_loss(out: torch.Tensor, y: torch.Tensor, loss_fn, spec: TaskSpec) -> torch.Tensor:
    """The loss of (examples, choices, outputs) head outputs against one target per example: squared
    error for regression, cross-entropy over the labels or, for multiple choice, over the choices."""
    return loss_fn(out.view(-1), y) if spec.regression else loss_fn(out.view(len(out), -1), y)


def _estimate(epochs: int, first_epoch_seconds: float, task: str, what: str) -> None:
    """Say how long the requested epochs will take, when it is long enough to wonder."""
    total = epochs * first_epoch_seconds
    if total > 60:
        log.info("training %s for %s: at most %d epochs at %.2f s each, about %.0f min in all "
                 "(truncate.head_epochs)", what, task, epochs, first_epoch_seconds, total / 60)


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
