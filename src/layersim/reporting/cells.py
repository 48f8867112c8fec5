"""How the report page writes one value in a table cell: numbers, per-layer values read at the top layer, and
blocks of layers as ranges."""

from __future__ import annotations

from collections.abc import Mapping


def fmt(value: object, digits: int = 3) -> str:
    """A value as a table cell writes it: floats to `digits` places, a missing value as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def block_spans(block_of_layer: Mapping[str, int | None]) -> str:
    """Blocks as layer ranges, e.g. "1–4 | 5–12", from the block label of each layer (layer 0: none)."""
    labels = [(int(key.split("_")[1]), label) for key, label in sorted(block_of_layer.items()) if label is not None]
    spans: list[list[int]] = []
    for layer, label in labels:
        if spans and spans[-1][2] == label:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer, label])
    return " | ".join(f"{a}" if a == b else f"{a}–{b}" for a, b, _ in spans)


def top_layer(values: Mapping[str, object]) -> object:
    """The top layer's value of a per-layer mapping ({"layer_00": …, "layer_12": …}); None if it is empty."""
    return values[max(values)] if values else None
