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



# --- issue 62: folders that are not what they seem, inputs that would give an all-NaN matrix, five tracebacks ---

@pytest.fixture
def plain_copy(tmp_path, tiny_model_dir):
    """tiny-bert as a plain save_pretrained folder (no layersim record: its files are checked, not its digest)."""
    import shutil

    folder = tmp_path / "plain"
    shutil.copytree(tiny_model_dir("tiny-bert"), folder, ignore=shutil.ignore_patterns("layersim_model.json"))
    return folder


def _sentence(error) -> str:
    message = str(error.value)
    assert "\n" not in message and message.endswith(".") and "Traceback" not in message, message
    return message


def test_a_folder_without_tokenizer_files_is_refused(plain_copy, tiny_model_dir, one_torch_thread):
    """transformers would build a 5-token vocabulary from the config alone: every word [UNK], numbers of nothing."""
    from layersim.models.model_files import tokenizer_files

    for name in tokenizer_files(plain_copy):
        (plain_copy / name).unlink()
    with pytest.raises(LayersimError) as error:
        layersim.compare_models(plain_copy, "tiny-bert", TEXTS, **QUICK)
    assert f"{plain_copy}/ has no tokenizer files" in _sentence(error) and "tokenizer.save_pretrained" in str(error.value)
    # Given its tokenizer, the same weights compare with tiny-bert as tiny-bert with itself: CKA 1 on the diagonal.
    result = layersim.compare_models(plain_copy, "tiny-bert", TEXTS, tokenizer_a=tiny_model_dir("tiny-bert"), **QUICK)
    assert np.allclose(np.diag(result["linear_cka"].matrix)[1:], 1.0)


def test_an_unknown_model_type_is_one_sentence(plain_copy, one_torch_thread):
    import json

    config = json.loads((plain_copy / "config.json").read_text())
    (plain_copy / "config.json").write_text(json.dumps({**config, "model_type": "bertx"}))
    with pytest.raises(LayersimError) as error:
        layersim.compare_models(plain_copy, "tiny-bert", TEXTS, **QUICK)
    assert "config.json has model_type 'bertx', which transformers" in _sentence(error)
    assert "e.g. bert, roberta, gpt2" in str(error.value)


def test_a_kept_state_is_named_and_how_to_compare_it(tmp_path, tiny_model_dir, one_torch_thread):
    """A kept state (step<N>/model.safetensors beside states.json) holds the encoder's weights only."""
    from layersim.models.registry import load_encoder
    from layersim.training.states import INDEX, load_state, save_state, step_folder

    checkpoint = tiny_model_dir("tiny-bert")
    states = tmp_path / "data" / "states" / "tiny-bert" / "sst2" / "seed0" / "states"
    from transformers import AutoModelForSequenceClassification

    save_state(AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2), step_folder(states, 5))
    (states / INDEX).write_text("{}")
    for given, shown in ((step_folder(states, 5), step_folder(states, 5)), (states, states / "step<N>")):
        with pytest.raises(LayersimError) as error:
            layersim.compare_models(str(given), "tiny-bert", TEXTS, **QUICK)
        assert f"model_a '{given}' is a fine-tuning run's kept state" in _sentence(error)
        assert f"load_state(load_encoder(checkpoint), '{shown}')" in str(error.value)
    # What the sentence says works: the state on its checkpoint, the checkpoint's tokenizer.
    state = load_state(load_encoder(checkpoint), step_folder(states, 5))
    result = layersim.compare_models(state, "tiny-bert", TEXTS, tokenizer_a=checkpoint, **QUICK)
    assert np.allclose(np.diag(result["linear_cka"].matrix)[1:], 1.0)


@pytest.mark.parametrize("inputs, fragment", [
    (["same text"] * 10, "inputs are 10 copies of one text ('same text')"),
    ([("a", "b")] * 10, "inputs are 10 copies of one text"),
])
def test_identical_texts_are_refused_before_any_model_runs(inputs, fragment, one_torch_thread):
    with pytest.raises(LayersimError) as error:
        layersim.compare_models("tiny-bert", "tiny-bert", inputs, **QUICK)
    assert fragment in _sentence(error) and "no similarity is defined" in str(error.value)


BATCHES = [  # (a batch of tiny-bert inputs that torch would fail on or turn into NaN, a fragment of the sentence)
    (_batch(attention_mask=torch.ones(4, 7, dtype=torch.long).index_fill_(0, torch.tensor([2]), 0)),
     "batch 0 for tiny-bert (a): attention_mask row 2 is all zeros, so that input has no token to pool"),
    (_batch(token_type_ids=torch.full((4, 7), 5)),
     "batch 0 for tiny-bert (a): token_type_ids run from 5 to 5, outside tiny-bert (a)'s 2 segment types (0 … 1)"),
    (_batch(token_type_ids=torch.full((4, 7), -1)), "token_type_ids run from -1 to -1"),
    (_batch(token_type_ids=torch.zeros(4, 7)), "token_type_ids are torch.float32; segment ids are integers"),
    ({"input_ids": torch.zeros(0, 7, dtype=torch.long), "attention_mask": torch.ones(0, 7, dtype=torch.long)},
     "batch 0 for tiny-bert (a) has 0 rows (shape (0, 7)); every batch needs at least one input"),
]


@pytest.mark.parametrize("batch, fragment", BATCHES, ids=[f[:40] for _, f in BATCHES])
def test_a_batch_torch_would_fail_on_is_one_sentence(batch, fragment, one_torch_thread):
    with pytest.raises(LayersimError) as error:
        layersim.compare_models("tiny-bert", "tiny-bert", [batch], pooling="mean", **QUICK)
    assert fragment in _sentence(error)


def test_a_zero_row_tensor_batch_is_one_sentence(one_torch_thread):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(LayersimError, match=r"batch 0 for Sequential \(a\) has 0 rows \(shape \(0, 4\)\)"):
        layersim.compare_models(model, model, [torch.zeros(0, 4)], layers_a=["0"], layers_b=["1"], **QUICK)


def test_a_model_that_tells_no_input_apart_is_refused_not_an_all_nan_matrix(one_torch_thread):
    """Distinct inputs, but every layer of model_a maps them to the same point: no number is defined."""
    constant = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with torch.no_grad():
        constant[0].weight.zero_()
    data = [torch.randn(12, 4, generator=torch.Generator().manual_seed(0))]
    with pytest.raises(LayersimError) as error:
        layersim.compare_models(constant, nn.Sequential(nn.Linear(4, 4)), data, layers_a=["0", "1"], layers_b=["0"],
                                **QUICK)
    assert "every layer of Sequential (a) is the same for each of the 12 inputs" in _sentence(error)


def test_the_layers_that_give_nan_are_named_in_the_notes(one_torch_thread):
    """CLS pooling: the embedding layer's first token is the same [CLS] for every text, so its row and column
    are NaN, and the notes say which and why."""
    result = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, **QUICK)
    nan_rows = [name for name, row in zip(result.layer_names[0], result["linear_cka"].matrix) if np.isnan(row).all()]
    assert nan_rows == ["emb"]
    assert any("NaN where a layer is the same for every input" in note and "tiny-bert (a) emb, tiny-bert (b) emb"
               in note and "cls pooling" in note for note in result.notes)
    mean = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, pooling="mean", **QUICK)
    assert np.isfinite(mean["linear_cka"].matrix).all() and not any("NaN" in note for note in mean.notes)


@pytest.mark.parametrize("cells, fragment", [
    ([("emb", "x")], "cell ('emb', 'x') is outside the 4 × 4 layer matrix; valid cells are (0 … 3, 0 … 3), or by "
                     "layer name (emb, 1, 2, 3 of model_a; emb, 1, 2, 3 of model_b)"),
    ([(True, 1)], "cell (True, 1) is outside"),
    ([(0.5, 1)], "cell (0.5, 1) is outside"),
])
def test_a_cell_that_names_no_layer_is_one_sentence(cells, fragment, one_torch_thread):
    with pytest.raises(LayersimError) as error:
        layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, permutations=None, bootstrap=5, cells=cells)
    assert fragment in _sentence(error)


def test_cells_may_name_layers(one_torch_thread):
    """('emb', '1') was a ValueError from int(); names are the result's layer_names, the same cells as indices."""
    named = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, pooling="mean", permutations=None, bootstrap=5,
                                    cells=[("emb", "1"), ("3", "2")])
    indexed = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, pooling="mean", permutations=None,
                                      bootstrap=5, cells=[(0, 1), (3, 2)])
    assert named["linear_cka"].cells == indexed["linear_cka"].cells == ((0, 1), (3, 2))
    assert np.array_equal(named["linear_cka"].interval, indexed["linear_cka"].interval)


# --- issue 64: what a load prints, a warning at few texts, a typo, a missing folder, the plot's title ---

def test_loading_prints_no_load_report_but_warns_of_random_weights(plain_copy, tmp_path, capfd, one_torch_thread):
    """A checkpoint with a task head loads as a bare encoder (its head is expected to be dropped): no LOAD REPORT
    table, no progress bar. Encoder weights the folder lacks are initialised at random: one warning names them."""
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification

    with_head = tmp_path / "with_head"
    AutoModelForSequenceClassification.from_pretrained(plain_copy, num_labels=2).save_pretrained(with_head)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (plain_copy / name).is_file():
            (with_head / name).write_bytes((plain_copy / name).read_bytes())
    capfd.readouterr()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the dropped head is expected
        layersim.compare_models(with_head, "tiny-bert", TEXTS, **QUICK)
    printed = capfd.readouterr()
    assert "LOAD REPORT" not in printed.err + printed.out and "Loading weights" not in printed.err
    weights = load_file(plain_copy / "model.safetensors")
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, plain_copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"initialised 1 weights at random that its checkpoint lacks "
                                         r"\(encoder\.layer\.1\.output\.dense\.weight\)"):
        layersim.compare_models(plain_copy, "tiny-bert", TEXTS, **QUICK)
    # Also where transformers' logs were silenced (as every stage does): the report is read, not shown.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with pytest.warns(UserWarning, match=r"initialised 1 weights at random"):
            layersim.compare_models(plain_copy, "tiny-bert", TEXTS, **QUICK)
    finally:
        transformers.logging.set_verbosity(verbosity)
    printed = capfd.readouterr().err
    assert "LOAD REPORT" not in printed and "not sharded" not in printed


def test_five_texts_give_the_few_rows_note_and_no_numpy_warning(one_torch_thread):
    """The exact null's skewness divided by (n)_k = 0 for patterns of more indices than rows (n < 6)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS[:5], pooling="mean", bootstrap=0)
    assert [w.category for w in caught] == [UserWarning] and "only 5 examples" in str(caught[0].message)
    assert np.isfinite(result["linear_cka"].p_value).all()


@pytest.mark.parametrize("name, fragment", [
    ("tiny-brt", "unknown model 'tiny-brt' (did you mean 'tiny-bert'?); valid models are: "),
    ("minilm-l7", "(did you mean 'minilm-l6'?)"),
    ("robert-base", "(did you mean 'roberta-base'?)"),
])
def test_a_mistyped_model_name_gets_a_did_you_mean(name, fragment, one_torch_thread):
    with pytest.raises(LayersimError) as error:
        layersim.compare_models(name, "tiny-bert", TEXTS, **QUICK)
    assert fragment in _sentence(error)
    assert "multiberts-0 … multiberts-24" in str(error.value) and "or a model folder's path" in str(error.value)


def test_a_missing_folder_says_that_a_path_works(plain_copy, tmp_path, one_torch_thread):
    """Not "copy it to models/<folder>/ and name it local/<folder>": compare_models takes a folder's path as is."""
    for given, fragment in ((tmp_path / "plian", f"no model folder at '{tmp_path / 'plian'}' (did you mean 'plain'?)"),
                            (str(tmp_path / "nowhere" / "model"), "no model folder at"),
                            (plain_copy / "model.safetensors", "is a file, not a model folder; pass the folder that "
                                                               f"holds it ('{plain_copy}')")):
        with pytest.raises(LayersimError) as error:
            layersim.compare_models(given, "tiny-bert", TEXTS, **QUICK)
        assert fragment in _sentence(error) and "local/<folder>" not in str(error.value)
    assert "a model is a folder's path (any save_pretrained folder)" in str(
        pytest.raises(LayersimError, layersim.compare_models, tmp_path / "plian", "tiny-bert", TEXTS, **QUICK).value)


def test_the_plots_title_fits_the_figure(one_torch_thread):
    """Rendered, the title lies inside the figure (one column is 4.2 inches: a long title was cut at both edges)."""
    result = layersim.compare_models("tiny-bert", "tiny-bert", TEXTS, pooling="mean", labels=(
        "a fine-tuned checkpoint of a long name", "tiny-llama-h48-l2 pretrained"), **QUICK)
    figure = result.plot("linear_cka")
    figure.canvas.draw()
    title = figure._suptitle.get_window_extent(figure.canvas.get_renderer())
    assert 0 <= title.x0 and title.x1 <= figure.bbox.x1 and title.y1 <= figure.bbox.y1
    assert "a fine-tuned checkpoint of a long name" in figure._suptitle.get_text().replace("\n", " ")
