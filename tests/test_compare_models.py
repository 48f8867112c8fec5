"""layersim.compare_models: one call on two models gives the extract + similarity stages' numbers for the same inputs
and pooling (matrix, null, corrected p-values, diagonal intervals), and reads any nn.Module by hooks over texts or a
DataLoader."""

from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import layersim
from layersim.similarity.inference.bootstrap import AUTO_INTERVAL
from layersim.compute.device import resolve_device
from layersim.data.batching import encode_task
from layersim.data.io import ActivationTable
from layersim.data.tasks import TaskSpec
from layersim.errors import LayersimError
from layersim.experiments.extract import extract_activations
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.params.schema import ExtractParams, FinetuneParams, SimilarityParams
from layersim.similarity.comparisons import block, stacked_matrix, stacked_null
from layersim.similarity.results import Uncertainty, phang_result, settings

CPU = resolve_device("cpu")
TEXTS = ["the cat sat on the mat.", "a dog barked loudly at night", "it rains today in paris",
         "stocks fell sharply on monday", "she reads a long book", "the movie was great fun",
         "nobody came to the party", "we walked home slowly", "birds sing at dawn", "he fixed the old car",
         "the soup is far too salty", "my phone is broken again"]
MEASURES = ("linear_cka", "debiased_cka")
PERMUTATIONS, RESAMPLES = 20, 10


@pytest.fixture(scope="module")
def finetuned_copy(tmp_path_factory, tiny_model_dir):
    """tiny-bert with every weight moved by 10% of its tensor's spread: a stand-in for a fine-tuned copy, saved as a
    plain transformers folder (no layersim metadata), as a user's own checkpoint would be."""
    encoder, tokenizer = load_encoder(tiny_model_dir("tiny-bert")), load_tokenizer(tiny_model_dir("tiny-bert"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(0.1 * p.std().nan_to_num() * torch.randn(p.shape, generator=generator))
    folder = tmp_path_factory.mktemp("finetuned")
    encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _stage_layers(folder, pooling, tmp_path, name):
    """The extract stage's activation table of TEXTS for the model in `folder`, read back as the similarity stage
    reads it: per-layer float32 arrays."""
    from transformers import AutoModel, AutoTokenizer

    encoder, tokenizer = AutoModel.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    spec = TaskSpec("texts", "single", ("accuracy",), ("0",))
    table = pa.table({"example_id": np.arange(len(TEXTS), dtype=np.int64), "text": TEXTS,
                      "label": np.zeros(len(TEXTS), dtype=np.int64)})
    encoded = encode_task(table, spec, tokenizer, FinetuneParams().max_length, words=pooling == "tokens")
    path = tmp_path / f"{name}.{pooling}.parquet"
    extract_activations(encoder, tokenizer, spec, encoded, {pooling: path}, {"run": name}, ExtractParams().batch_size,
                        CPU)
    table = ActivationTable(path)
    return table.layers(), table.example_id


@pytest.mark.parametrize("pooling", ["mean", "tokens"])
def test_equals_the_extract_and_similarity_stages(finetuned_copy, tiny_model_dir, tmp_path, pooling, one_torch_thread):
    """FT (a plain folder) against ORIG (a registry name): the block FT–ORIG of the similarity stage's computation
    (phang_result over the stage's activation tables), to 1e-10: matrix, null mean, p-values (raw and corrected
    over the block) and the diagonal's bootstrap interval."""
    with pytest.warns(UserWarning, match="a cell of debiased_cka is above chance only together with at least 15"):
        result = layersim.compare_models(finetuned_copy, "tiny-bert", TEXTS, MEASURES, pooling, device="cpu",
                                         permutations=PERMUTATIONS, bootstrap=RESAMPLES, labels=("FT", "ORIG"))
    ft, groups = _stage_layers(finetuned_copy, pooling, tmp_path, "ft")
    orig, _ = _stage_layers(tiny_model_dir("tiny-bert"), pooling, tmp_path, "orig")
    models = {"ORIG": orig, "FT[1]": ft}
    sizes = {label: len(layers) for label, layers in models.items()}
    options, _ = settings(SimilarityParams())
    uncertainty = Uncertainty(PERMUTATIONS, RESAMPLES, 0)
    assert result.num_rows == len(ft[0]) and result.layer_names[0] == ["emb", "1", "2", "3"]
    for measure in MEASURES:
        opts = options.get(measure, {})
        stage = phang_result(measure, stacked_matrix(measure, models, **opts), sizes, models=models,
                             null=None, uncertainty=uncertainty, groups=groups if pooling == "tokens" else None,
                             options=opts)
        ft_orig = next(c for c in stage.comparisons if c.key == "ft_orig")
        mine = result[measure]
        assert np.isfinite(mine.matrix).all() and mine.matrix.shape == (4, 4)
        np.testing.assert_allclose(mine.matrix, ft_orig.matrix, rtol=0, atol=1e-10)
        np.testing.assert_allclose(mine.null_mean, ft_orig.null_mean, rtol=0, atol=1e-10)
        np.testing.assert_allclose(mine.p_value, ft_orig.p_value, rtol=0, atol=1e-10)
        np.testing.assert_allclose(mine.p_adjusted, ft_orig.p_adjusted, rtol=0, atol=1e-10)
        if AUTO_INTERVAL[measure] is None:  # no interval method covers for it: none in either, and the note says
            assert mine.interval is None and ft_orig.interval is None
            assert any(note.startswith(f"{measure}: no interval") for note in result.notes)
            continue
        assert mine.cells == tuple((k, k) for k in range(4))
        np.testing.assert_allclose(np.array(mine.interval), np.array(ft_orig.interval), rtol=0, atol=1e-10)
        assert mine.interval_method == ft_orig.interval_method == AUTO_INTERVAL[measure]
    frame = result.to_frame()
    assert len(frame) == 2 * 16 and set(frame["measure"]) == set(MEASURES)
    with_interval = [m for m in MEASURES if AUTO_INTERVAL[m] is not None]
    assert with_interval and frame.query("layer_a == layer_b and measure in @with_interval")["ci_low"].notna().all()


def test_hooked_layers_are_the_hidden_states(tiny_model_dir, one_torch_thread):
    """Hooks on BERT's layer modules give hidden states 1 … L: the hooked matrix is the default one without the
    embedding row (a (rows, tokens, hidden) output pooled like the stage's)."""
    folder = tiny_model_dir("tiny-bert")
    encoder, tokenizer = load_encoder(folder), load_tokenizer(folder)
    names = [f"encoder.layer.{k}" for k in range(3)]
    for pooling in ("mean", "last"):
        full = layersim.compare_models(encoder, encoder, TEXTS, "linear_cka", pooling, tokenizer_a=tokenizer,
                                       tokenizer_b=tokenizer, permutations=None, bootstrap=0, device="cpu")
        hooked = layersim.compare_models(encoder, encoder, TEXTS, "linear_cka", pooling, layers_a=names,
                                         tokenizer_a=tokenizer, tokenizer_b=tokenizer, permutations=None,
                                         bootstrap=0, device="cpu")
        np.testing.assert_allclose(hooked["linear_cka"].matrix, full["linear_cka"].matrix[1:], rtol=0, atol=1e-10)
        np.testing.assert_allclose(np.diag(full["linear_cka"].matrix), 1.0, rtol=0, atol=1e-12)
        assert hooked.layer_names[0] == names and hooked["linear_cka"].null_mean is None
        assert hooked.labels == ("BertModel (a)", "BertModel (b)")


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(fc1=nn.Linear(5, 8), act=nn.ReLU(), fc2=nn.Linear(8, 6))).double()


@pytest.mark.filterwarnings("ignore:compare_models. with fdr_bh")  # few permutations: fast, and exact all the same
def test_any_module_over_a_dataloader(one_torch_thread):
    """Two MLPs over a DataLoader of (inputs, labels): the matrix and null of their hooked layers are those of
    the layers computed by hand; a shuffling loader gives the same matrix (each batch runs through both models)."""
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    data = TensorDataset(x, torch.zeros(40))
    a, b = _mlp(0), _mlp(1)
    names = ["fc1", "act", "fc2"]
    kwargs = dict(layers_a=names, layers_b=names[::2], permutations=PERMUTATIONS, bootstrap=0, device="cpu")
    result = layersim.compare_models(a, b, DataLoader(data, batch_size=16), ("linear_cka", "procrustes"),
                                     cells=[(0, 0), (2, 1)], **kwargs)
    with torch.no_grad():
        hand = {"A": [a.fc1(x), a.act(a.fc1(x)), a(x)], "B": [b.fc1(x), b(x)]}
    hand = {label: [layer.float().numpy() for layer in layers] for label, layers in hand.items()}
    sizes = {"A": 3, "B": 2}
    for measure in ("linear_cka", "procrustes"):
        mine = result[measure]
        assert mine.matrix.shape == (3, 2) and mine.interval is None
        np.testing.assert_allclose(mine.matrix, block(stacked_matrix(measure, hand), sizes, "A", "B"), rtol=0,
                                   atol=1e-10)
        null = stacked_null(measure, hand, permutations=PERMUTATIONS, seed=0)
        np.testing.assert_allclose(mine.p_value, block(null.p_value, sizes, "A", "B"), rtol=0, atol=1e-10)
    shuffled = layersim.compare_models(a, b, DataLoader(data, batch_size=16, shuffle=True), "linear_cka",
                                       **kwargs | {"permutations": None})
    np.testing.assert_allclose(shuffled["linear_cka"].matrix, result["linear_cka"].matrix, rtol=0, atol=1e-10)
    chosen = layersim.compare_models(a, a, DataLoader(data, batch_size=16), "linear_cka", layers_a=names,
                                     layers_b=names, cells=[(0, 0), (2, 1)], permutations=None, bootstrap=RESAMPLES)
    cka = chosen["linear_cka"]
    assert cka.cells == ((0, 0), (2, 1)) and len(cka.interval[0]) == 2
    np.testing.assert_allclose(np.diag(cka.matrix), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("call,message", [
    (dict(measures=("linear_cka", "cosine_cka")), "unknown similarity measure 'cosine_cka'"),
    (dict(pooling="max"), "unknown pooling 'max'"),
    (dict(correction="bonferroni"), "compare_models: correction = 'bonferroni' is invalid"),
    (dict(permutaions=10), "unknown compare_models setting 'permutaions'"),
    (dict(cells=[(0, 0, 1)]), "must be 'diagonal' or a list of (layer of model_a, layer of model_b)"),
])
def test_bad_arguments_are_refused_before_any_model_loads(call, message):
    with pytest.raises(LayersimError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layersim.compare_models("no-such-model", "no-such-model", TEXTS, **call)


def test_what_a_module_cannot_give_is_refused(one_torch_thread):
    loader = DataLoader(TensorDataset(torch.zeros(8, 5, dtype=torch.float64)), batch_size=4)
    with pytest.raises(LayersimError, match="not a transformers model: name the modules to compare with layers_a"):
        layersim.compare_models(_mlp(0), _mlp(1), loader)
    with pytest.raises(LayersimError, match="model_b has no module 'fc3'; valid names are: fc1, act, fc2"):
        layersim.compare_models(_mlp(0), _mlp(1), loader, layers_a=["fc1"], layers_b=["fc3"])
    with pytest.raises(LayersimError, match="texts need model_a's tokenizer"):
        layersim.compare_models(_mlp(0), _mlp(1), TEXTS, layers_a=["fc1"], layers_b=["fc1"])
    with pytest.raises(LayersimError, match="pooling 'tokens' needs texts"):
        layersim.compare_models(_mlp(0), _mlp(1), loader, pooling="tokens", layers_a=["fc1"], layers_b=["fc1"])
    with pytest.raises(LayersimError, match=r"cell \(3, 0\) is outside the 1 × 1 layer matrix"):
        layersim.compare_models(_mlp(0), _mlp(1), loader, layers_a=["fc1"], layers_b=["fc1"], cells=[(3, 0)])


@pytest.mark.parametrize("given, label", [
    ("minilm-l6", "minilm-l6"),
    ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    ("path/to/finetuned-minilm", "path/to/finetuned-minilm"),
    # A pipeline checkpoint: its own folder's name ("model", "seed1") alone says nothing; its path is too long.
    ("data/checkpoints/synth-similarity/seed1/model", "…/seed1/model"),
    ("/home/me/runs/2026-11-27/minilm-finetuned-on-sst2", "…/2026-11-27/minilm-finetuned-on-sst2"),
])
def test_a_model_is_labelled_as_the_user_named_it(given, label, tmp_path, monkeypatch):
    """Issue 50: the plot named a fine-tuned folder by its last part (the task's folder). Relative paths are read
    from an empty folder: the repository's own may hold a user's run (the quickstart's seed1/model)."""
    from layersim.models.any_model import model_label

    monkeypatch.chdir(tmp_path)
    assert model_label(given) == label


def test_a_fine_tuned_checkpoint_is_labelled_by_its_task_and_seed(tmp_path):
    from layersim.models.any_model import model_label
    from layersim.models.registry import MODEL_INFO_FILE

    folder = tmp_path / "data/checkpoints/synth-similarity/seed1/model"
    folder.mkdir(parents=True)
    (folder / MODEL_INFO_FILE).write_text('{"task": "synth-similarity", "seed": 1, "digest": "d"}')
    assert model_label(str(folder)) == "FT:synth-similarity seed 1"
