"""Extraction: every layer's representation of every validation example, pooled, into activation
tables (DESIGN.md, "Activation table")."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from layersim.batching import EncodedTask, sequential_batches, to_device
from layersim.errors import LayersimError
from layersim.io import ActivationWriter
from layersim.tasks import TaskSpec


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(rows, length, hidden) → (rows, hidden): the first token (CLS, or <s> for RoBERTa), or the
    mean over non-padding tokens."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
    raise LayersimError(f"unknown pooling {pooling!r}; valid poolings are: cls, mean.")


@torch.inference_mode()
def extract_activations(encoder, tokenizer, spec: TaskSpec, encoded: EncodedTask, outputs: dict[str, Path],
                        metadata: dict, batch_size: int, device: torch.device) -> None:
    """Run `encoder` over `encoded` and write one activation table per pooling in `outputs`.

    Multiple-choice examples give one row per (example, choice).
    """
    encoder.eval().to(device)
    config = encoder.config
    num_layers, hidden_size = config.num_hidden_layers, config.hidden_size
    with contextlib.ExitStack() as stack:
        # Every table appears under its final name only if the whole extraction succeeds.
        writers = {pooling: stack.enter_context(ActivationWriter(
            path, num_layers=num_layers, hidden_size=hidden_size, label_type=spec.label_type,
            metadata={**metadata, "pooling": pooling})) for pooling, path in outputs.items()}
        batches = sequential_batches(encoded, batch_size, tokenizer)
        for indices, batch in tqdm(batches, total=-(-len(encoded) // batch_size), desc=f"extract {metadata['run']}",
                                   mininterval=2):
            batch.pop("labels")
            labels = encoded.labels[indices]
            choices = encoded.num_choices
            # Flatten (batch, choices, length) so that every (example, choice) is one row.
            batch = {k: v.reshape(-1, v.shape[-1]) for k, v in to_device(batch, device).items()}
            hidden_states = encoder(**batch, output_hidden_states=True).hidden_states
            if len(hidden_states) != num_layers + 1:
                raise LayersimError(f"the encoder returned {len(hidden_states)} hidden states, "
                                    f"expected {num_layers + 1}.")
            example_id = np.repeat(encoded.example_id[indices], choices)
            choice = np.tile(np.arange(choices, dtype=np.int16), len(indices))
            row_labels = np.repeat(labels, choices)
            for pooling, writer in writers.items():
                layers = [pool(h, batch["attention_mask"], pooling).float().cpu().numpy() for h in hidden_states]
                writer.write(example_id, choice, row_labels, layers)
