"""`model: data/models` (a folder of the repository written as if it were a hub id): transformers would read the
folder, not the hub, and fail inside a tokenizer; params validation refuses it in one sentence
(layersim.models.registry refuses a model name that is a path on disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dvc_project import repository_params, tiny_params
from layersim.errors import LayersimError
from layersim.params import parse_params


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the stages run at the repository root
    (tmp_path / "data/models/tiny-bert/pretrained").mkdir(parents=True)
    return tmp_path


def test_a_folder_given_as_model_is_refused(repo: Path) -> None:
    with pytest.raises(LayersimError) as raised:
        parse_params(tiny_params(repository_params(), model="data/models"))
    assert str(raised.value) == (
        "params.yaml: model = 'data/models' is not a Hugging Face hub id (owner/name) but a path; a model folder on "
        "disk is named local/<folder> for the folder models/<folder>/ of the repository: copy it to models/<folder>/ "
        "and name it local/<folder>.")


def test_a_compared_folder_is_refused_too(repo: Path) -> None:
    doc = tiny_params(repository_params())
    doc["compare"]["models"] = ["data/models"]
    with pytest.raises(LayersimError, match=r"^params.yaml: compare.models has 'data/models', which is not a Hugging Face hub id .* but a path;"):
        parse_params(doc)


def test_the_same_hub_id_without_such_a_folder_is_a_hub_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_params(tiny_params(repository_params(), model="data/models")).model == "data/models"
