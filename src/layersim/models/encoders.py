"""Running an encoder over a chosen subset of its layers: untuned truncation and layer skipping.

This is the one place of the library that knows where each architecture keeps its layer stack:

- BERT, RoBERTa, ELECTRA: ``base_model.encoder.layer`` is an ``nn.ModuleList`` with one module per
  transformer layer, and the encoder's forward simply loops over that list.
- ALBERT: ``base_model.encoder.albert_layer_groups`` holds only ``num_hidden_groups`` layer groups
  (one for albert-base/large-v2), and the encoder's forward applies them ``num_hidden_layers`` times,
  layer ``i`` using group ``int(i / (num_hidden_layers / num_hidden_groups))``. The weights are
  shared across depth, so "run fewer layers" cannot mean "delete modules": it means applying the
  groups fewer times. We do that by giving the encoder a list with one (shared, not copied) group
  per layer to run and a private copy of its config that says how many there are.

Both kinds of change are made by :func:`run_layers`, a context manager that swaps the stack for the
chosen layers and restores it on exit, even after an exception. Everything else is the model's own
forward, unchanged: embeddings (and ELECTRA's / ALBERT's projection to the hidden size), attention
masks, and the task head with its own pooling (BERT/ALBERT pooler, RoBERTa/ELECTRA classification
heads, multiple-choice heads). So a truncated or skipped model is a drop-in model:

    with exit_at(model, k):          # Phang et al. §4: layer k's output into the fine-tuned head
        logits = model(**batch).logits
    with skip_span(model, i, j):     # Phang et al. §4.1: layers i..j (1-based) are skipped
        logits = model(**batch).logits

``exit_at(model, L)`` and ``run_layers(model, range(L))`` are exactly the full model (same modules,
same order, same arithmetic). Inside a context, ``output_hidden_states=True`` gives one state per
layer run plus the initial one (also when no layer runs). The contexts are not thread-safe and do not
nest: they change the model object, so use one model per thread.
"""

from __future__ import annotations

import contextlib
import copy
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from torch import nn

from layersim.errors import LayersimError

SUPPORTED_ARCHITECTURES = ("albert", "bert", "electra", "roberta")

# While a context is active, the encoder's original (layer list, config) are kept in its __dict__ under
# this name (plain attribute, so torch does not register the list twice). It lets num_layers report the
# full depth inside a context and stops contexts from nesting, which would be ambiguous.
_SAVED = "_layersim_original_stack"


@dataclass(frozen=True)
class LayerStack:
    """Where one model keeps its transformer layers (always the full, original stack, also while a
    context has swapped it).

    ``attribute`` is the encoder attribute that :func:`run_layers` swaps, ``modules`` its original
    value and ``config`` the encoder's original config; ``num_layers`` is the depth ``L`` in the
    paper's sense (for ALBERT: applications of a shared group, not modules).
    """

    architecture: str
    base_model: nn.Module
    encoder: nn.Module
    attribute: str
    modules: nn.ModuleList
    config: object
    num_layers: int

    @property
    def shared(self) -> bool:
        """True when layers share weights (ALBERT): the stack is groups applied repeatedly."""
        return self.architecture == "albert"

    def module_for(self, index: int) -> nn.Module:
        """The module that computes 0-based layer `index` of the full model."""
        if self.shared:
            # The same formula as AlbertTransformer.forward, so that layer i runs the group it always runs.
            return self.modules[int(index / (self.num_layers / self.config.num_hidden_groups))]
        return self.modules[index]


def describe_architecture(model: nn.Module) -> LayerStack:
    """The layer stack of a base or task model of a supported architecture.

    Raises LayersimError for anything else (the message lists the supported architectures).
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHITECTURES:
        shown = model_type if model_type is not None else type(model).__name__
        raise LayersimError(f"cannot run layers of architecture {shown!r}; supported architectures are: "
                            f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    # `base_model` is the transformers property that finds the encoder model under any task head.
    base = getattr(model, "base_model", model)
    encoder = base.encoder
    attribute = "albert_layer_groups" if model_type == "albert" else "layer"
    # While a context is active the encoder holds the originals aside (see run_layers).
    modules, encoder_config = encoder.__dict__.get(_SAVED, (encoder._modules[attribute], encoder.config))
    # ALBERT's depth is how often the groups are applied, not how many modules there are.
    num = int(encoder_config.num_hidden_layers) if model_type == "albert" else len(modules)
    return LayerStack(model_type, base, encoder, attribute, modules, encoder_config, num)


def num_layers(model: nn.Module) -> int:
    """The number L of transformer layers of a base or task model."""
    return describe_architecture(model).num_layers


def _as_int(value: object, what: str, valid: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise LayersimError(f"{what} {value!r} is not an integer; valid values are {valid}.") from None


def _check_layers(layers: Sequence[int], num: int) -> list[int]:
    valid = f"strictly increasing 0-based layer indices in 0..{num - 1}"
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise LayersimError(f"layer list {layers!r} is not a sequence; valid values are {valid}.")
    indices = [_as_int(i, "layer index", valid) for i in layers]
    for pos, index in enumerate(indices):
        if not 0 <= index < num:
            raise LayersimError(f"layer index {index} is out of range for this {num}-layer model; "
                                f"valid values are {valid}.")
        # Increasing and distinct: that is all truncation and skipping need, and it keeps every run
        # a sub-sequence of the real model (no layer applied twice, none out of order).
        if pos and index <= indices[pos - 1]:
            raise LayersimError(f"layer list {indices} is not strictly increasing at {index}; "
                                f"valid values are {valid}.")
    return indices


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
    """A forward hook for the encoder when no layer runs (exit at 0). In v5 the initial hidden state is
    recorded by the first layer's hook, so with no layer there would be no state at all; this records the
    encoder's output (= its input after any embedding projection) as hidden_states[0] instead."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # v4: the encoder itself returns the single initial state
        return None

    def hook(module, args, output):
        collected = _active_collector.get()
        if not collected or "hidden_states" not in collected or collected["hidden_states"]:
            return
        state = output[0] if isinstance(output, tuple) else output.last_hidden_state
        selection = collected.get("_hidden_states_layers")
        collected["hidden_states"].append(state if selection is None or 0 in selection else None)

    return hook


@contextlib.contextmanager
def run_layers(model: nn.Module, layers: Sequence[int]) -> Iterator[nn.Module]:
    """Within the context, `model` runs only the transformer layers `layers` (0-based, increasing),
    each with its own fine-tuned weights; yields `model`. Nothing is copied; all is restored on exit."""
    stack = describe_architecture(model)
    indices = _check_layers(layers, stack.num_layers)
    with _swapped_stack(stack, [stack.module_for(i) for i in indices]):
        yield model


@contextlib.contextmanager
def _swapped_stack(stack: LayerStack, entries: list[nn.Module]) -> Iterator[None]:
    """The encoder runs `entries` in order, one per layer, instead of its own stack; restored on exit."""
    encoder = stack.encoder
    if _SAVED in encoder.__dict__:
        raise LayersimError("layer selections do not nest; valid use is one run_layers, exit_at, skip_span or "
                            "frozen_layers context at a time per model.")
    _install_output_hooks(stack.base_model)
    handle = None
    try:
        encoder.__dict__[_SAVED] = (stack.modules, stack.config)
        setattr(encoder, stack.attribute, nn.ModuleList(entries))
        if stack.shared:
            # The ALBERT loop reads only these two fields: with one group entry per layer to run, loop
            # step n runs entry n. A private copy keeps the model's shared config (read by the head, the
            # masks and saving) untouched.
            view = copy.copy(stack.config)
            view.num_hidden_layers = len(entries)
            view.num_hidden_groups = max(len(entries), 1)  # never 0: it is a divisor in the loop
            encoder.config = view
        if not entries:
            hook = _initial_state_hook()
            if hook is not None:
                handle = encoder.register_forward_hook(hook)
        yield
    finally:
        if handle is not None:
            handle.remove()
        if stack.shared:
            encoder.config = stack.config
        setattr(encoder, stack.attribute, stack.modules)
        encoder.__dict__.pop(_SAVED, None)


def exit_at(model: nn.Module, k: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Untuned truncation: run layers 1..k only (k = 0: embeddings only; k = L: the full model)."""
    num = num_layers(model)
    valid = f"0..{num} for this {num}-layer model"
    k = _as_int(k, "exit layer", valid)
    if not 0 <= k <= num:
        raise LayersimError(f"exit layer {k} is out of range; valid exit layers are {valid}.")
    return run_layers(model, range(k))


def skip_span(model: nn.Module, i: int, j: int) -> contextlib.AbstractContextManager[nn.Module]:
    """Skip the layers i..j (1-based, inclusive): the state after layer i-1 goes into layer j+1."""
    num = num_layers(model)
    valid = f"1 <= i <= j <= {num} for this {num}-layer model"
    i = _as_int(i, "skip span start", valid)
    j = _as_int(j, "skip span end", valid)
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


def continue_from(model: nn.Module, first: int, state) -> contextlib.AbstractContextManager[nn.Module]:
    """Run layers first+1..L (1-based) on `state`, the hidden state of the batch before layer first+1
    (``hidden_states[i - 1]`` of a full forward pass), instead of on the embeddings' output; the rest of
    the forward (masks, head) is the model's own. With ``first = j`` and the state after layer i−1, this
    is :func:`skip_span` (i, j) without recomputing layers 1..i−1, which every span starting at i shares.
    The embeddings still run (cheap) and their output is ignored. `first` must be below L."""
    num = num_layers(model)
    valid = f"0..{num - 1} for this {num}-layer model"
    first = _as_int(first, "first layer", valid)
    if not 0 <= first < num:
        raise LayersimError(f"first layer {first} is out of range; valid values are {valid}.")
    stack = describe_architecture(model)
    entries = [stack.module_for(n) for n in range(first, num)]
    entries[0] = _StartFrom(entries[0], state)
    return _swapped_stack(stack, entries)


def smaller_copy(model: nn.Module, layers: Sequence[int]) -> nn.Module:
    """A new model that runs only `layers` (0-based, increasing, at least one) of `model`, as a model of
    that depth in its own right: the same weights, ``config.num_hidden_layers = len(layers)``, so that
    ``save_pretrained`` writes an ordinary checkpoint that transformers loads with no layersim code and
    that computes exactly what ``run_layers(model, layers)`` does. ALBERT's shared group is kept once and
    applied len(layers) times (one group only: with several, a shallower stack assigns groups anew)."""
    stack = describe_architecture(model)
    if _SAVED in stack.encoder.__dict__:
        raise LayersimError("cannot copy a model inside a layer selection; valid use is outside any run_layers, "
                            "exit_at, skip_span or frozen_layers context.")
    indices = _check_layers(layers, stack.num_layers)
    if not indices:
        raise LayersimError(f"a smaller model needs at least one layer; valid layer lists hold 1 to "
                            f"{stack.num_layers} of the layers 0..{stack.num_layers - 1}.")
    if stack.shared and int(stack.config.num_hidden_groups) != 1:
        raise LayersimError(f"an ALBERT model with {stack.config.num_hidden_groups} layer groups cannot be made "
                            "shallower exactly; valid models have num_hidden_groups = 1 (every albert-*-v2).")
    small = copy.deepcopy(model)
    small_stack = describe_architecture(small)
    if not small_stack.shared:
        setattr(small_stack.encoder, small_stack.attribute, nn.ModuleList([small_stack.modules[i] for i in indices]))
    for config in {id(c): c for c in (small.config, small_stack.config)}.values():
        config.num_hidden_layers = len(indices)
    return small


def all_spans(num: int) -> list[tuple[int, int]]:
    """Every span (i, j) with 1 <= i <= j <= num, ordered by start, then end."""
    num = _as_int(num, "number of layers", "integers >= 0")
    if num < 0:
        raise LayersimError(f"number of layers {num} is negative; valid values are integers >= 0.")
    return [(i, j) for i in range(1, num + 1) for j in range(i, num + 1)]


@contextlib.contextmanager
def inject_first_token(model: nn.Module, vectors) -> Iterator[nn.Module]:
    """Within the context, the encoder's last-layer state of the first token (CLS, <s>) is replaced by
    the next rows of `vectors` (a (rows, hidden) tensor or array), batch after batch, in order; the
    task head then runs unchanged on it (Ren et al. §4.5 "layer injection").

    Every head of the supported architectures reads only the first token (BERT/ALBERT pooler,
    RoBERTa/ELECTRA classification heads, multiple-choice heads), so this feeds a representation to the
    head exactly. Multiple-choice batches are flattened (example, choice) rows, as in the activation
    tables. Raises if the model runs more rows than there are vectors, or (on leaving the context)
    fewer, since either means the vectors and the examples are misaligned.
    """
    import torch

    stack = describe_architecture(model)
    vectors = torch.as_tensor(vectors)
    if vectors.ndim != 2 or vectors.shape[1] != stack.config.hidden_size:
        raise LayersimError(f"injected vectors have shape {tuple(vectors.shape)}; valid shape is "
                            f"(rows, {stack.config.hidden_size}) for this model's hidden size.")
    offset = 0

    def hook(module, args, output):
        nonlocal offset
        state = output[0] if isinstance(output, tuple) else output.last_hidden_state
        rows = state.shape[0]
        if offset + rows > len(vectors):
            raise LayersimError(f"the model ran {offset + rows} rows but only {len(vectors)} vectors were given "
                                "to inject; give one vector per (example, choice) row.")
        state[:, 0] = vectors[offset:offset + rows].to(state.device, state.dtype)
        offset += rows

    handle = stack.encoder.register_forward_hook(hook)
    try:
        yield model
    finally:
        handle.remove()
    if offset != len(vectors):
        raise LayersimError(f"{len(vectors)} vectors were given to inject but the model ran {offset} rows; "
                            "give one vector per (example, choice) row.")
