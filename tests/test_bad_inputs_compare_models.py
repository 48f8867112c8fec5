"""compare_models refuses what it cannot compare the way the pipeline refuses bad params (issue 49): one
LayersimError sentence that names the bad value and what is valid, before any model runs (the arguments) or before
a batch reaches a model (its keys, dtypes, shapes and token ids) — never a traceback from deep inside torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import layersim
from layersim.errors import LayersimError

TEXTS = ["the cat sat on the mat.", "a dog barked loudly at night", "it rains today in paris",
         "stocks fell sharply on monday", "she reads a long book", "the movie was great fun",
         "nobody came to the party", "we walked home slowly", "birds sing at dawn", "he fixed the old car",
         "the soup is far too salty", "my phone is broken again"]
QUICK = {"permutations": None, "bootstrap": 0}


def _batch(**extra):
    return {"input_ids": torch.randint(5, 90, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long), **extra}


ARGUMENTS = [  # (keyword arguments over tiny-bert against itself on TEXTS, a fragment of the one sentence)
    ({"measures": None}, "measures = None is invalid; pass a measure name or a list of them"),
    ({"measures": 3}, "measures = 3 is invalid"),
    ({"measures": ["linear_cka", 2]}, "measures = ['linear_cka', 2] is invalid"),
    ({"measures": []}, "needs at least one measure; valid measures are: linear_cka"),
    ({"measures": ["cka"]}, "unknown similarity measure 'cka'"),
    ({"pooling": "first"}, "unknown pooling 'first'"),
    ({"pooling": None}, "unknown pooling None"),
    ({"batch_size": -4}, "batch_size = -4 is invalid; it must be None or a whole number from 1 to 65536"),
    ({"batch_size": 0}, "batch_size = 0 is invalid"),
    ({"batch_size": 2.5}, "batch_size = 2.5 is invalid"),
    ({"batch_size": True}, "batch_size = True is invalid"),
    ({"max_length": -1}, "max_length = -1 is invalid; it must be None or a whole number from 8"),
    ({"max_length": 4}, "max_length = 4 is invalid"),
    ({"max_length": "long"}, "max_length = 'long' is invalid"),
    ({"max_length": 256}, "max_length = 256 is too long for model_a (a bert model): its position embeddings hold 130"),
    ({"max_tokens": 0}, "max_tokens = 0 is invalid"),
    ({"layers_a": "encoder"}, "layers_a = 'encoder' is invalid; pass a non-empty list of module names"),
    ({"layers_b": []}, "layers_b = [] is invalid"),
    ({"layers_a": [3]}, "layers_a = [3] is invalid"),
    ({"layers_a": ["encoder.nowhere"]}, "encoder.nowhere"),
    ({"labels": ("a",)}, "labels ('a',) must be two different names"),
    ({"labels": ("same", "same")}, "labels ('same', 'same') must be two different names"),
    ({"labels": "ab"}, "labels 'ab' must be two different names"),
    ({"device": "tpu"}, "device = 'tpu' is not"),
    ({"device": 0}, "device = 0 is invalid; use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ({"seed": -1}, "compare_models: seed = -1 is invalid"),
    ({"permutations": 0}, "compare_models: permutations = 0 is invalid"),
    ({"permutations": 10**6}, "compare_models: permutations = 1000000 is invalid"),
    ({"bootstrap": -2}, "compare_models: bootstrap = -2 is invalid"),
    ({"significance": 1.5}, "compare_models: significance = 1.5 is invalid"),
    ({"correction": "bonferroni"}, "compare_models: correction = 'bonferroni' is invalid"),
    ({"rbf_sigma_scale": 0}, "compare_models: rbf_sigma_scale = 0 is invalid"),
    ({"svcca_variance": 2}, "compare_models: svcca_variance = 2 is invalid"),
    ({"knn_k": 0}, "compare_models: knn_k = 0 is invalid"),
    ({"shape_alpha": -0.5}, "compare_models: shape_alpha = -0.5 is invalid"),
    ({"unknown_setting": 1}, "unknown compare_models setting 'unknown_setting'"),
    ({"cells": "all"}, "cells 'all' must be 'diagonal' or a list of (layer of model_a, layer of model_b)"),
    ({"cells": [(0, 9)], "bootstrap": 5}, "cell (0, 9) is outside the 4 × 4 layer matrix"),
    ({"measures": ["mixedsim"]}, "mixedsim"),
]


@pytest.mark.parametrize("keywords, message", ARGUMENTS, ids=[str(k) for k, _ in ARGUMENTS])
def test_a_bad_argument_is_one_sentence(keywords, message, one_torch_thread):
    with pytest.raises(LayersimError) as error:
        layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, **{**QUICK, **keywords})
    assert message in str(error.value)
    assert str(error.value).count(". ") <= 2 and "\n" not in str(error.value)


INPUTS = [  # (a function making the inputs, a fragment of the one sentence): made per test, ids stable
    (lambda: "one text", "inputs is a single string"),
    (lambda: b"bytes", "inputs is a bytes"),
    (lambda: None, "inputs is a NoneType"),
    (lambda: 42, "inputs is a int"),
    (lambda: np.zeros((3, 4)), "inputs is a ndarray"),
    (lambda: torch.zeros(3, 4), "inputs is a Tensor"),
    (lambda: {"text": TEXTS}, "inputs is a dict"),
    (lambda: [1, 2, 3], "inputs[0] is of type int ('1')"),
    (lambda: ["fine", None, "text"], "inputs[1] is of type NoneType"),
    (lambda: ["fine", 3.5], "inputs[1] is of type float"),
    (lambda: ["fine", ""], "inputs[1] is an empty text"),
    (lambda: ["a text", ("a", "pair")], "inputs mix texts and pairs or hold 'a text'"),
    (lambda: [("only one",)], "inputs mix texts and pairs or hold ('only one',)"),
    (lambda: [], "inputs gave no batch"),
    (lambda: (t for t in [1, 2]), "batch 0 for tiny-bert (a) is a int"),
    (lambda: [_batch(input_ids=torch.rand(4, 7))], "input_ids are torch.float32; token ids are integers"),
    (lambda: [_batch(input_ids=torch.full((4, 7), 10**6))], "input_ids run from 1000000 to 1000000, outside"),
    (lambda: [_batch(input_ids=torch.full((4, 7), -3))], "input_ids run from -3 to -3"),
    (lambda: [_batch(attention_mask=torch.ones(4, 9, dtype=torch.long))], "attention_mask has shape (4, 9) but input_ids (4, 7)"),
    (lambda: [_batch(pixels=torch.ones(4, 7))], "'pixels' is not an input of BertModel; its inputs are: input_ids"),
    (lambda: [_batch(note="text")], "'note' is a str; every entry of a batch dict must be a tensor"),
    (lambda: [("a", "pair"), ("a", "pair", "triple")], "inputs mix texts and pairs or hold ('a', 'pair', 'triple')"),
]


@pytest.mark.parametrize("make, message", INPUTS, ids=[message[:40] for _, message in INPUTS])
def test_bad_inputs_are_one_sentence(make, message, one_torch_thread):
    with pytest.raises(LayersimError) as error:
        layersim.compare_models("tiny-bert", "tiny-bert", make(), **QUICK)
    assert message in str(error.value), str(error.value)


def test_a_long_text_is_truncated_to_the_models_positions_by_default(one_torch_thread):
    """The default max_length (the pipeline's 256) is cut to tiny-bert's 130 positions instead of failing in torch."""
    long = [" ".join(["word"] * 400)] + TEXTS
    result = layersim.compare_models("tiny-bert", "tiny-bert", long, **QUICK)
    # Layer 0's CLS state is the same embedding for every text (constant: NaN); every other cell is defined.
    assert result.num_rows == len(long) and np.isfinite(result["linear_cka"].matrix[1:, 1:]).all()


def test_few_examples_say_so(one_torch_thread):
    with pytest.warns(UserWarning, match="only 2 examples"):
        result = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS[:2], **QUICK)
    assert any("linear CKA of 2 points is 1" in note for note in result.notes)


def test_a_module_batch_that_is_not_a_tensor_is_named(one_torch_thread):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    loader = DataLoader([{"x": 1}] * 3, batch_size=None)
    with pytest.raises(LayersimError, match="'x' is a int; every entry of a batch dict must be a tensor"):
        layersim.compare_models(model, model, loader, layers_a=["0"], layers_b=["1"], **QUICK)


@pytest.mark.parametrize("model, limit", [("tiny-bert", 130), ("tiny-roberta", 129), ("tiny-mpnet", 128)])
def test_max_length_is_refused_above_the_positions_params_allow_too(model, limit, one_torch_thread):
    """The limit compare_models applies is the one params.validate holds for the pipeline (MODEL_MAX_LENGTH)."""
    from layersim.params.validate import MODEL_MAX_LENGTH

    assert MODEL_MAX_LENGTH[model] == limit
    with pytest.raises(LayersimError, match=rf"max_length = {limit + 1} is too long for model_a .* hold {limit} "):
        layersim.compare_models(model, model, TEXTS, max_length=limit + 1, **QUICK)
    assert layersim.compare_models(model, model, TEXTS, max_length=limit, **QUICK).num_rows == len(TEXTS)
