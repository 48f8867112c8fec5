"""A broken `model: local/<folder>` (a folder of models/ the user saved by hand or with another tool): a config that
is not JSON, an unknown or missing model type, a tokenizer that is broken, missing or another model's, no weights or
weights cut short. Each is one sentence naming the file and how to save it again, raised before anything is written
(layersim.models.local_models); the user's folder is left as it was."""

from __future__ import annotations

import json
import runpy
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import transformers
import yaml

from dvc_project import REPO, repository_params, tiny_params
from layersim.errors import LayersimError
from layersim.models.registry import MODEL_INFO_FILE, snapshot_model

NAME, FOLDER = "local/my-encoder", "models/my-encoder"
SAVE_MODEL = f"save the model there again with model.save_pretrained('{FOLDER}')."
SAVE_TOKENIZER = f"save the model's own tokenizer there with tokenizer.save_pretrained('{FOLDER}')."


@pytest.fixture
def folder(tmp_path: Path, monkeypatch, tiny_model_dir) -> Path:
    """A working copy of tiny-bert saved as the user's own model models/my-encoder/ (no layersim info file)."""
    monkeypatch.chdir(tmp_path)  # local folders are read relative to the repository root, where stages run
    shutil.copytree(tiny_model_dir("tiny-bert"), tmp_path / FOLDER, ignore=shutil.ignore_patterns(MODEL_INFO_FILE))
    return tmp_path / FOLDER


def _edit_config(folder: Path, change: Callable[[dict], None]) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _remove(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).unlink()


BREAKAGES = {
    "config not JSON": (
        lambda folder: (folder / "config.json").write_text('{"model_type": "bert",'),
        f"model '{NAME}': its config {FOLDER}/config.json cannot be read (Expecting property name enclosed in double "
        f"quotes); {SAVE_MODEL}"),
    "config not an object": (
        lambda folder: (folder / "config.json").write_text('["bert"]'),
        f"model '{NAME}': its config {FOLDER}/config.json holds a list, not a JSON object; {SAVE_MODEL}"),
    "unknown model type": (
        lambda folder: _edit_config(folder, lambda config: config.update(model_type="my-own-bert")),
        f"model '{NAME}': {FOLDER}/config.json has model_type 'my-own-bert', which transformers "
        f"{transformers.__version__} does not know; save a model of a type it knows (e.g. bert, roberta, gpt2) there "
        "with save_pretrained, or upgrade transformers if the type is newer."),
    "no model type": (
        lambda folder: _edit_config(folder, lambda config: config.pop("model_type")),
        f"model '{NAME}': {FOLDER}/config.json has no model_type (save_pretrained writes one); {SAVE_MODEL}"),
    "no weights": (
        lambda folder: _remove(folder, "model.safetensors"),
        f"model '{NAME}': {FOLDER}/ has no weights file (model.safetensors or pytorch_model.bin); {SAVE_MODEL}"),
    "tokenizer.json garbage": (
        lambda folder: (folder / "tokenizer.json").write_text("garbage"),
        f"model '{NAME}': the tokenizer in {FOLDER}/ cannot be loaded (JSONDecodeError: Expecting value: line 1 "
        f"column 1 (char 0); files present: tokenizer.json, tokenizer_config.json); {SAVE_TOKENIZER}"),
    "tokenizer.json of another structure": (
        lambda folder: (folder / "tokenizer.json").write_text("{}"),
        f"model '{NAME}': the tokenizer in {FOLDER}/ cannot be loaded (KeyError: 'added_tokens'; files present: "
        f"tokenizer.json, tokenizer_config.json); {SAVE_TOKENIZER}"),
    "no tokenizer files": (
        lambda folder: _remove(folder, "tokenizer.json", "tokenizer_config.json"),
        f"model '{NAME}': {FOLDER}/ has no tokenizer files (one of tokenizer.json, tokenizer_config.json, "
        "special_tokens_map.json, added_tokens.json, vocab.txt, vocab.json, merges.txt, spiece.model, "
        f"sentencepiece.bpe.model); {SAVE_TOKENIZER}"),
    # transformers then loads the class's handful of special tokens, which would turn every word into [UNK]
    "only the tokenizer config": (
        lambda folder: _remove(folder, "tokenizer.json"),
        f"model '{NAME}': the tokenizer in {FOLDER}/ has 5 tokens but the model's embedding has 30522: it is not this "
        f"model's tokenizer (files present: tokenizer_config.json); {SAVE_TOKENIZER}"),
}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_local_folder_is_one_sentence_and_writes_nothing(folder: Path, tmp_path: Path, breakage: str) -> None:
    breaks, message = BREAKAGES[breakage]
    breaks(folder)
    before = _files(tmp_path)
    with pytest.raises(LayersimError) as raised:
        snapshot_model(NAME, tmp_path / "snapshot")
    assert str(raised.value) == message
    assert not (tmp_path / "snapshot").exists(), "checked before the snapshot folder is made"
    assert _files(tmp_path) == before, "the user's folder is read, never changed"


def test_weights_cut_short_are_one_sentence(folder: Path, tmp_path: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(LayersimError) as raised:
        snapshot_model(NAME, tmp_path / "snapshot")
    assert str(raised.value).startswith(f"model '{NAME}': {FOLDER}/ cannot be loaded as a transformers model (")
    assert str(raised.value).endswith(f"); {SAVE_MODEL}") and "\n" not in str(raised.value)
    assert not (tmp_path / "snapshot").exists()


def test_the_download_stage_refuses_a_broken_local_folder_in_one_line(folder: Path, tmp_path: Path, monkeypatch,
                                                                      capsys) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params(), model=NAME)))
    breaks, message = BREAKAGES["unknown model type"]
    breaks(folder)
    out = f"data/models/{NAME}/pretrained"
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/download_model.py"), out])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"
    written = [path for path in (tmp_path / "data").rglob("*") if path.is_file() or path.suffix == ".tmp"]
    assert written == [], "no output and no temporary beside it"


@pytest.mark.parametrize("breakage", ["config not JSON", "config not an object"])
def test_the_gate_refuses_a_broken_local_config_in_one_line(folder: Path, tmp_path: Path, monkeypatch, capsys,
                                                            breakage: str) -> None:
    """check_params (the gate every stage waits for) reads a local model's config.json for the disk plan: a broken
    one was a JSONDecodeError traceback; it is the download stage's sentence, and the gate writes nothing."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params(), model=NAME)))
    breaks, message = BREAKAGES[breakage]
    breaks(folder)
    out = tmp_path / "data" / "params_checked.txt"
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/check_params.py"), str(out)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"
    assert not out.exists()


def test_the_gate_refuses_a_missing_local_folder_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params(), model=NAME)))
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/check_params.py"), str(tmp_path / "checked.txt")])
    with pytest.raises(SystemExit):
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: model '{NAME}' needs a transformers model folder at {FOLDER}/ (config.json, weights, tokenizer "
        "files), which does not exist; save one there with save_pretrained.")
