"""Words as data points (Wu et al. 2020): one row per word, represented by its last sub-word token.

**Words are Penn-Treebank-like** (:func:`ptb_words`), defined by the text, not by a tokenizer, as Wu et al.'s
PTB words are: whitespace separates words and, as the PTB tokenizer (tokenizer.sed) does, punctuation
``, ; : ? ! ( ) [ ] { } < > " “ ” « » @ # $ % & -- ...`` is a word of its own (a comma or colon between
digits stays: "1,000", "10:30"); a period ending a word that holds no other period is split off
("honestly." → "honestly", "."; "U.S." and "3.5" stay whole; unlike PTB, a mid-sentence "Dr." is split too);
a closing single quote is split from its word ("dogs'" → "dogs", "'"); the clitics n't 's 'm 'd 're 've 'll
(also with ’) are words ("don't" → "do", "n't"; "can't" → "ca", "n't"), and cannot, gonna, gotta, wanna,
gimme, lemme split as PTB splits them ("can", "not"; "gon", "na"; …). So "great," gives "great" and ",".

**The model reads the words** (``is_split_into_words=True``): each word is tokenized on its own, so no token
spans two words whatever the tokenizer (on raw text a byte-level BPE reads "don't" as "don" + "'t" and "."
with a following quote as one token; a SentencePiece model can learn pieces across punctuation). The same
example thus gives the same words in the same order with WordPiece, byte-level BPE and SentencePiece
tokenizers; a word's row is its last sub-word (the tokenizer's word_ids). This is a second encoding of the
examples, beside the one the other poolings read: a byte-level BPE gets a space before every word
(:func:`words_tokenizer`: "great ," is "Ġgreat Ġ,"), as a SentencePiece model puts "▁" before each;
WordPiece, which splits on punctuation anyway, sees the text's own tokens except at clitics.

Row keys of a ``tokens`` activation table (:data:`WORD_KEYS`), in the order rows are written:

- ``example_id``: the task table's example;
- ``choice``: 0, or the ending of a multiple-choice example. Every choice is its own input (context +
  ending); the context's words are kept once, from the first choice's input (an input the model is
  fine-tuned on, unlike the context alone; a decoder's context states do not depend on the ending at all),
  each ending's words from its own input: keys (example, 0, 0, w) for the context, (example, c, 1, w) for
  ending c;
- ``segment``: 0 for ``text`` / ``text_a`` / ``context``, 1 for ``text_b`` / the choice's ending;
- ``word``: the word's index among the PTB words of that segment's text.

Truncation (``finetune.max_length``) can cut the words at a segment's edge: a word is kept only when all of
its sub-words are in the input. Which words a truncation cuts depends on the tokenizer, as do words a
tokenizer drops entirely (e.g. only control characters); so tables of different tokenizers can hold
different keys, and :func:`align_rows` keeps the keys every model has. Runs of one model (same tokenizer)
hold identical keys, which :meth:`layersim.data.io.ActivationTable.check_comparable` verifies.

**Attention between words** (:func:`word_attention`, ``extract.attention_unit: words``) follows Clark et al.
(2019), as Wu et al. (2020, §4) do: attention to a word is the sum of the attention to its sub-words, attention
from a word the mean of its sub-words' rows, so each word's row still sums to 1; each special token ([CLS],
</s>, <cls>) is a unit of its own.
"""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError

WORD_KEYS = ("example_id", "choice", "segment", "word")
# Columns a tokens table has beyond those of a per-example table (after example_id and choice).
WORD_FIELDS = (pa.field("segment", pa.int16()), pa.field("word", pa.int32()))

# PTB-like splitting: each rule only inserts spaces (never changes a character), so words map back to the text.
_ALWAYS = re.compile(r"\.\.\.|--|[;@#$%&?!(){}\[\]<>\"“”«»]|(?<!\d)[,:]|[,:](?!\d)")
_CONTRACTIONS = re.compile(r"(?i)\b(can)(not)\b|\b(gon|wan)(na)\b|\b(got)(ta)\b|\b(gim|lem)(me)\b")
_CLITIC = re.compile(r"(?i)(?<=\w)(n['’]t|['’](?:s|m|d|re|ve|ll))$")
_CLOSING_QUOTE = re.compile(r"(?<=[^'’])(['’])$")
_FINAL_PERIOD = re.compile(r"^([^.]*[^.])(\.)$")


def _split_chunk(match: re.Match) -> str:
    rest, suffixes = match.group(), []
    period = _FINAL_PERIOD.match(rest)
    if period:
        rest, suffixes = period.group(1), ["."]
    while True:  # from the end: "they'd've" → "they'd" + "'ve" → "they" + "'d" + "'ve"
        found = _CLITIC.search(rest) or _CLOSING_QUOTE.search(rest)
        if not found:
            return " ".join([rest, *suffixes])
        rest, suffixes = rest[:found.start()], [found.group(1), *suffixes]


def ptb_words(text: str) -> list[str]:
    """The Penn-Treebank-like words of `text` (see the module docstring)."""
    spaced = _ALWAYS.sub(lambda m: f" {m.group()} ", text)
    spaced = _CONTRACTIONS.sub(lambda m: " ".join(g for g in m.groups() if g), spaced)
    return re.sub(r"\S+", _split_chunk, spaced).split()


def word_spans(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) character spans in `text` of its :func:`ptb_words`."""
    spans, cursor = [], 0
    for word in ptb_words(text):
        start = text.index(word, cursor)  # only whitespace lies between: the rules insert spaces only
        spans.append((start, start + len(word)))
        cursor = start + len(word)
    spans = np.array(spans, dtype=np.int64).reshape(-1, 2)
    return spans[:, 0], spans[:, 1]


def _prefix_space(node) -> bool:
    """Set add_prefix_space on every ByteLevel part of a tokenizer's JSON `node`; whether one was off."""
    changed = False
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel" and node.get("add_prefix_space") is False:
            node["add_prefix_space"], changed = True, True
        node = list(node.values())
    for value in node if isinstance(node, list) else ():
        changed |= _prefix_space(value)
    return changed


def words_tokenizer(tokenizer):
    """`tokenizer` ready for pre-split words: a copy whose byte-level pre-tokenizer adds a prefix space (GPT-2's
    and RoBERTa's do not, and would read every word as the middle of one: "great" as "great", not "Ġgreat");
    any other tokenizer as it is."""
    check_fast(tokenizer)
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    if not _prefix_space(state.get("pre_tokenizer")):
        return tokenizer
    words = copy.deepcopy(tokenizer)
    words._tokenizer = type(tokenizer.backend_tokenizer).from_str(json.dumps(state))
    if hasattr(words, "add_prefix_space"):
        words.add_prefix_space = True
    return words


def encode_words(tokenizer, segments: list[list[list[str]]], max_length: int, truncation) -> tuple[list, list, list]:
    """Encode pre-split words: `segments` holds, per segment, one list of words per row. Returns, per row, the
    features (input_ids, token_type_ids, attention_mask), the located words ((words, 3) int64 [segment, word,
    position of its last sub-word], whole words only, in segment and word order) and each token's attention
    unit (int64: a word's sub-words share one, a special token has its own, numbered in input order).
    `tokenizer` comes from :func:`words_tokenizer`."""
    encoded = tokenizer(*segments, is_split_into_words=True, truncation=truncation, max_length=max_length)
    # Each word's sub-word count on its own: a word is whole when the truncated input holds all of them.
    full = [tokenizer(rows, is_split_into_words=True, add_special_tokens=False, verbose=False) for rows in segments]
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded]
    features, located, units = [], [], []
    for i in range(len(encoded["input_ids"])):
        features.append({k: encoded[k][i] for k in keys})
        word = np.array([-1 if w is None else w for w in encoded.word_ids(i)], np.int64)
        segment = np.array([-1 if s is None else s for s in encoded.sequence_ids(i)], np.int64)
        special = word < 0
        # A unit starts at each special token and wherever (segment, word) changes.
        starts = special | np.r_[True, (word[1:] != word[:-1]) | (segment[1:] != segment[:-1])]
        units.append(np.cumsum(starts) - 1)
        rows = []
        for s, result in enumerate(full):
            inside = np.flatnonzero(~special & (segment == s))
            wanted = np.bincount(np.array([w for w in result.word_ids(i) if w is not None], np.int64),
                                 minlength=len(segments[s][i]))
            got = np.bincount(word[inside], minlength=len(wanted))
            last = np.zeros(len(wanted), np.int64)
            last[word[inside]] = inside  # positions ascend: each word's last sub-word wins
            whole = np.flatnonzero((got == wanted) & (wanted > 0))
            rows.append(np.stack([np.full(len(whole), s), whole, last[whole]], axis=1))
        located.append(np.concatenate(rows).astype(np.int64))
    return features, located, units


def word_attention(maps, units):
    """(heads, tokens, tokens) attention (rows: queries) → (heads, U, U) between the units of `units` (each
    token's unit, 0 … U-1): attention to a unit is summed over its tokens, attention from a unit averaged over
    its tokens' rows (Clark et al. 2019; Wu et al. 2020), so rows still sum to 1. NumPy arrays or torch tensors."""
    units = np.asarray(units)
    if units.ndim != 1 or maps.ndim != 3 or len(units) != maps.shape[-1] or maps.shape[-1] != maps.shape[-2]:
        raise LayersimError(f"word_attention needs square (heads, tokens, tokens) maps and one unit per token, "
                            f"got maps of shape {tuple(maps.shape)} and units of shape {units.shape}.")
    count = int(units.max()) + 1 if len(units) else 0
    if len(units) and (units.min() < 0 or len(np.unique(units)) != count):
        raise LayersimError(f"units must number the tokens' units 0 … U-1, each used; got {units.tolist()}.")
    member = np.zeros((count, len(units)))
    member[units, np.arange(len(units))] = 1.0
    mean_from = member / member.sum(axis=1, keepdims=True)
    if not isinstance(maps, np.ndarray):  # a torch tensor: the same products on its device, in its dtype
        member, mean_from = maps.new_tensor(member), maps.new_tensor(mean_from)
    else:
        member, mean_from = member.astype(maps.dtype), mean_from.astype(maps.dtype)
    return mean_from @ maps @ member.T


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
