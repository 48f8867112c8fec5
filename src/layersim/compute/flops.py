"""FLOPs counted analytically: the matmuls of a transformer layer stack's forward and backward pass, with or without
frozen layers (what freezing can save, independent of the machine; the freeze stage and the plan,
:mod:`layersim.plan`, both count with these). Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from layersim.errors import LayersimError, as_int

FREEZE_SIDES = ("bottom", "top")


def frozen_range(num: int, side: str, k: int) -> list[int]:
    """0-based indices of the `k` bottom or top layers of a `num`-layer model."""
    if side not in FREEZE_SIDES:
        raise LayersimError(f"freeze side {side!r} is invalid; valid sides are: {', '.join(FREEZE_SIDES)}.")
    k = as_int(k, "number of frozen layers", f"0..{num}")
    if not 0 <= k <= num:
        raise LayersimError(f"cannot freeze {k} layers of this {num}-layer model; valid values are 0..{num}.")
    return list(range(k)) if side == "bottom" else list(range(num - k, num))


# Backward FLOPs of a frozen configuration, counted analytically (what freezing can save, independent of the
# machine). Config names of hidden size, depth and feed-forward width, per family (BERT's first).
_HIDDEN = ("hidden_size", "n_embd", "dim", "d_model")
_DEPTH = ("num_hidden_layers", "n_layer", "n_layers")
_WIDTH = ("intermediate_size", "n_inner", "hidden_dim", "d_inner")


@dataclass(frozen=True)
class LayerShape:
    num_layers: int
    hidden: int        # h
    intermediate: int  # f, the feed-forward width


def layer_shape(config: Mapping) -> LayerShape:
    """The shape of the layers of a model config (config.json's dict; GPT-2's unset n_inner is 4h, as GPT-2
    reads it)."""
    def first(keys):
        return next((config[key] for key in keys if config.get(key) is not None), None)

    hidden, depth = first(_HIDDEN), first(_DEPTH)
    width = first(_WIDTH) or (4 * hidden if hidden and config.get("model_type") == "gpt2" else None)
    if hidden is None or width is None or depth is None:
        raise LayersimError(f"cannot count the FLOPs of a {config.get('model_type', 'unknown')} model: its config "
                            f"has no hidden size, depth or feed-forward width under the names "
                            f"{', '.join(_HIDDEN + _DEPTH + _WIDTH)}.")
    return LayerShape(int(depth), int(hidden), int(width))


def training_flops(shape: LayerShape, side: str | None, k: int, seq_len: int) -> dict[str, int]:
    """Forward and backward matmul FLOPs of one training sequence of `seq_len` (padded) tokens, with the
    bottom or top `k` layers frozen (`side` None: nothing frozen), a multiply-add counted as 2 FLOPs.

    Per layer, with h the hidden size, f the feed-forward width and s the sequence length:
      W = 8·s·h² + 4·s·h·f   the matmuls with weights (Q, K, V, output: four h×h; the feed-forward: h×f, f×h)
      A = 4·s²·h             the matmuls of two activations (Q·Kᵀ, attention·V, over all heads)
      forward = W + A
    A matmul's backward is two matmuls of its size: the gradient of its weight (or second activation) and of
    its input. So per layer:
      trainable:                              2W + 2A
      trainable, nothing trainable below it:  2W + 2A − 6·s·h²  (no gradient to the layer's input through Q, K, V)
      frozen, something trainable below it:    W + 2A           (no weight gradients; its input's gradient flows on)
      frozen, nothing trainable below it:      0                (no backward at all)
    The embeddings are trainable unless the bottom layers are frozen (then they are frozen with them).
    Left out, the same for every configuration or small: embedding lookups, layer norms, softmax, biases,
    the task head. The formula is BERT's layer; other layer types (gated feed-forward, grouped-query
    attention, ALBERT's embedding projection) are counted as if they had BERT's layer of the same h and f.
    ALBERT's frozen applications of its shared group count as frozen layers."""
    L, h, f, s = shape.num_layers, shape.hidden, shape.intermediate, seq_len
    frozen = set(frozen_range(L, side, k)) if side is not None else set()
    weights, attention, qkv_input = 8 * s * h * h + 4 * s * h * f, 4 * s * s * h, 6 * s * h * h
    trainable_below = side != "bottom" or not frozen  # the embeddings
    backward = 0
    for i in range(L):
        if i not in frozen:
            backward += 2 * weights + 2 * attention - (0 if trainable_below else qkv_input)
        elif trainable_below:
            backward += weights + 2 * attention
        trainable_below = trainable_below or i not in frozen
    return {"forward": L * (weights + attention), "backward": backward}


def flops_saved(shape: LayerShape, side: str, k: int, seq_lens: Sequence[int]) -> dict[str, float]:
    """The share of backward FLOPs, and of training FLOPs (forward + backward), that freezing the bottom or
    top `k` layers saves against training every layer, over sequences of the given padded lengths."""
    full = [training_flops(shape, None, 0, s) for s in seq_lens]
    mine = [training_flops(shape, side, k, s) for s in seq_lens]
    backward = sum(c["backward"] for c in full)
    saved = backward - sum(c["backward"] for c in mine)
    return {"backward_flops_saved": saved / backward,
            "training_flops_saved": saved / (backward + sum(c["forward"] for c in full))}
