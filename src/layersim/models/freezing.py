"""Freezing the bottom or top k layers of an encoder or decoder during fine-tuning (Wu et al. 2020, Table 1),
on the layer stacks of :mod:`layersim.models.layer_stacks`; the backward FLOPs that freezing saves are counted
in :mod:`layersim.compute.flops`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from layersim.compute.flops import frozen_range
from layersim.models.encoders import _swapped_stack
from layersim.models.layer_stacks import describe_architecture


def embedding_modules(model: nn.Module) -> list[nn.Module]:
    """What turns tokens and positions into the first layer's input: the embeddings (GPT-2: token and
    position tables), ELECTRA's and ALBERT's projection to the hidden size, and the relative-position tables
    every layer reads (DeBERTa-v2's rel_embeddings and their norm, MPNet's attention bias); for a model found
    by the generic rule, its input embeddings."""
    stack = describe_architecture(model)
    return stack.embedding_modules() + stack.shared_tables()


def layer_modules(model: nn.Module, index: int) -> list[nn.Module]:
    """The modules whose weights belong to 0-based layer `index`: the layer, and for layer 0 what the owner
    applies to its output only (DeBERTa-v2's conv)."""
    stack = describe_architecture(model)
    extra = stack.family.after_first
    found = [stack.module_for(index)]
    if index == 0 and extra and isinstance(getattr(stack.owner, extra, None), nn.Module):
        found.append(getattr(stack.owner, extra))
    return found


class _FrozenApplication(nn.Module):
    """One application of a shared layer group whose weights receive no gradient from it: the group runs
    on detached copies of its parameters, so gradients flow through it to the layers below but do not
    update it (used for ALBERT, whose layers share one group)."""

    def __init__(self, group: nn.Module):
        super().__init__()
        self.__dict__["group"] = group  # not registered: the group's parameters stay where they are

    def forward(self, *args, **kwargs):
        import torch

        detached = {name: value.detach() for name, value in self.group.named_parameters()}
        return torch.func.functional_call(self.group, detached, args, kwargs)


@contextlib.contextmanager
def frozen_layers(model: nn.Module, side: str, k: int) -> Iterator[nn.Module]:
    """Within the context, training leaves the bottom or top `k` transformer layers unchanged (Wu et al.
    2020, Table 1); with the bottom ones, the embeddings (and any projection to the hidden size) too.
    Gradients still flow through frozen top layers to the layers below.

    Every family but ALBERT: the frozen modules get ``requires_grad = False`` (restored on exit). ALBERT has
    one layer group applied at every depth, so a layer cannot be frozen by itself: here "freezing layer i"
    means that its application of the shared group contributes no gradient to the group's weights, which
    are updated only by the unfrozen applications (and stay unchanged when all are frozen)."""
    stack = describe_architecture(model)
    frozen = frozen_range(stack.num_layers, side, k)
    modules = embedding_modules(model) if side == "bottom" and frozen else []
    if not stack.shared:
        modules += [m for i in frozen for m in layer_modules(model, i)]
    parameters = [p for module in modules for p in module.parameters()]
    before = [p.requires_grad for p in parameters]
    try:
        for p in parameters:
            p.requires_grad_(False)
        if stack.shared and frozen:
            with _swapped_stack(stack, list(range(stack.num_layers)),
                                wrap=lambda i, group: _FrozenApplication(group) if i in frozen else group):
                yield model
        else:
            yield model
    finally:
        for p, flag in zip(parameters, before):
            p.requires_grad_(flag)
