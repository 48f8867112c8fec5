"""Tests for the "tokens" pooling (layersim.data.words): one row per Penn-Treebank-like word, its last sub-word,
keyed by (example_id, choice, segment, word) so that models with different tokenizers line up.

Tokenizers of the three kinds, all offline: MiniLM's WordPiece (tiny-bert), the GPT-2-style byte-level BPE of
tiny-gpt2 and the SentencePiece-style Unigram of tiny-deberta-v2 and tiny-xlnet (layersim.models.tiny_tokenizers),
and a RoBERTa-style byte-level BPE (<s> … </s></s> … </s>) trained here on the generated tasks' sentences."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from layersim.data.batching import encode_task
from layersim.errors import LayersimError
from layersim.experiments.extract import (concatenate_pooled, extract_activations, extract_attention,
                                          models_for_pooling, pooled_layers)
from layersim.data.io import ActivationTable, ActivationWriter, with_metadata, write_parquet
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.data.tasks import generated_table, get_task
from layersim.data.words import align_rows, encode_words, ptb_words, word_attention, word_spans, words_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
TASKS = ("synth-negation", "synth-roles", "synth-choice")
KINDS = {"wordpiece": "tiny-bert", "byte_bpe": "tiny-gpt2", "unigram": "tiny-deberta-v2", "unigram_xlnet": "tiny-xlnet"}


@pytest.fixture(scope="module")
def tokenizers(tiny_model_dir):
    return {kind: load_tokenizer(tiny_model_dir(name)) for kind, name in KINDS.items()}


@pytest.fixture(scope="module")
def bert(tokenizers):
    return tokenizers["wordpiece"]


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
    """Each choice's (segment 0, segment 1) texts of one task-table row."""
    if spec.format == "single":
        return [(row["text"],)]
    if spec.format == "pair":
        return [(row["text_a"], row["text_b"])]
    return [(row["context"], ending) for ending in row["choices"]]


def _keys(encoded) -> list[tuple]:
    return [(int(encoded.example_id[i]), c, int(s), int(w)) for i, per_choice in enumerate(encoded.words)
            for c, located in enumerate(per_choice) for s, w, _ in located]


def _tokens(tokenizer, row) -> list[str]:
    return tokenizer.convert_ids_to_tokens(row["input_ids"])


@pytest.mark.parametrize("text,words", [
    ("great, honestly.", ["great", ",", "honestly", "."]),
    ("I don't know what they're doing.", ["I", "do", "n't", "know", "what", "they", "'re", "doing", "."]),
    ("\"It's great,\" she said.", ['"', "It", "'s", "great", ",", '"', "she", "said", "."]),
    ("The U.S. economy grew 3.5% -- a $1,000 rise at 10:30 a.m.; we cannot.",
     ["The", "U.S.", "economy", "grew", "3.5", "%", "--", "a", "$", "1,000", "rise", "at", "10:30", "a.m.", ";",
      "we", "can", "not", "."]),
    ("they'd've gone... (maybe) to the dogs' park!",
     ["they", "'d", "'ve", "gone", "...", "(", "maybe", ")", "to", "the", "dogs", "'", "park", "!"]),
    ("won’t", ["wo", "n’t"]),
    ("last night the hotel was nice .", ["last", "night", "the", "hotel", "was", "nice", "."]),
    ("  ", []),
])
def test_words_are_penn_treebank_like(text, words):
    assert ptb_words(text) == words
    starts, ends = word_spans(text)
    assert [text[a:b] for a, b in zip(starts, ends)] == words


@pytest.mark.parametrize("kind", KINDS)
def test_punctuation_is_its_own_point_with_every_tokenizer(tokenizers, kind):
    """"great," gives the point of "great" and one of ",": each the last sub-word of its own tokens."""
    tokenizer = words_tokenizer(tokenizers[kind])
    features, located, units = encode_words(tokenizer, [[ptb_words("It was great, honestly.")]], 64, True)
    tokens = _tokens(tokenizer, features[0])
    assert located[0][:, :2].tolist() == [[0, w] for w in range(6)]
    word_of = {int(p): int(w) for _, w, p in located[0]}
    great, comma = (tokens[p] for p, w in word_of.items() if w in (2, 3))
    assert great.endswith("at") and comma.endswith(",") and comma.lstrip("Ġ▁") == ","
    # Hand-checked positions (the tokens are printed on failure): each word's last sub-word.
    want = {"wordpiece": [1, 2, 3, 4, 5, 6], "byte_bpe": [1, 2, 5, 6, 10, 11], "unigram": [2, 3, 6, 7, 11, 12],
            "unigram_xlnet": [1, 2, 5, 6, 10, 11]}[kind]
    assert located[0][:, 2].tolist() == want, tokens
    # A word's sub-words share an attention unit; each special token is a unit of its own.
    assert len(units[0]) == len(tokens) and units[0].max() + 1 == 6 + sum(t.startswith(("[", "<")) for t in tokens)


def test_byte_level_bpe_reads_each_pre_split_word_with_its_space(tokenizers):
    gpt2 = tokenizers["byte_bpe"]
    words = words_tokenizer(gpt2)
    assert words is not gpt2 and words_tokenizer(tokenizers["wordpiece"]) is tokenizers["wordpiece"]
    pre_split = _tokens(words, words(["great", ","], is_split_into_words=True))
    assert pre_split[0].startswith("Ġ") and pre_split[-1] == "Ġ,"
    assert _tokens(gpt2, gpt2("great,"))[0] == "g"  # the model's own tokenizer is left as it was


@pytest.mark.parametrize("task", TASKS)
def test_same_words_line_up_across_tokenizers(tokenizers, byte_bpe, task):
    """The same words in the same order, at different positions, whatever the tokenizer."""
    spec = get_task(task)
    table = _table(task)
    encoded = {kind: encode_task(table, spec, tok, max_length=128, words=True)
               for kind, tok in {**tokenizers, "roberta_bpe": byte_bpe}.items()}
    keys = {kind: _keys(e) for kind, e in encoded.items()}
    assert all(k == keys["wordpiece"] for k in keys.values())
    assert [sum(len(w) for w in per) for per in encoded["byte_bpe"].words] == \
        [sum(len(w) for w in per) for per in encoded["unigram"].words]
    positions = {kind: np.concatenate([w[:, 2] for per in e.words for w in per]) for kind, e in encoded.items()}
    assert not np.array_equal(positions["wordpiece"], positions["byte_bpe"])
    assert not np.array_equal(positions["byte_bpe"], positions["unigram"])
    # WordPiece splits on punctuation anyway: on these texts (no clitics) its word input is the text's own.
    bert = encoded["wordpiece"]
    assert [f["input_ids"] for per in bert.word_features for f in per] == \
        [f["input_ids"] for per in bert.features for f in per]


def test_truncation_drops_only_cut_words(tokenizers, byte_bpe):
    text = "an unbelievably long sentence, with antidisestablishmentarianism inside it."
    words = ptb_words(text)
    for kind, tokenizer in {**tokenizers, "roberta_bpe": byte_bpe}.items():
        tokenizer = words_tokenizer(tokenizer)
        pieces = np.bincount([w for w in tokenizer(words, is_split_into_words=True).word_ids() if w is not None])
        specials = len(tokenizer(words, is_split_into_words=True)["input_ids"]) - pieces.sum()
        for max_length in range(specials + 1, specials + pieces.sum() + 1):
            _, located, _ = encode_words(tokenizer, [[words]], max_length, True)
            room = max_length - specials  # sub-words kept
            want = [w for w in range(len(words)) if np.cumsum(pieces)[w] <= room]
            assert located[0][:, 1].tolist() == want, (kind, max_length)
        assert located[0][:, 1].tolist() == list(range(len(words)))  # untruncated at full length


@pytest.mark.parametrize("task", ["synth-roles", "synth-choice"])
def test_pair_and_multiple_choice_rows(bert, task):
    """Pairs: segment 0 is text_a, 1 text_b. Multiple choice: the context's words once (choice 0), then each
    choice's ending (segment 1)."""
    spec = get_task(task)
    table = _table(task)
    encoded = encode_task(table, spec, bert, max_length=128, words=True)
    want = [(row["example_id"], choice, segment, word) for row in table.to_pylist()
            for choice, segments in enumerate(_segments(spec, row))
            for segment, text in enumerate(segments) for word in range(len(ptb_words(text)))
            if segment == 1 or choice == 0]
    assert _keys(encoded) == want
    assert {k[2] for k in want} == {0, 1}
    context = [k for k in want if k[2] == 0]
    assert {k[1] for k in context} == {0} and len(context) == len(set(context))
    if spec.num_choices:  # each ending under its own choice
        assert {k[1] for k in want if k[2] == 1} == {0, 1, 2, 3}
        first = table.to_pylist()[0]
        assert sum(k[0] == first["example_id"] for k in want) == \
            len(ptb_words(first["context"])) + sum(len(ptb_words(e)) for e in first["choices"])


def test_word_attention_sums_to_and_averages_from_sub_words():
    """Tokens [CLS] a b# c (b# and c one word): to a word, the sum over its tokens; from it, the mean."""
    maps = np.array([[[0.4, 0.3, 0.2, 0.1],
                      [0.1, 0.2, 0.3, 0.4],
                      [0.5, 0.0, 0.25, 0.25],
                      [0.0, 1.0, 0.0, 0.0]]])
    got = word_attention(maps, np.array([0, 1, 2, 2]))
    want = np.array([[[0.4, 0.3, 0.3],
                      [0.1, 0.2, 0.7],
                      [0.25, 0.5, 0.25]]])
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(word_attention(torch.from_numpy(maps), [0, 1, 2, 2]).numpy(), want)
    np.testing.assert_allclose(word_attention(maps, np.arange(4)), maps)  # one token per word: unchanged
    with pytest.raises(LayersimError, match="one unit per token"):
        word_attention(maps, [0, 1, 2])
    with pytest.raises(LayersimError, match=r"each used; got \[0, 2, 2, 2\]"):
        word_attention(maps, [0, 2, 2, 2])


def test_attention_between_words_is_written_per_unit(tokenizers, tiny_model_dir, tmp_path):
    folder = tiny_model_dir("tiny-gpt2")
    tokenizer, model = tokenizers["byte_bpe"], load_encoder(folder)
    spec = get_task("synth-roles")
    encoded = encode_task(_table("synth-roles", 3), spec, tokenizer, max_length=64, words=True)
    extract_attention(model, tokenizer, encoded, tmp_path / "w.parquet", {"run": "orig"}, 2, CPU, unit="words")
    extract_attention(model, tokenizer, encoded, tmp_path / "t.parquet", {"run": "orig"}, 2, CPU, unit="tokens")
    words, tokens = pq.read_table(tmp_path / "w.parquet"), pq.read_table(tmp_path / "t.parquet")
    units = [int(u[0].max()) + 1 for u in encoded.word_units]  # GPT-2 adds no special tokens: units are words
    assert units == [sum(len(ptb_words(t)) for t in segments) for r in _table("synth-roles", 3).to_pylist()
                     for segments in _segments(spec, r)]
    assert words.num_rows == sum(u * u for u in units)
    assert tokens.num_rows == sum(len(f[0]["input_ids"]) ** 2 for f in encoded.features) > words.num_rows
    assert words.schema.metadata[b"layersim"].count(b'"attention_unit": "words"') == 1
    # Example 0, layer 2: the word map is word_attention of the model's token map of the word input.
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ids = torch.tensor([encoded.word_features[0][0]["input_ids"]])
        token_map = model(input_ids=ids, output_attentions=True).attentions[1][0].numpy()
    n = units[0]
    stored = np.stack(words.column("layer_02").to_pylist()[:n * n]).reshape(n, n, -1).transpose(2, 0, 1)
    np.testing.assert_allclose(stored, word_attention(token_map, encoded.word_units[0][0]), atol=1e-6)
    np.testing.assert_allclose(stored.sum(-1), 1.0, atol=1e-5)
    with pytest.raises(LayersimError, match=r"unknown attention unit 'subwords' \(did you mean 'words'\?\); valid "
                                            r"attention units are: tokens, words"):
        extract_attention(model, tokenizer, encoded, tmp_path / "x.parquet", {"run": "orig"}, 2, CPU, unit="subwords")
    with pytest.raises(LayersimError, match=r"encode_task\(\.\.\., words=True\)"):
        extract_attention(model, tokenizer, encode_task(_table("synth-roles", 3), spec, tokenizer, 64),
                          tmp_path / "x.parquet", {"run": "orig"}, 2, CPU, unit="words")


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
    # Each row is the hidden state of its word's last sub-word in its word input, run alone and unpadded.
    with torch.no_grad():
        row = 0
        for i, row_texts in enumerate(_segments(spec, r) for r in table.to_pylist()):
            for c, segments in enumerate(row_texts):
                inputs = {k: torch.tensor([v]) for k, v in encoded.word_features[i][c].items()}
                hidden = encoder(**inputs, output_hidden_states=True).hidden_states
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
    assert table._reader.schema.names[:6] == ["example_id", "cluster_id", "choice", "segment", "word", "label"]
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
    with pytest.raises(LayersimError, match=r"has columns \['example_id', 'cluster_id', 'choice', 'label', 'layer_00'\], "
                                            r"expected \['example_id', 'cluster_id', 'choice', 'segment', 'word', "
                                            r"'label', 'layer_00'\]"):
        ActivationTable(tmp_path / "h.parquet")
