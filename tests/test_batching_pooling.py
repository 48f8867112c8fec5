"""Tests for the fast paths of batching (NumPy padding) and extraction (all layers pooled at once):
each must give exactly what the straightforward version gives — ``tokenizer.pad`` and
:func:`layersim.experiments.extract.pool` layer by layer — bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layersim.data.batching import collate, encode_task, pad_rows
from layersim.errors import LayersimError
from layersim.experiments.extract import last_content_position, pool, pool_layers
from layersim.models.registry import load_tokenizer
from layersim.data.tasks import generated_table, get_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir("tiny-bert"))


def _assert_same_batch(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("task", ["synth-negation", "synth-roles", "synth-similarity", "synth-choice"])
def test_collate_pads_exactly_like_the_tokenizer(tokenizer, monkeypatch, task, side):
    monkeypatch.setattr(tokenizer, "padding_side", side)
    spec = get_task(task)
    encoded = encode_task(generated_table(spec, "validation", 12, seed=2), spec, tokenizer, max_length=64)
    for indices in ([0], [5, 1, 9, 1], range(12), np.array([11, 3])):
        batch = collate(encoded, indices, tokenizer)
        rows = [row for i in indices for row in encoded.features[i]]
        want = dict(tokenizer.pad(rows, return_tensors="pt"))
        if encoded.num_choices > 1:
            want = {k: v.view(len(indices), encoded.num_choices, -1) for k, v in want.items()}
        labels = batch.pop("labels")
        _assert_same_batch(batch, want)
        expected_labels = encoded.labels[np.asarray(indices)]
        assert labels.dtype == (torch.float32 if spec.regression else torch.int64)
        np.testing.assert_array_equal(labels.numpy(), expected_labels.astype(labels.numpy().dtype))
    lengths = {len(row["input_ids"]) for f in encoded.features for row in f}
    assert len(lengths) > 1  # the batches above needed padding


def test_pad_rows_other_keys_fall_back_to_the_tokenizer(tokenizer):
    rows = [tokenizer("a short one", return_special_tokens_mask=True),
            tokenizer("a somewhat longer sentence here", return_special_tokens_mask=True)]
    rows = [{k: list(v) for k, v in row.items()} for row in rows]
    # special_tokens_mask pads with 1, not 0: the tokenizer's rule, kept by falling back to it.
    _assert_same_batch(pad_rows(rows, tokenizer), dict(tokenizer.pad(rows, return_tensors="pt")))


def _hidden_states(num_layers: int, rows: int, length: int, hidden: int):
    generator = torch.Generator().manual_seed(0)
    states = tuple(torch.randn(rows, length, hidden, generator=generator) for _ in range(num_layers + 1))
    lengths = torch.tensor([length, 1, 3, length - 2, 2][:rows])
    attention_mask = (torch.arange(length) < lengths[:, None]).long()
    input_ids = torch.randint(1000, 2000, (rows, length), generator=generator) * attention_mask
    input_ids[:, 0] = 101
    input_ids[torch.arange(rows), lengths - 1] = 102  # [SEP] last: "last" must skip it
    return states, input_ids, attention_mask


def test_pool_layers_matches_pool_layer_by_layer_bitwise():
    states, input_ids, attention_mask = _hidden_states(num_layers=4, rows=5, length=9, hidden=16)
    last_position = last_content_position(input_ids, attention_mask, [0, 101, 102])
    pooled = pool_layers(states, input_ids, attention_mask, ("cls", "mean", "last"), [0, 101, 102])
    assert list(pooled) == ["cls", "mean", "last"]
    for pooling, layers in pooled.items():
        assert len(layers) == len(states)
        for k, (array, hidden) in enumerate(zip(layers, states)):
            want = pool(hidden, attention_mask, pooling, last_position).numpy()
            assert array.dtype == np.float32 and array.shape == (5, 16) and array.flags.c_contiguous
            np.testing.assert_array_equal(array.view(np.uint32), want.view(np.uint32), err_msg=f"{pooling} {k}")
            # A fresh block, not a view that keeps the (rows, length, hidden) states alive.
            assert not np.shares_memory(array, hidden.numpy())


def test_pool_layers_subset_and_unknown_pooling():
    states, input_ids, attention_mask = _hidden_states(num_layers=2, rows=3, length=6, hidden=8)
    assert list(pool_layers(states, input_ids, attention_mask, ["mean"], [101, 102])) == ["mean"]
    with pytest.raises(LayersimError, match=r"unknown pooling 'max'; valid poolings are: cls, mean, last, tokens\."):
        pool_layers(states, input_ids, attention_mask, ["cls", "max"], [101, 102])


def test_pool_layers_tokens_gathers_word_positions():
    states, input_ids, attention_mask = _hidden_states(num_layers=2, rows=3, length=6, hidden=8)
    rows, positions = torch.tensor([0, 0, 2, 1]), torch.tensor([1, 4, 1, 0])
    pooled = pool_layers(states, input_ids, attention_mask, ["cls", "tokens"], [101, 102], (rows, positions))
    assert [len(a) for a in pooled["cls"]] == [3] * 3 and [a.shape for a in pooled["tokens"]] == [(4, 8)] * 3
    for array, hidden in zip(pooled["tokens"], states):
        np.testing.assert_array_equal(array, hidden[rows, positions].numpy())
    with pytest.raises(LayersimError, match="pooling 'tokens' needs the"):
        pool_layers(states, input_ids, attention_mask, ["tokens"], [101, 102])


# --- decoders and XLNet: their heads read the last non-pad token --------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_last_position_of_a_last_token_head_is_the_last_non_pad_token(side):
    """[CLS] w w [SEP] and [CLS] w [SEP], padded with 0: Wu's "last" is the last word's token; a decoder's is the
    last token of all, [SEP] included, on either side of the padding."""
    rows, width = [[101, 5, 6, 102], [101, 7, 102]], 5
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, row in enumerate(rows):
        start = 0 if side == "right" else width - len(row)
        ids[i, start:start + len(row)], mask[i, start:start + len(row)] = torch.tensor(row), 1
    want_word, want_head = ([2, 1], [3, 2]) if side == "right" else ([3, 3], [4, 4])
    assert last_content_position(ids, mask, [0, 101, 102]).tolist() == want_word
    assert last_content_position(ids, mask, [0, 101, 102], last_token_head=True).tolist() == want_head


def _head_batch(name: str, tiny_model_dir):
    """A fresh classification model of tiny `name` (seeded), its tokenizer and a padded synth-negation task."""
    from layersim.models.registry import load_task_model

    folder = tiny_model_dir(name)
    spec = get_task("synth-negation")
    tokenizer = load_tokenizer(folder)
    torch.manual_seed(0)
    model = load_task_model(folder, spec).eval()
    encoded = encode_task(generated_table(spec, "validation", 6, seed=3), spec, tokenizer, max_length=32)
    return model, tokenizer, encoded


@pytest.mark.parametrize("name,padding", [("tiny-gpt2", "right"), ("tiny-llama", "right"), ("tiny-xlnet", "left")])
def test_last_pooling_is_what_the_models_own_head_reads(name, padding, tiny_model_dir):
    """The own head applied to the extracted "last" vectors of the last layer gives the model's logits: "last" is
    the token GPT2/LlamaForSequenceClassification pick (the last non-pad one) and XLNet's sequence summary reads
    (position -1, which left padding, set when the tiny XLNet is written, makes the last token)."""
    from layersim.experiments.extract import pooled_batches

    model, tokenizer, encoded = _head_batch(name, tiny_model_dir)
    assert tokenizer.padding_side == padding
    base = model.base_model
    (batch,) = pooled_batches(base, tokenizer, encoded, ["last", "mean"], 6, torch.device("cpu"))
    last = torch.from_numpy(batch.layers["last"][-1])
    with torch.no_grad():
        logits = model(**collate(encoded, range(6), tokenizer, with_labels=False)).logits
        if name == "tiny-xlnet":
            want = model.logits_proj(model.sequence_summary(last[:, None]))
        else:
            want = model.score(last)
    lengths = {len(f[0]["input_ids"]) for f in encoded.features}
    assert len(lengths) > 1  # rows were padded
    # The decoders' heads project every position, then pick: a matmul of another shape may round differently.
    torch.testing.assert_close(logits, want, rtol=1e-6, atol=1e-6)


def test_cls_is_refused_for_a_decoder_before_any_batch(tiny_model_dir):
    from layersim.experiments.extract import pooled_batches

    model, tokenizer, encoded = _head_batch("tiny-gpt2", tiny_model_dir)
    with pytest.raises(LayersimError, match=r"pooling 'cls' is not defined for a 'gpt2' model, whose classification "
                                            r"head reads the last non-pad token .*; valid poolings for it are: mean, "
                                            r"last, tokens\."):
        next(pooled_batches(model.base_model, tokenizer, encoded, ["mean", "cls"], 6, torch.device("cpu")))


def test_head_pooling_of_a_folder(tiny_model_dir):
    from layersim.params.validate import head_pooling

    assert [head_pooling(tiny_model_dir(n)) for n in ("tiny-gpt2", "tiny-xlnet", "tiny-deberta-v2")] == \
        ["last", "last", "cls"]


def test_a_tokenizer_without_pad_token_pads_with_its_end_of_sequence_token():
    """GPT-2's and Llama's tokenizers have no pad token: the folder gets eos as pad, and the config its id."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import GPT2Config, PreTrainedTokenizerFast

    from layersim.models.registry import ensure_pad_token

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"a": 0, "<eos>": 1}, unk_token="a")),
                                        eos_token="<eos>")
    model = type("Model", (), {"config": GPT2Config(pad_token_id=None)})()
    assert tokenizer.pad_token is None
    ensure_pad_token(model, tokenizer)
    assert tokenizer.pad_token == "<eos>" and tokenizer.pad_token_id == 1 and model.config.pad_token_id == 1
    model.config.pad_token_id = 0  # a config's own pad id is kept
    ensure_pad_token(model, tokenizer)
    assert model.config.pad_token_id == 0
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"a": 0}, unk_token="a")))
    with pytest.raises(LayersimError, match="neither a pad token nor an end-of-sequence token"):
        ensure_pad_token(model, bare)
