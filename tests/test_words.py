"""Tests for the "tokens" pooling (layersim.data.words): one row per whitespace word, its last sub-word, keyed
by (example_id, choice, segment, word) so that models with different tokenizers line up.

Two tokenizers: MiniLM's BERT WordPiece (the tiny models') and a RoBERTa-style byte-level BPE trained
here on the generated tasks' sentences (offline, a small vocabulary, so words split differently)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from layersim.data.batching import encode_task
from layersim.errors import LayersimError
from layersim.experiments.extract import concatenate_pooled, extract_activations, models_for_pooling, pooled_layers
from layersim.data.io import ActivationTable, ActivationWriter, with_metadata, write_parquet
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.data.tasks import generated_table, get_task
from layersim.data.words import align_rows, row_words

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
TASKS = ("synth-negation", "synth-roles", "synth-choice")


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    return load_tokenizer(tiny_model_dir("tiny-bert"))


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    return load_encoder(tiny_model_dir("tiny-bert"))


@pytest.fixture(scope="module")
def byte_bpe():
    """A RoBERTa-style byte-level BPE (<s> … </s></s> … </s>, Ġ word starts), trained offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [text for task in TASKS for row in generated_table(get_task(task), "train", 40, seed=0).to_pylist()
             for text in (row.get("text"), row.get("text_a"), row.get("text_b"), row.get("context"),
                          *(row.get("choices") or [])) if text]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")),
                                                      trim_offsets=True, add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                   cls_token="<s>", pad_token="<pad>")


def _table(task: str, n: int = 6):
    return generated_table(get_task(task), "validation", n, seed=3)


def _segments(spec, row: dict) -> list[tuple[str, ...]]:
    """Each choice's (segment 0, segment 1) texts of one task-table row, as the documentation says."""
    if spec.format == "single":
        return [(row["text"],)]
    if spec.format == "pair":
        return [(row["text_a"], row["text_b"])]
    return [(row["context"], ending) for ending in row["choices"]]


def _keys(encoded) -> list[tuple]:
    return [(int(encoded.example_id[i]), c, int(s), int(w)) for i, per_choice in enumerate(encoded.words)
            for c, located in enumerate(per_choice) for s, w, _ in located]


@pytest.mark.parametrize("task", TASKS)
def test_positions_are_each_words_last_sub_word(bert, task):
    """Against the tokenizer's own word_ids() on the pre-split words (same tokens for WordPiece)."""
    spec = get_task(task)
    texts = ["Antidisestablishmentarianism, the quick-fox jumped!", "Tokenization of  unbelievably long words ."]
    table = _table(task)
    encoded = encode_task(table, spec, bert, max_length=128, words=True)
    rows = [(texts[0], texts[1]) if spec.format != "single" else (texts[0],)]
    rows += [segments for row in table.to_pylist() for segments in _segments(spec, row)]
    located = [row_words(*_offsets(bert, segments), segments) for segments in rows]
    assert [w.tolist() for per in encoded.words for w in per] == [w.tolist() for w in located[1:]]
    for segments, words in zip(rows, located):
        split = bert(*(s.split() for s in segments), is_split_into_words=True)
        assert split["input_ids"] == bert(*segments)["input_ids"]
        want = {}
        for position, (segment, word) in enumerate(zip(split.sequence_ids(), split.word_ids())):
            if word is not None:
                want[(segment, word)] = position  # the last position of each word wins
        assert {(s, w): p for s, w, p in words.tolist()} == want
        assert len(words) == sum(len(s.split()) for s in segments)
    # Multi-piece words: the last piece is chosen ("," of the first word), not the first.
    assert located[0][:2, 2].tolist() != [1, 2] and located[0][0, 2] > 2


def _offsets(tokenizer, segments):
    encoding = tokenizer(*segments, return_offsets_mapping=True)
    return encoding["offset_mapping"], encoding.sequence_ids()


@pytest.mark.parametrize("task", TASKS)
def test_same_words_line_up_across_tokenizers(bert, byte_bpe, task):
    spec = get_task(task)
    table = _table(task)
    a = encode_task(table, spec, bert, max_length=128, words=True)
    b = encode_task(table, spec, byte_bpe, max_length=128, words=True)
    assert _keys(a) == _keys(b)  # same words, same order
    assert len(_keys(a)) == sum(len(s.split()) for row in table.to_pylist() for seg in _segments(spec, row) for s in seg)
    # ... at different positions: the tokenizers really differ.
    pos_a = np.concatenate([w[:, 2] for per in a.words for w in per])
    pos_b = np.concatenate([w[:, 2] for per in b.words for w in per])
    assert not np.array_equal(pos_a, pos_b)
    # The last sub-word of the BPE tokenizer ends where the word ends.
    row = table.to_pylist()[0]
    segments = _segments(spec, row)[0]
    offsets, _ = _offsets(byte_bpe, segments)
    for segment, word, position in b.words[0][0].tolist():
        assert offsets[position][1] == [m.end() for m in re.finditer(r"\S+", segments[segment])][word]


def test_truncation_drops_only_cut_words(bert, byte_bpe):
    text = "an unbelievably long sentence, with antidisestablishmentarianism inside it ."
    words = text.split()
    for tokenizer in (bert, byte_bpe):
        full = tokenizer(words, is_split_into_words=True) if tokenizer is bert else None
        length = len(tokenizer(text)["input_ids"])
        for max_length in range(3, length + 1):
            encoding = tokenizer(text, truncation=True, max_length=max_length, return_offsets_mapping=True)
            got = row_words(encoding["offset_mapping"], encoding.sequence_ids(), (text,))
            kept = max_length - 2  # content tokens kept after [CLS] / <s>
            if full is not None:  # WordPiece: a word survives iff all of its pieces do
                ids = full.word_ids()[1:-1]
                want = [w for w in range(len(words)) if max(i for i, x in enumerate(ids) if x == w) < kept]
            else:  # byte-level: a word survives iff the kept tokens reach its last character
                ends = [end for start, end in encoding["offset_mapping"] if end > start]
                stops = np.cumsum([len(w) + 1 for w in words]) - 1
                want = [w for w in range(len(words)) if stops[w] <= max(ends, default=0)]
            assert got[:, 1].tolist() == want, (tokenizer.__class__.__name__, max_length)
            if want:
                assert got[-1, 2] <= kept
        assert len(got) == len(words)  # untruncated at full length


@pytest.mark.parametrize("task", ["synth-roles", "synth-choice"])
def test_pair_and_multiple_choice_rows(bert, task):
    """Pairs: segment 0 is text_a, 1 text_b; multiple choice: every choice, segment 0 the context, 1 its ending."""
    spec = get_task(task)
    table = _table(task)
    encoded = encode_task(table, spec, bert, max_length=128, words=True)
    want = [(row["example_id"], choice, segment, word) for row in table.to_pylist()
            for choice, segments in enumerate(_segments(spec, row))
            for segment, text in enumerate(segments) for word in range(len(text.split()))]
    assert _keys(encoded) == want
    assert {k[2] for k in want} == {0, 1} and ({k[1] for k in want} == ({0, 1, 2, 3} if spec.num_choices else {0}))


def test_max_tokens_caps_rows_deterministically(bert, encoder):
    spec = get_task("synth-roles")
    encoded = encode_task(_table("synth-roles", 9), spec, bert, max_length=128, words=True)
    full = pooled_layers(encoder, bert, encoded, ["tokens"], batch_size=4, device=CPU)
    assert len(full.word_keys) == len(_keys(encoded)) > 40
    for max_tokens, batch_size in [(40, 1), (40, 4), (13, 9), (10_000, 2)]:
        capped = pooled_layers(encoder, bert, encoded, ["tokens", "cls"], batch_size, CPU, max_tokens=max_tokens)
        n = min(max_tokens, len(full.word_keys))
        np.testing.assert_array_equal(capped.word_keys, full.word_keys[:n])
        assert len(capped.layers["cls"][0]) == 9  # per-example poolings see every example
        for got, want in zip(capped.layers["tokens"], full.layers["tokens"]):
            np.testing.assert_allclose(got, want[:n], atol=1e-5)
    with pytest.raises(LayersimError, match=r"encode_task\(\.\.\., words=True\)"):
        pooled_layers(encoder, bert, encode_task(_table("synth-roles"), spec, bert, 128), ["tokens"], 4, CPU)


def test_extraction_writes_one_row_per_word(bert, encoder, tmp_path, monkeypatch):
    spec = get_task("synth-choice")
    table = _table("synth-choice", 5)
    encoded = encode_task(table, spec, bert, max_length=128, words=True)
    metadata = {"model": "tiny-bert", "run": "orig", "task": spec.name, "split": "validation"}
    outputs = {"cls": tmp_path / "orig.cls.parquet", "tokens": tmp_path / "orig.tokens.parquet"}
    extract_activations(encoder, bert, spec, encoded, outputs, metadata, batch_size=2, device=CPU)
    tokens = ActivationTable(outputs["tokens"], expect={"pooling": "tokens"})
    assert tokens.num_rows == len(_keys(encoded)) == sum(len(w) for per in encoded.words for w in per)
    assert [tuple(k) for k in tokens.keys().tolist()] == _keys(encoded)
    labels = dict(zip(table.column("example_id").to_pylist(), table.column("label").to_pylist()))
    np.testing.assert_array_equal(tokens.labels(), [labels[i] for i in tokens.example_id])
    # Each row is the hidden state of its word's last sub-word, run alone and unpadded.
    with torch.no_grad():
        row = 0
        for i, row_texts in enumerate(_segments(spec, r) for r in table.to_pylist()):
            for c, segments in enumerate(row_texts):
                hidden = encoder(**bert(*segments, return_tensors="pt"), output_hidden_states=True).hidden_states
                positions = encoded.words[i][c][:, 2]
                for k in (0, 3):
                    np.testing.assert_allclose(tokens.layer(k)[row:row + len(positions)], hidden[k][0, positions],
                                               atol=1e-5)
                row += len(positions)
    # Left padding moves the positions (and BERT's states, whose positions start at the padding): a word
    # row is still the state of its word's last sub-word, e.g. the final word's is the "last" pooling's row.
    monkeypatch.setattr(bert, "padding_side", "left")
    left = {"last": tmp_path / "left.last.parquet", "tokens": tmp_path / "left.tokens.parquet"}
    extract_activations(encoder, bert, spec, encoded, left, {**metadata, "run": "seed1"}, batch_size=3, device=CPU)
    other, last = ActivationTable(left["tokens"]), ActivationTable(left["last"])
    tokens.check_comparable(other)
    keys = other.keys()
    final = [int(np.flatnonzero((keys[:, 0] == e) & (keys[:, 1] == c))[-1]) for e, c in zip(last.example_id, last.choice)]
    np.testing.assert_allclose(other.layer(3)[final], last.layer(3), atol=1e-6)


def test_compare_aligns_models_with_different_tokenizers(bert, byte_bpe, encoder):
    """Truncation cuts different words with each tokenizer: the aligned rows are the words both kept."""
    per_model = {}
    for label, tokenizer in (("bert", bert), ("bpe", byte_bpe)):
        parts = []
        for task in ("synth-roles", "synth-negation"):
            spec = get_task(task)
            encoded = encode_task(_table(task), spec, tokenizer, max_length=12, words=True)
            parts.append(pooled_layers(encoder, tokenizer, encoded, ["cls", "tokens"], 4, CPU, max_tokens=500))
        per_model[label] = concatenate_pooled(parts)
    keys = {label: {tuple(k) for k in p.word_keys.tolist()} for label, p in per_model.items()}
    assert keys["bert"] != keys["bpe"] and keys["bert"] & keys["bpe"]
    assert {k[0] for k in keys["bert"]} == {0, 1}  # the task index leads the keys
    aligned = models_for_pooling(per_model, "tokens")
    common = sorted(keys["bert"] & keys["bpe"])
    assert [len(layers[0]) for layers in aligned.values()] == [len(common)] * 2
    for label, reps in per_model.items():
        index = {tuple(k): r for r, k in enumerate(reps.word_keys.tolist())}
        np.testing.assert_array_equal(aligned[label][2][5], reps.layers["tokens"][2][index[common[5]]])
    assert [len(layers[0]) for layers in models_for_pooling(per_model, "cls").values()] == [12, 12]


def test_align_rows_refuses_repeats_and_disjoint_keys():
    layers = [np.zeros((2, 3), np.float32)]
    with pytest.raises(LayersimError, match="repeats the key"):
        align_rows({"a": (np.array([[0, 0, 0, 1], [0, 0, 0, 1]]), layers)})
    with pytest.raises(LayersimError, match="share no word keys"):
        align_rows({"a": (np.array([[0, 0, 0, 1]]), layers[:1]), "b": (np.array([[1, 0, 0, 1]]), layers[:1])})


def _write_tokens(path, keys, pooling="tokens", rng=np.random.default_rng(0), **write):
    with ActivationWriter(path, num_layers=1, hidden_size=4, label_type=pa.int64(),
                          metadata={"run": "orig", "task": "t", "split": "validation", "pooling": pooling}) as writer:
        for part in np.array_split(np.asarray(keys, np.int64).reshape(-1, 4), 2):  # the second may be empty
            layers = [rng.standard_normal((len(part), 4)).astype(np.float32) for _ in range(2)]
            writer.write(part[:, 0], part[:, 1], part[:, 0] % 2, layers,
                         **({"segment": part[:, 2], "word": part[:, 3]} | write))


def test_tokens_table_round_trip_and_integrity(tmp_path):
    keys = [[4, 0, 0, 0], [4, 0, 0, 1], [4, 0, 1, 0], [2, 1, 0, 0], [9, 0, 0, 7]]
    _write_tokens(tmp_path / "a.parquet", keys)
    table = ActivationTable(tmp_path / "a.parquet")
    assert table.words and table.keys().tolist() == keys
    assert table._reader.schema.names[:5] == ["example_id", "choice", "segment", "word", "label"]
    assert [a.shape for a in table.layers()] == [(5, 4), (5, 4)]
    assert sum(len(b[0]) for b in table.iter_batches(2)) == 5
    np.testing.assert_array_equal(table.labels(), [0, 0, 0, 0, 1])
    _write_tokens(tmp_path / "b.parquet", keys)
    table.check_comparable(ActivationTable(tmp_path / "b.parquet"))
    _write_tokens(tmp_path / "c.parquet", [*keys[:4], [9, 0, 0, 8]])
    with pytest.raises(LayersimError, match=r"word keys \(example_id, choice, segment, word\) differs .*row 4.*"
                                            r"\[9, 0, 0, 7\] vs \[9, 0, 0, 8\]"):
        table.check_comparable(ActivationTable(tmp_path / "c.parquet"))
    _write_tokens(tmp_path / "d.parquet", [*keys, [4, 0, 0, 1]])
    with pytest.raises(LayersimError, match=r"d.parquet row 5 repeats the key .*'word': 1"):
        ActivationTable(tmp_path / "d.parquet")
    with pytest.raises(LayersimError, match="holds words"):
        table.check_examples(np.array([4, 2, 9]))
    with pytest.raises(LayersimError, match="segment and word are required for"):
        _write_tokens(tmp_path / "e.parquet", keys, segment=None)
    with pytest.raises(LayersimError, match="segment and word are invalid in"):
        _write_tokens(tmp_path / "f.parquet", keys, pooling="cls")
    assert not (tmp_path / "e.parquet").exists() and not (tmp_path / "f.parquet").exists()
    # A table that claims pooling "tokens" without the word columns is refused by its schema.
    with ActivationWriter(tmp_path / "g.parquet", num_layers=0, hidden_size=2, label_type=pa.int64(),
                          metadata={"pooling": "cls"}) as writer:
        writer.write(np.array([1]), np.array([0]), np.array([0]), [np.zeros((1, 2), np.float32)])
    raw = pq.read_table(tmp_path / "g.parquet")
    write_parquet(with_metadata(raw, {"pooling": "tokens", "num_layers": 0, "hidden_size": 2}), tmp_path / "h.parquet")
    with pytest.raises(LayersimError, match=r"has columns \['example_id', 'choice', 'label', 'layer_00'\], expected "
                                            r"\['example_id', 'choice', 'segment', 'word', 'label', 'layer_00'\]"):
        ActivationTable(tmp_path / "h.parquet")
