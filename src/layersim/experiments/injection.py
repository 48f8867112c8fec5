"""Layer injection (Ren et al. 2023 §4.5): feed one model's mapped last-layer representation to
another model's fine-tuned head and measure the task score.

The representation is the last-layer state of the token the target's head reads (CLS for encoders, the last
non-pad token for decoders and XLNet), which is all that head reads, so a copy of the head
(:func:`layersim.models.task_heads.injection_head`) applied to the vectors gives exactly the logits of the model
run with that state replaced, without running its encoder; a first-token head that cannot be copied runs inside
the model with the state replaced by a hook (:func:`layersim.models.encoders.inject_first_token`).
"""

from __future__ import annotations

import numpy as np
import torch

from layersim.data.batching import EncodedTask
from layersim.errors import LayersimError
from layersim.compute.device import to_device
from layersim.data.batching import in_table_order, length_sorted_batches
from layersim.models.encoders import inject_first_token
from layersim.models.task_heads import injection_head
from layersim.data.tasks import TaskSpec
from layersim.experiments.truncation import primary_score


@torch.inference_mode()
def injected_logits(model, vectors: np.ndarray, num_choices: int, batch_size: int, device: torch.device,
                    encoded: EncodedTask | None = None, tokenizer=None) -> np.ndarray:
    """`model`'s logits with its last-layer head-token state (CLS; a decoder's last token) replaced by `vectors`
    (one per (example, choice) row, in table order), (examples, num_choices) for multiple choice: its head on
    them where the head can be copied (:func:`~layersim.models.task_heads.injection_head`), else the model run on
    `encoded` with the first token's state replaced inside it (DeBERTa-v2, DistilBERT, MPNet, XLM-R, ModernBERT)."""
    head = injection_head(model)
    if head is not None:
        return head_logits(head, vectors, num_choices, model.config.hidden_size, batch_size, device)
    if encoded is None or tokenizer is None:
        raise LayersimError(f"the head of this {model.config.model_type!r} model runs inside it; layer injection "
                            "needs the encoded examples and the tokenizer to run it.")
    model.eval()
    batches = list(length_sorted_batches(encoded, batch_size, tokenizer, with_labels=False))
    order = np.concatenate([indices for indices, _ in batches])  # the hook consumes rows in batch order
    rows = np.asarray(vectors, dtype=np.float32).reshape(len(encoded), num_choices, -1)[order]
    parts = []
    with inject_first_token(model, rows.reshape(len(order) * num_choices, -1)):
        for indices, batch in batches:
            parts.append((indices, model(**to_device(batch, device)).logits.float().cpu().numpy()))
    return in_table_order(parts, len(encoded))


@torch.inference_mode()
def head_logits(head: torch.nn.Module, vectors: np.ndarray, num_choices: int, hidden: int, batch_size: int,
                device: torch.device) -> np.ndarray:
    """`head` (a task head reading the first token's state, e.g. :func:`own_head`) applied to `vectors`."""
    head = head.to(device).eval()
    vectors = torch.as_tensor(np.asarray(vectors, dtype=np.float32))
    if vectors.ndim != 2 or vectors.shape[1] != hidden or len(vectors) % num_choices:
        raise LayersimError(f"injected vectors have shape {tuple(vectors.shape)}; valid shape is (rows, {hidden}) "
                            f"with one row per (example, choice), {num_choices} choice(s) per example.")
    logits = torch.cat([head(part.to(device)).float().cpu() for part in vectors.split(batch_size * num_choices)])
    return (logits.view(-1, num_choices) if num_choices > 1 else logits).numpy()


def injected_score(model, spec: TaskSpec, encoded: EncodedTask, vectors: np.ndarray, batch_size: int,
                   device: torch.device, tokenizer=None) -> float:
    """The task score of `model` with its last-layer head-token state replaced by `vectors` (one per
    (example, choice) row of `encoded`, in order); `tokenizer` for a head that runs inside the model."""
    if len(vectors) != len(encoded) * encoded.num_choices:
        raise LayersimError(f"{len(vectors)} vectors were given to inject for {len(encoded)} examples with "
                            f"{encoded.num_choices} choice(s) each; give one vector per (example, choice) row.")
    return primary_score(spec, injected_logits(model, vectors, encoded.num_choices, batch_size, device, encoded,
                                               tokenizer), encoded.labels)


def head_score(head: torch.nn.Module, spec: TaskSpec, encoded: EncodedTask, vectors: np.ndarray, batch_size: int,
               device: torch.device) -> float:
    """The task score of `head` on `vectors` (one per (example, choice) row of `encoded`): e.g. Ren's "Random
    Embe." baseline, a pretrained model's state through a randomly initialised head."""
    hidden = np.asarray(vectors).shape[-1]
    return primary_score(spec, head_logits(head, vectors, encoded.num_choices, hidden, batch_size, device),
                         encoded.labels)


def random_like(train: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """Random representations with the per-dimension mean and spread of `train` (the baseline that
    carries no information about the input)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, train.shape[1])) * train.std(axis=0) + train.mean(axis=0)).astype(np.float32)
