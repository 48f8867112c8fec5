"""A task model's own output head, as a function of one layer's first-token state.

Every task head of the supported architectures reads only the first token (CLS / <s>) of the last
hidden state; this is the one place that knows how each one turns it into logits:

- BERT, ALBERT (classification and multiple choice) and RoBERTa (multiple choice): the encoder's
  pooler (dense → tanh), dropout, then the classifier.
- RoBERTa and ELECTRA (classification): their classification head (dropout → dense → tanh / GELU →
  dropout → projection).
- ELECTRA (multiple choice): its sequence summary of the first token (projection, activation,
  dropouts), then the classifier.

:func:`own_head` copies those modules out of a task model, so the copy can be trained on another
layer's states (Phang et al.'s Tuned truncation continues training the fine-tuned head) while the
model stays as it is. Applied to the last layer's first-token states, the copy gives exactly the
model's logits; applied to layer k's, exactly what the model gives when it exits after layer k
(layersim.models.encoders.exit_at), since nothing runs between the last layer and the head.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from layersim.errors import LayersimError


class OwnHead(nn.Module):
    """(rows, hidden) first-token states → (rows, outputs) logits, through a copy of a model's head.
    For multiple choice, rows are (example, choice) pairs and each gives one score."""

    def __init__(self, pool: nn.Module | None, dropout: nn.Module | None, classifier: nn.Module,
                 reads_sequence: bool):
        super().__init__()
        self.pool = pool
        self.dropout = dropout
        self.classifier = classifier
        self.reads_sequence = reads_sequence  # the module indexes [:, 0] of a (batch, tokens, hidden) input

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        x = first_token.unsqueeze(1) if self.reads_sequence else first_token
        if self.pool is not None:
            x = self.pool(x)
        if self.dropout is not None:
            x = self.dropout(x)
        return self.classifier(x)


class _AlbertPooler(nn.Module):
    """ALBERT keeps its pooler's dense layer and activation as two attributes of the encoder."""

    def __init__(self, dense: nn.Module, activation: nn.Module):
        super().__init__()
        self.dense = dense
        self.activation = activation

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(first_token))


# The families whose task head reads only the first token and can be copied (own_head); for the others each exit
# or skipped span runs the model itself (layersim.models.encoders.exit_at / skip_span).
COPYABLE_HEADS = ("albert", "bert", "electra", "roberta")


def has_own_head(model: nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) in COPYABLE_HEADS


def own_head(model: nn.Module) -> OwnHead:
    """A trainable copy of `model`'s task head (see the module docstring). The model is not changed."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    multiple_choice = type(model).__name__.endswith("ForMultipleChoice")
    base = getattr(model, "base_model", None)
    if base is None or not hasattr(model, "classifier"):
        raise LayersimError(f"{type(model).__name__} has no task head to copy; load the model with "
                            "layersim.models.registry.load_task_model.")
    classifier = copy.deepcopy(model.classifier)
    if model_type in ("bert", "albert") or (model_type == "roberta" and multiple_choice):
        if getattr(base, "pooler", None) is None:
            raise LayersimError(f"{type(model).__name__} was built without its pooler, which its head needs.")
        if model_type == "albert":
            pool = _AlbertPooler(copy.deepcopy(base.pooler), copy.deepcopy(base.pooler_activation))
            return OwnHead(pool, copy.deepcopy(model.dropout), classifier, False)
        # BERT/RoBERTa poolers index [:, 0] of the sequence themselves.
        return OwnHead(copy.deepcopy(base.pooler), copy.deepcopy(model.dropout), classifier, True)
    if model_type in ("roberta", "electra") and not multiple_choice:
        return OwnHead(None, None, classifier, True)
    if model_type == "electra":
        summary = model.sequence_summary
        if getattr(summary, "summary_type", None) != "first":
            raise LayersimError(f"this ELECTRA multiple-choice head summarises the sequence by "
                                f"{getattr(summary, 'summary_type', None)!r}; only 'first' (the config default) "
                                "reads the first token alone.")
        return OwnHead(copy.deepcopy(summary), None, classifier, True)
    raise LayersimError(f"cannot copy the task head of architecture {model_type!r}; supported architectures "
                        f"are: {', '.join(COPYABLE_HEADS)}.")


# Heads that read one token's final state of the last layer with nothing in between: the decoders' sequence
# classification "score" (one linear map of the last non-pad token's state after the final norm, as the tables
# hold a decoder's last layer) and XLNet's summary of its last token then logits_proj. Exact on the last layer
# only (a decoder's earlier layers are not normed), so layer injection uses them and truncation does not.
_LAST_TOKEN_SCORE = ("gpt2", "llama", "mistral", "qwen2")


def injection_head(model: nn.Module) -> OwnHead | None:
    """A copy of the head that turns `model`'s last-layer head-token state into its logits (Ren et al.'s layer
    injection): :func:`own_head` where it can be copied, the decoders' score and XLNet's summary; None for a head
    that must run inside the model (layersim.models.encoders.inject_first_token)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if has_own_head(model):
        return own_head(model)
    if model_type in _LAST_TOKEN_SCORE and isinstance(getattr(model, "score", None), nn.Module):
        return OwnHead(None, None, copy.deepcopy(model.score), False)
    if model_type == "xlnet" and getattr(getattr(model, "sequence_summary", None), "summary_type", None) == "last":
        return OwnHead(copy.deepcopy(model.sequence_summary), None, copy.deepcopy(model.logits_proj), True)
    return None
