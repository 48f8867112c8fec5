"""The extract stage's bytes, known before it writes (layersim.data.disk, issue 53): the arithmetic of its
tables, checked against the quickstart's measured folder in the docs, and a refusal in one sentence, before any
work, when the volume has less free space than the tables and DVC's cache copy of them."""

from __future__ import annotations

import runpy
import shutil
import sys
from collections import namedtuple

import pytest
import yaml

from dvc_project import REPO, repository_params, tiny_params
from layersim.data import disk
from layersim.data.tasks import get_task
from layersim.errors import LayersimError
from layersim.params import load_params, parse_params


def _params(**extract):
    doc = {"model": "tiny-bert", "tasks": ["synth-choice"], "seeds": [1, 2], "finetune": {"max_length": 64},
           "extract": {"poolings": ["head", "mean", "tokens"], "max_tokens": 50, **extract}}
    return parse_params(doc)


def test_the_tables_bytes_are_counted_row_by_row():
    params, spec = _params(), get_task("synth-choice")  # 4 choices: a row per (example, choice)
    shape = {"num_layers": 3, "hidden_size": 32}
    runs = 4  # orig, seed1, seed2 and the RANDOM control
    validation = runs * 10 * 4 * 2  # cls and mean per (example, choice)
    words = runs * 50  # at most 50 word rows
    train = 3 * 20 * 4 * 2  # no control; cls (the head) and mean (align.pooling)
    # The workspace's: layers + embeddings; extract.table_precision auto (the default): example rows float16 (2 bytes),
    # word rows 24-bit integers (3 bytes); float32 and float16 for every table alike.
    expected = (validation + train) * 4 * 32 * 2 + words * 4 * 32 * 3
    assert disk.extract_bytes(params, spec, {"validation": 10, "train": 20}, runs, "cls", shape) == expected
    for precision, size in (("float32", 4), ("float16", 2), ("int24", 3)):
        counted = disk.extract_bytes(_params(table_precision=precision), spec, {"validation": 10, "train": 20}, runs,
                                     "cls", shape)
        assert counted == (validation + train + words) * 4 * 32 * size
    # Without the control, and align.pooling the head's own: one train table per trained run.
    other = parse_params({"model": "tiny-bert", "tasks": ["synth-choice"], "seeds": [1], "finetune": {"max_length": 64},
                          "similarity": {"random_control": None, "measures": {"cls": ["linear_cka"]}},
                          "align": {"pooling": "cls"}, "extract": {"poolings": ["cls"]}})
    assert disk.extract_bytes(other, spec, {"validation": 10, "train": 20}, 2, "cls", shape) == \
        (2 * 10 * 4 + 2 * 20 * 4) * 4 * 32 * 2


def test_a_volume_too_small_is_refused_in_one_sentence(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 2 * 10**9, 2 * 10**9))
    disk.check_free_space(tmp_path / "not" / "yet", 10**9 - 1, "rte")  # fits with DVC's default copy: nothing said
    with pytest.raises(LayersimError) as error:
        disk.check_free_space(tmp_path / "not" / "yet", 35_500_000_000, "rte")
    assert str(error.value).startswith("extract of rte would write about 71.0 GB of activation tables (with DVC's "
                                       "cache copy) but the volume of")
    assert "has 2.0 GB free; lower extract.max_train_examples" in str(error.value)
    assert str(error.value).endswith("link DVC's cache (`dvc config cache.type hardlink,symlink`).")


def test_extracts_own_check_counts_the_cache_copy_as_the_plan_does(tmp_path, monkeypatch):
    """The stage's check and the plan apply one rule (disk.project_copies) to the project's .dvc/config: a linked
    cache (this repository's hardlink,symlink) holds no second copy of the tables, DVC's default copies them."""
    from layersim.plan import copies

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 3 * 10**9, 3 * 10**9))
    (tmp_path / ".dvc").mkdir()
    out = tmp_path / "data" / "activations" / "tiny-bert" / "rte" / "tables"
    with pytest.raises(LayersimError, match="about 4.0 GB of activation tables .with DVC's cache copy."):
        disk.check_free_space(out, 2 * 10**9, "rte")  # no cache.type: DVC's default reflink,copy copies on ext4
    assert copies(tmp_path) == 2
    (tmp_path / ".dvc" / "config").write_text("[cache]\n    type = hardlink,symlink\n")
    assert copies(tmp_path) == 1
    disk.check_free_space(out, 2 * 10**9, "rte")  # the workspace's 2 GB only: fits in 3 GB
    with pytest.raises(LayersimError) as error:
        disk.check_free_space(out, 4 * 10**9, "rte")
    assert "about 4.0 GB of activation tables but the volume" in str(error.value)
    assert "hardlink" not in str(error.value)
    (tmp_path / ".dvc" / "config.local").write_text("[cache]\n    type = copy\n")  # config.local outranks config
    with pytest.raises(LayersimError, match="with DVC's cache copy"):
        disk.check_free_space(out, 2 * 10**9, "rte")
    assert disk.project_copies(REPO) == 1  # this repository links its cache


# --- the params gate: the whole plan against the volume, before any model stage -------------------------------

def _usage(free: int):
    usage = namedtuple("usage", "total used free")
    return lambda path: usage(10**13, 10**13 - free, free)


def _run_gate(root, monkeypatch, capsys, free: int) -> tuple[int, str]:
    """stages/check_params.py in the project at `root` (DVC runs it before every other stage) with `free` bytes free."""
    monkeypatch.chdir(root)
    monkeypatch.setattr(shutil, "disk_usage", _usage(free))
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/check_params.py"), "data/params.checked"])
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exited:
        code = exited.code
    return code, capsys.readouterr().err


@pytest.fixture
def tiny_project(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params())))
    return tmp_path


def test_the_gate_refuses_a_plan_larger_than_the_free_space_in_one_sentence(tiny_project, monkeypatch, capsys):
    code, err = _run_gate(tiny_project, monkeypatch, capsys, free=10**6)  # 1 MB: the tiny plan needs tens of MB
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1, err
    sentence = errors[0]
    assert sentence.startswith("error: this run's plan writes about ")
    assert "(its outputs and DVC's copy of them in .dvc/cache) but the volume of" in sentence  # DVC's default cache
    assert "has 1.0 MB free; shrink it with extract.table_precision: float16, extract.max_train_examples" in sentence
    assert "dvc config cache.type hardlink,symlink" in sentence and sentence.count(". ") == 0
    assert not (tiny_project / "data" / "params.checked").exists()  # so DVC starts no later stage


def test_the_gate_passes_when_the_plan_fits_and_counts_no_cache_copy_with_linked_cache(tiny_project, monkeypatch,
                                                                                         capsys):
    from layersim.plan import check_fits

    assert _run_gate(tiny_project, monkeypatch, capsys, free=10**12)[0] == 0
    assert (tiny_project / "data" / "params.checked").exists()
    params = load_params(tiny_project / "params.yaml")
    assert "DVC's copy of them" in check_fits(params, tiny_project)  # DVC's default reflink,copy on ext4
    (tiny_project / ".dvc").mkdir()
    (tiny_project / ".dvc" / "config").write_text("[cache]\n    type = hardlink,symlink\n")
    assert "DVC's copy" not in check_fits(params, tiny_project)


def test_a_task_whose_size_is_unknown_before_download_does_not_block(tiny_project, monkeypatch):
    from layersim.plan import check_fits, known_tasks

    (tiny_project / "user_data").mkdir()
    (tiny_project / "user_data" / "reviews.csv").write_text("review,stars\ngood,pos\nbad,neg\n")
    params = parse_params({**tiny_params(repository_params()), "tasks": ["synth-negation", "reviews"],
                           "user_tasks": {"reviews": {"train": "user_data/reviews.csv", "validation_fraction": 0.5,
                                                      "text": ["review"], "label": "stars"}}})
    monkeypatch.chdir(tiny_project)
    assert known_tasks(params, tiny_project).tasks == ("synth-negation",)
    monkeypatch.setattr(shutil, "disk_usage", _usage(10**12))
    assert check_fits(params, tiny_project).startswith("this run's plan writes about")
