"""Words as data points (Wu et al. 2020): one row per word, represented by its last sub-word token.

Words are defined by the text, not by a tokenizer: each text field is split on whitespace (runs of
non-space characters, :func:`word_spans`), so the same words line up across models whose tokenizers
differ. The model's own encoding is kept (the one every other pooling sees); a word's position is
found from the tokenizer's character offsets: each content token belongs to the word that holds its
last character, and a word's row is its last such token.

Row keys of a ``tokens`` activation table (:data:`WORD_KEYS`), in the order rows are written:

- ``example_id``: the task table's example;
- ``choice``: 0, or the ending of a multiple-choice example — every choice is its own input (context +
  ending), so context words appear once per choice, as the per-example tables hold one row per choice;
- ``segment``: 0 for ``text`` / ``text_a`` / ``context``, 1 for ``text_b`` / the choice's ending;
- ``word``: the word's index among the whitespace-separated words of that segment's text.

Truncation (``finetune.max_length``) can cut the words at a segment's edge: a word is kept only when
its characters are covered from its first to its last (interior words of a segment always are). Which
words a truncation cuts depends on the tokenizer, as do words a tokenizer drops entirely (e.g. only
control characters); so tables of different tokenizers can hold different keys, and
:func:`align_rows` keeps the keys every model has. Runs of one model (same tokenizer) hold identical
keys, which :meth:`layersim.data.io.ActivationTable.check_comparable` verifies.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError

WORD_KEYS = ("example_id", "choice", "segment", "word")
# Columns a tokens table has beyond those of a per-example table (after example_id and choice).
WORD_FIELDS = (pa.field("segment", pa.int16()), pa.field("word", pa.int32()))
_WORD = re.compile(r"\S+")


def word_spans(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) character spans of the whitespace-separated words of `text`."""
    spans = np.array([m.span() for m in _WORD.finditer(text)], dtype=np.int64).reshape(-1, 2)
    return spans[:, 0], spans[:, 1]


def row_words(offsets, sequence_ids, texts) -> np.ndarray:
    """(words, 3) int64 [segment, word, position] of one encoded input: for every complete word of each
    segment's text (`texts[segment]`), the position of its last sub-word token, in segment and word order.

    `offsets` are the tokenizer's (start, end) character offsets into the segment's text and
    `sequence_ids` each token's segment (None for special tokens), as fast tokenizers return them."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    segment_of = np.array([-1 if s is None else s for s in sequence_ids], dtype=np.int64)
    rows = []
    for segment, text in enumerate(texts):
        starts, ends = word_spans(text)
        positions = np.flatnonzero((segment_of == segment) & (offsets[:, 1] > offsets[:, 0]))
        if not len(starts) or not len(positions):
            continue
        first, last = offsets[positions, 0], offsets[positions, 1]
        word = np.searchsorted(starts, last - 1, side="right") - 1
        inside = (word >= 0) & (last - 1 < ends[np.maximum(word, 0)])  # not a token of whitespace alone
        positions, first, last, word = positions[inside], first[inside], last[inside], word[inside]
        if not len(word):
            continue
        seen = np.unique(word)
        # Per word: its last token (positions ascend), its first covered and its last covered character.
        last_token = np.zeros(len(starts), np.int64)
        last_token[word] = positions
        begin = np.full(len(starts), np.iinfo(np.int64).max)
        np.minimum.at(begin, word, first)
        reach = np.zeros(len(starts), np.int64)
        np.maximum.at(reach, word, last)
        # Truncation cuts a segment only at its edges: interior words are whole; the first and last
        # seen words must be covered from their first to their last character.
        whole = ((seen > seen[0]) | (begin[seen] <= starts[seen])) & ((seen < seen[-1]) | (reach[seen] >= ends[seen]))
        seen = seen[whole]
        rows.append(np.stack([np.full(len(seen), segment), seen, last_token[seen]], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)


def encode_words(encoding, texts_per_row) -> list[np.ndarray]:
    """:func:`row_words` of every row of a fast tokenizer's `encoding` (made with return_offsets_mapping)."""
    return [row_words(encoding["offset_mapping"][i], encoding.sequence_ids(i), texts)
            for i, texts in enumerate(texts_per_row)]


def check_fast(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise LayersimError(f"pooling 'tokens' needs a fast tokenizer (character offsets), got "
                            f"{type(tokenizer).__name__}; valid are the tokenizers.PreTrainedTokenizerFast classes.")


def check_keys(keys: np.ndarray, describe) -> None:
    """Refuse word keys (rows, 4: :data:`WORD_KEYS`; or 5 with a leading task index) whose choice, segment
    or word is negative, or that repeat; `describe(row)` names a row in the error."""
    names = WORD_KEYS if keys.shape[1] == 4 else ("task", *WORD_KEYS)
    negative = np.flatnonzero((keys[:, -3:] < 0).any(axis=1))
    if negative.size:
        raise LayersimError(f"{describe(int(negative[0]))} has a negative choice, segment or word; re-run the "
                            "extract stage.")
    if len(keys) > 1:
        order = np.lexsort(keys.T[::-1])
        same = np.flatnonzero((keys[order[1:]] == keys[order[:-1]]).all(axis=1))
        if same.size:
            raise LayersimError(f"{describe(int(max(order[same[0]], order[same[0] + 1])))} repeats the key "
                                f"{dict(zip(names, keys[order[same[0]]].tolist()))}; re-run the extract stage.")


def align_rows(models: dict[str, tuple[np.ndarray, list[np.ndarray]]]
               ) -> tuple[np.ndarray, dict[str, list[np.ndarray]]]:
    """Line up several models' word rows: `models` maps a label to (keys (rows, k) int64, per-layer arrays
    with those rows). Returns the keys every model holds, sorted (a fixed order whatever the models'),
    and each model's layers restricted to those keys in that order.

    Keys must be unique within a model. Tokenizers differ only in the words truncation cut or that
    held no token, so the intersection loses only those."""
    if not models:
        raise LayersimError("align_rows needs at least one model; got none.")
    common = None
    for label, (keys, layers) in models.items():
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        check_keys(keys, lambda row: f"{label} word row {row}")
        rows = {tuple(key) for key in keys.tolist()}
        common = rows if common is None else common & rows
    if not common:
        raise LayersimError(f"the models {', '.join(models)} share no word keys; encode the same examples "
                            "with each.")
    width = next(iter(models.values()))[0].shape[1]
    shared = np.array(sorted(common), dtype=np.int64).reshape(-1, width)
    aligned = {}
    for label, (keys, layers) in models.items():
        index = {key: row for row, key in enumerate(map(tuple, np.asarray(keys, np.int64).tolist()))}
        take = np.fromiter((index[key] for key in map(tuple, shared.tolist())), np.int64, count=len(shared))
        aligned[label] = [np.ascontiguousarray(layer[take]) for layer in layers]
    return shared, aligned
