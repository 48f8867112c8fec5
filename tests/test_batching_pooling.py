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
