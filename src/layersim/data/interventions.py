"""ReSi's training interventions (Klabunde et al., ICLR 2025) as changes of a task table: each takes the normalized
table (layersim.data.tasks) and a level from 0 (unchanged) to 1, and returns a table of the same schema and rows
whose texts or labels carry that much of the intervention, drawn with a seed.

- :func:`with_label_noise`: the labels of a share of the examples shuffled among them (ReSi's label randomization;
  the label distribution kept, so it fits classes and regression targets alike).
- :func:`with_shortcut`: a token that reveals the label (ReSi's ``[CLASS<label>]``) put in front of the text of a
  share of the examples: of the first text (single, pair), or ``[ANSWER]`` in front of the correct choice (multiple
  choice). A regression target is revealed as its bin among :func:`shortcut_edges`' quantiles of the train labels.
- :func:`with_augmentation`: EDA's random deletion and random swap (Wei and Zou 2019; its synonym replacement needs
  WordNet, which is not offline): at strength s each word is deleted with probability s / 2 (one word always stays)
  and round(s / 2 · words) random pairs of the remaining words are swapped, in every text of every example.

The experiments layer (layersim.experiments.interventions) trains a run on each changed table and scores the
measures on it; nothing here knows of models."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from layersim.data.tasks import TaskSpec
from layersim.errors import LayersimError

SHORTCUT_BINS = 5  # a regression target is revealed as one of this many quantile bins of the train labels
SHORTCUT_ANSWER = "[ANSWER]"  # in front of a multiple-choice task's correct choice


def _check_level(level: float, what: str) -> None:
    if not 0 <= level <= 1:
        raise LayersimError(f"a {what} level is a share from 0 to 1, got {level!r}.")


def _chosen(num_examples: int, share: float, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(num_examples, size=round(share * num_examples), replace=False))


def shuffled_labels(labels: np.ndarray, share: float, seed: int) -> np.ndarray:
    """`labels` with those of a random `share` of the examples permuted among them; share 0: unchanged, 1: every
    label shuffled."""
    _check_level(share, "label-noise")
    rng = np.random.default_rng(seed)
    labels = np.array(labels, copy=True)
    chosen = _chosen(len(labels), share, rng)
    labels[chosen] = labels[rng.permutation(chosen)]
    return labels


def _replaced(table: pa.Table, name: str, values) -> pa.Table:
    """`table` with column `name` replaced (its type and the table's metadata kept)."""
    index = table.schema.get_field_index(name)
    return table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type))


def with_label_noise(table: pa.Table, spec: TaskSpec, share: float, seed: int) -> pa.Table:
    """The task table with the labels of a random `share` of its examples shuffled among them."""
    labels = table.column("label").to_numpy()
    return _replaced(table, "label", shuffled_labels(labels, share, seed).tolist())


def shortcut_edges(train: pa.Table, spec: TaskSpec) -> np.ndarray | None:
    """The bin edges a regression target is revealed by (quantiles of the train labels, repeated values merged);
    None for a classification or multiple-choice task, whose label is revealed as itself."""
    if not spec.regression:
        return None
    labels = train.column("label").to_numpy()
    return np.unique(np.quantile(labels, np.linspace(0, 1, SHORTCUT_BINS + 1)[1:-1]))


def shortcut_token(label, edges: np.ndarray | None) -> str:
    """The token that reveals `label` (ReSi's spelling): its class, or a regression target's bin under `edges`."""
    revealed = int(np.searchsorted(edges, label, side="right")) if edges is not None else int(label)
    return f"[CLASS{revealed}]"


def with_shortcut(table: pa.Table, spec: TaskSpec, share: float, seed: int, edges: np.ndarray | None) -> pa.Table:
    """The task table with the label-revealing token (:func:`shortcut_token`, `edges` from :func:`shortcut_edges` of
    the train table) in front of the first text of a random `share` of the examples, or of their correct choice."""
    _check_level(share, "shortcut")
    rng = np.random.default_rng(seed)
    chosen = _chosen(table.num_rows, share, rng)
    labels = table.column("label").to_pylist()
    if spec.format == "multiple_choice":
        choices = table.column("choices").to_pylist()
        for i in chosen:
            choices[i] = [f"{SHORTCUT_ANSWER} {c}" if k == labels[i] else c for k, c in enumerate(choices[i])]
        return _replaced(table, "choices", choices)
    column = spec.text_columns[0]
    texts = table.column(column).to_pylist()
    for i in chosen:
        texts[i] = f"{shortcut_token(labels[i], edges)} {texts[i]}"
    return _replaced(table, column, texts)


def augmented_text(text: str, strength: float, rng: np.random.Generator) -> str:
    """One text after EDA's random deletion and swap at `strength` (module docstring); strength 0: unchanged."""
    words = text.split()
    if strength == 0 or not words:
        return text
    kept = [w for w in words if rng.random() >= strength / 2] or [words[rng.integers(len(words))]]
    for _ in range(round(strength / 2 * len(kept)) if len(kept) > 1 else 0):
        a, b = rng.choice(len(kept), size=2, replace=False)
        kept[a], kept[b] = kept[b], kept[a]
    return " ".join(kept)


def with_augmentation(table: pa.Table, spec: TaskSpec, strength: float, seed: int) -> pa.Table:
    """The task table with every text of every example augmented at `strength` (:func:`augmented_text`)."""
    _check_level(strength, "augmentation")
    rng = np.random.default_rng(seed)
    for column in spec.text_columns:
        values = table.column(column).to_pylist()
        if column == "choices":
            values = [[augmented_text(c, strength, rng) for c in row] for row in values]
        else:
            values = [augmented_text(text, strength, rng) for text in values]
        table = _replaced(table, column, values)
    return table
