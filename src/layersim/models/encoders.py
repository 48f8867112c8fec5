"""Running a model over a chosen subset of its layers: untuned truncation, layer skipping, smaller copies.

Where each architecture keeps its layers is :mod:`layersim.models.layer_stacks` (the table of the 14
families and the single-list rule for others). Here:

- most families: the owner's ``nn.ModuleList`` is swapped for a list of the kept layers (the same modules);
- ALBERT: ``encoder.albert_layer_groups`` holds only ``num_hidden_groups`` groups, which its loop applies
  ``num_hidden_layers`` times (layer ``i`` uses group ``int(i / (num_hidden_layers / num_hidden_groups))``).
  The weights are shared across depth, so "run fewer layers" means applying the groups fewer times: the
  encoder gets one (shared, not copied) group entry per layer to run and a config view that says so.

Both are made by :func:`run_layers`, a context manager that swaps the stack for the chosen layers and
restores it on exit, even after an exception. Everything else is the model's own forward, unchanged:
embeddings (and any projection to the hidden size), position tables and rotary embeddings, attention masks,
a final norm, and the task head with its own pooling (first token for encoders, last non-pad token for
decoders and XLNet). So a truncated or skipped model is a drop-in model:

    with exit_at(model, k):          # Phang et al. §4: layer k's output into the fine-tuned head
        logits = model(**batch).logits
    with skip_span(model, i, j):     # Phang et al. §4.1: layers i..j (1-based) are skipped
        logits = model(**batch).logits

``exit_at(model, L)`` and ``run_layers(model, range(L))`` are exactly the full model (same modules,
same order, same arithmetic). Inside a context, ``output_hidden_states=True`` gives one state per
layer run plus the initial one (also when no layer runs; with a final norm, the last one is normed, as
transformers does). Inside a context the base model sees a config copy whose depth and ``layer_types``
are those of the layers run, and the kept layers' ``layer_idx`` are renumbered, so a KV cache (``use_cache``)
is consistent: the context computes what :func:`smaller_copy` computes. The contexts are not thread-safe and
do not nest: they change the model object, so use one model per thread.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence

from torch import nn

from layersim.errors import LayersimError
from layersim.models.layer_stacks import (FAMILIES, GENERIC, PER_LAYER_FIELDS, SAVED, SUPPORTED_ARCHITECTURES, LayerStack,
                                          as_int, check_layers, depth_view, describe_architecture, layer_indices,
                                          num_layers, renumber)

__all__ = ["SUPPORTED_ARCHITECTURES", "LayerStack", "all_spans", "continue_from", "describe_architecture",
           "exit_at", "inject_first_token", "last_block_output", "num_layers", "run_layers", "skip_span",
           "smaller_copy"]
_NEST = ("layer selections do not nest; valid use is one run_layers, exit_at, skip_span or frozen_layers context "
         "at a time per model.")


def _install_output_hooks(base_model: nn.Module) -> None:
    """transformers v5 records hidden states through forward hooks that it installs lazily, once, on the
    modules present at the first request. Install them now, on the full stack: installed inside a
    context, the layers left out would never get hooks and later full-model calls would miss states."""
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:  # transformers v4 collects hidden states inside the encoder loop: nothing to do
        return
    maybe_install_capturing_hooks(base_model)


def _initial_state_hook():
    """A forward hook for the module that gives the head's input when no layer runs (exit at 0): the owner of
    the stack, or the final norm where the base model has one (its own hooks fire after the capture ends). In
    v5 the initial hidden state is recorded by the first layer's hook, so with no layer there would be no
    state at all; this records that module's output as hidden_states[0] instead."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # v4: the encoder itself returns the single initial state
        return None

    def hook(module, args, output):
        collected = _active_collector.get()
        if not collected or "hidden_states" not in collected or collected["hidden_states"]:
            return
        selection = collected.get("_hidden_states_layers")
        collected["hidden_states"].append(_state(output) if selection is None or 0 in selection else None)

    return hook


def _state(output):
    """The hidden state in a module's output: a tensor, a tuple's first entry or a model output's."""
    if isinstance(output, tuple):
        return output[0]
    return getattr(output, "last_hidden_state", output)


def _empty_stack_forward(hidden_states, *args, return_dict=True, **kwargs):
    """An encoder forward with no layer, for owners whose loop needs at least one (DeBERTa-v2): the input is
    the output and the only hidden state."""
    from transformers.modeling_outputs import BaseModelOutput

    if not return_dict:
        return hidden_states, (hidden_states,)
    return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=(hidden_states,))


@contextlib.contextmanager
def run_layers(model: nn.Module, layers: Sequence[int]) -> Iterator[nn.Module]:
    """Within the context, `model` runs only the transformer layers `layers` (0-based, increasing),
    each with its own fine-tuned weights; yields `model`. Nothing is copied; all is restored on exit."""
    stack = describe_architecture(model)
    with _swapped_stack(stack, check_layers(layers, stack.num_layers)):
        yield model


@contextlib.contextmanager
def _swapped_stack(stack: LayerStack, indices: list[int],
                   wrap: Callable[[int, nn.Module], nn.Module] | None = None) -> Iterator[None]:
    """The owner runs the layers `indices` in order (each module through `wrap(position, module)` if given)
    instead of its own stack, with depth-dependent state made consistent; all restored on exit."""
    base, owner, family = stack.base_model, stack.owner, stack.family
    if SAVED in base.__dict__:
        raise LayersimError(_NEST)
    _install_output_hooks(base)
    entries = [stack.module_for(i) for i in indices]
    numbering = layer_indices(entries)
    view = copy.copy(stack.config)
    depth_view(stack, view, indices)
    if stack.shared:
        # ALBERT's loop steps through num_hidden_groups entries: with one group entry per layer to run, loop
        # step n runs entry n.
        view.num_hidden_groups = max(len(indices), 1)  # never 0: it is a divisor in the loop
    holders = [m for m in {id(m): m for m in (base, owner)}.values() if getattr(m, "config", None) is stack.config]
    # DeBERTa-v2's conv belongs to layer 0's output: off unless layer 0 runs first.
    extra = family.after_first if family.after_first and getattr(owner, family.after_first, None) is not None \
        and (not indices or indices[0] != 0) else None
    saved_extra = getattr(owner, extra) if extra else None
    handle, empty = None, not indices and not family.runs_empty
    try:
        base.__dict__[SAVED] = stack
        for holder in holders:
            holder.config = view  # a private copy: the model's shared config (head, saving) is untouched
        renumber(entries)
        setattr(owner, stack.attribute, nn.ModuleList([wrap(p, e) if wrap else e for p, e in enumerate(entries)]))
        if extra:
            setattr(owner, extra, None)
        if empty:
            owner.forward = _empty_stack_forward  # an instance attribute, removed on exit
        if not entries:
            hook = _initial_state_hook()
            if hook is not None:
                handle = stack.final_state_module().register_forward_hook(hook)
        yield
    finally:
        if handle is not None:
            handle.remove()
        if empty:
            owner.__dict__.pop("forward", None)
        if extra:
            setattr(owner, extra, saved_extra)
        setattr(owner, stack.attribute, stack.modules)
        for module, index in numbering:
            module.layer_idx = index
        for holder in holders:
            holder.config = stack.config
        base.__dict__.pop(SAVED, None)


def exit_at(model: nn.Module, k: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Untuned truncation: run layers 1..k only (k = 0: embeddings only; k = L: the full model)."""
    num = num_layers(model)
    valid = f"0..{num} for this {num}-layer model"
    k = as_int(k, "exit layer", valid)
    if not 0 <= k <= num:
        raise LayersimError(f"exit layer {k} is out of range; valid exit layers are {valid}.")
    return run_layers(model, range(k))


def skip_span(model: nn.Module, i: int, j: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Skip the layers i..j (1-based, inclusive): the state after layer i-1 goes into layer j+1."""
    num = num_layers(model)
    valid = f"1 <= i <= j <= {num} for this {num}-layer model"
    i = as_int(i, "skip span start", valid)
    j = as_int(j, "skip span end", valid)
    if not 1 <= i <= j <= num:
        raise LayersimError(f"skip span ({i}, {j}) is out of range; valid spans satisfy {valid}.")
    # 1-based span i..j is 0-based i-1..j-1: keep 0..i-2 and j..L-1.
    return run_layers(model, [n for n in range(num) if not i - 1 <= n <= j - 1])


class _StartFrom(nn.Module):
    """A stack entry that runs `layer` on a given state instead of the one the encoder passes in."""

    def __init__(self, layer: nn.Module, state):
        super().__init__()
        self.layer, self.state = layer, state

    def forward(self, hidden_states, *args, **kwargs):
        return self.layer(self.state, *args, **kwargs)

    def __getattr__(self, name: str):
        # Loops read per-layer attributes of their entries (ModernBERT: attention_type): the layer's own.
        try:
            return super().__getattr__(name)
        except AttributeError:
            layer = self.__dict__.get("_modules", {}).get("layer")
            if layer is None:
                raise
            return getattr(layer, name)


def continue_from(model: nn.Module, first: int, state) -> contextlib.AbstractContextManager[nn.Module]:
    """Run layers first+1..L (1-based) on `state`, the hidden state of the batch before layer first+1
    (``hidden_states[i - 1]`` of a full forward pass), instead of on the embeddings' output; the rest of
    the forward (masks, head) is the model's own. With ``first = j`` and the state after layer i−1, this
    is :func:`skip_span` (i, j) without recomputing layers 1..i−1, which every span starting at i shares.
    The embeddings still run (cheap) and their output is ignored. `first` must be below L."""
    num = num_layers(model)
    valid = f"0..{num - 1} for this {num}-layer model"
    first = as_int(first, "first layer", valid)
    if not 0 <= first < num:
        raise LayersimError(f"first layer {first} is out of range; valid values are {valid}.")
    stack = describe_architecture(model)
    if stack.family.sequence_first:  # hidden_states are batch-first, the layers' input is not
        state = state.transpose(0, 1)
    return _swapped_stack(stack, list(range(first, num)),
                          wrap=lambda position, layer: _StartFrom(layer, state) if position == 0 else layer)


def _copy_problem(stack: LayerStack, indices: list[int]) -> str | None:
    """Why a checkpoint with only `indices` would not reload as the model that runs them, or None."""
    config, family, keeps_first = stack.config, stack.family, indices[0] == 0
    if stack.shared and int(config.num_hidden_groups) != 1:
        return (f"an ALBERT model with {config.num_hidden_groups} layer groups cannot be made shallower exactly; "
                "valid models have num_hidden_groups = 1 (every albert-*-v2).")
    if family.first_layer_differs and not keeps_first:
        return (f"a {stack.architecture} model builds its layer 0 differently (no attention norm), so a copy without "
                f"it would not reload as the layers {indices}; valid layer lists keep layer 0 (e.g. exit_at's).")
    if family.after_first and getattr(stack.owner, family.after_first, None) is not None and not keeps_first:
        return (f"this {stack.architecture} model adds its {family.after_first!r} module to layer 0's output, which a "
                f"copy without layer 0 would add to another layer; valid layer lists keep layer 0 (e.g. exit_at's).")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) and indices != list(range(len(indices))):
        return (f"this {stack.architecture} model scales attention by 1/(layer index + 1), which a copy would "
                f"recompute from new indices for the layers {indices}; valid layer lists are 0..n-1 (exit_at's).")
    if stack.how == GENERIC:
        lists = sorted(k for k, v in config.to_dict().items() if k not in PER_LAYER_FIELDS
                       and isinstance(v, (list, tuple)) and len(v) == stack.num_layers)
        if lists:
            return (f"the config of this {stack.architecture!r} model has per-layer lists layersim does not know "
                    f"({', '.join(lists)}); valid for smaller copies are the architectures "
                    f"{', '.join(SUPPORTED_ARCHITECTURES)} and models whose per-layer fields are only {PER_LAYER_FIELDS}.")
    return None


def smaller_copy(model: nn.Module, layers: Sequence[int]) -> nn.Module:
    """A new model that runs only `layers` (0-based, increasing, at least one) of `model`, as a model of
    that depth in its own right: the same weights, ``config.num_hidden_layers = len(layers)``, the per-layer
    config fields (``layer_types``) of the kept layers and their ``layer_idx`` renumbered, so that
    ``save_pretrained`` writes an ordinary checkpoint that transformers loads with no layersim code and that
    computes exactly what ``run_layers(model, layers)`` does. ALBERT's shared group is kept once and applied
    len(layers) times (one group only: with several, a shallower stack assigns groups anew). Layer lists that
    a reloaded checkpoint could not reproduce exactly are refused (see _copy_problem)."""
    stack = describe_architecture(model)
    if SAVED in stack.base_model.__dict__:
        raise LayersimError("cannot copy a model inside a layer selection; valid use is outside any run_layers, "
                            "exit_at, skip_span or frozen_layers context.")
    indices = check_layers(layers, stack.num_layers)
    if not indices:
        raise LayersimError(f"a smaller model needs at least one layer; valid layer lists hold 1 to "
                            f"{stack.num_layers} of the layers 0..{stack.num_layers - 1}.")
    problem = _copy_problem(stack, indices)
    if problem:
        raise LayersimError(problem)
    small = copy.deepcopy(model)
    small_stack = describe_architecture(small)
    if not small_stack.shared:
        kept = [small_stack.modules[i] for i in indices]
        renumber(kept)
        setattr(small_stack.owner, small_stack.attribute, nn.ModuleList(kept))
    owner_config = getattr(small_stack.owner, "config", None)
    for config in {id(c): c for c in (small.config, small_stack.config, owner_config) if c is not None}.values():
        depth_view(stack, config, indices)  # the original's per-layer fields, restricted
    return small


def all_spans(num: int) -> list[tuple[int, int]]:
    """Every span (i, j) with 1 <= i <= j <= num, ordered by start, then end."""
    num = as_int(num, "number of layers", "integers >= 0")
    if num < 0:
        raise LayersimError(f"number of layers {num} is negative; valid values are integers >= 0.")
    return [(i, j) for i in range(1, num + 1) for j in range(i, num + 1)]


@contextlib.contextmanager
def inject_first_token(model: nn.Module, vectors) -> Iterator[nn.Module]:
    """Within the context, the last-layer state of the first token (CLS, <s>) that the head reads is
    replaced by the next rows of `vectors` (a (rows, hidden) tensor or array), batch after batch, in order;
    the task head then runs unchanged on it (Ren et al. §4.5 "layer injection").

    Only for heads that read only the first token (BERT/ALBERT pooler, RoBERTa/ELECTRA/DistilBERT/MPNet/
    DeBERTa-v2 heads, ModernBERT with classifier_pooling "cls", multiple-choice heads), where this feeds a
    representation to the head exactly; decoders and XLNet read the last non-pad token and are refused.
    Multiple-choice batches are flattened (example, choice) rows, as in the activation tables. Raises if the
    model runs more rows than there are vectors, or (on leaving the context) fewer, since either means the
    vectors and the examples are misaligned.
    """
    import torch

    stack = describe_architecture(model)
    reads = stack.family.head_token
    if stack.architecture == "modernbert" and getattr(stack.config, "classifier_pooling", "cls") != "cls":
        reads = f"{stack.config.classifier_pooling}-pooled"
    if reads != "first":
        readers = sorted(name for name, family in FAMILIES.items() if family.head_token == "first")
        raise LayersimError(f"layer injection replaces the first token's state, but the head of this "
                            f"{stack.architecture!r} model reads the {reads} token state; valid architectures are: "
                            f"{', '.join(readers)}.")
    vectors = torch.as_tensor(vectors)
    if vectors.ndim != 2 or vectors.shape[1] != stack.config.hidden_size:
        raise LayersimError(f"injected vectors have shape {tuple(vectors.shape)}; valid shape is "
                            f"(rows, {stack.config.hidden_size}) for this model's hidden size.")
    offset = 0

    def hook(module, args, output):
        nonlocal offset
        state = _state(output)
        rows = state.shape[0]
        if offset + rows > len(vectors):
            raise LayersimError(f"the model ran {offset + rows} rows but only {len(vectors)} vectors were given "
                                "to inject; give one vector per (example, choice) row.")
        state[:, 0] = vectors[offset:offset + rows].to(state.device, state.dtype)
        offset += rows

    handle = stack.final_state_module().register_forward_hook(hook)
    try:
        yield model
    finally:
        handle.remove()
    if offset != len(vectors):
        raise LayersimError(f"{len(vectors)} vectors were given to inject but the model ran {offset} rows; "
                            "give one vector per (example, choice) row.")


@contextlib.contextmanager
def last_block_output(model: nn.Module) -> Iterator[list]:
    """Within the context, the output of the model's last layer, before any final norm, batch-first, is appended
    to the yielded list each time that layer runs (ALBERT's shared group runs once per layer: the last entry
    after a forward pass is layer L's). Transformers' ``hidden_states[-1]`` is after the final norm for decoders
    and ModernBERT (layersim.models.layer_stacks); this is the state at the same point as every other layer's."""
    stack = describe_architecture(model)
    captured: list = []

    def hook(module, args, output):
        state = _state(output)
        captured.append(state.transpose(0, 1) if stack.family.sequence_first else state)

    handle = stack.module_for(stack.num_layers - 1).register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()
