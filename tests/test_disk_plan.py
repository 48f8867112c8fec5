"""The extract stage's bytes, known before it writes (layersim.compute.disk, issue 53): the arithmetic of its
tables, checked against the quickstart's measured folder in the docs, and a refusal in one sentence, before any
work, when the volume has less free space than the tables and DVC's cache copy of them."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from layersim.compute import disk
from layersim.data.tasks import get_task
from layersim.errors import LayersimError
from layersim.params import parse_params


def _params(**extract):
    doc = {"model": "tiny-bert", "tasks": ["synth-choice"], "seeds": [1, 2], "finetune": {"max_length": 64},
           "extract": {"poolings": ["head", "mean", "tokens"], "max_tokens": 50, **extract}}
    return parse_params(doc)


def test_the_tables_bytes_are_counted_row_by_row():
    params, spec = _params(), get_task("synth-choice")  # 4 choices: a row per (example, choice)
    shape = {"num_layers": 3, "hidden_size": 32}
    runs = 4  # orig, seed1, seed2 and the RANDOM control
    validation = runs * (10 * 4 * 2 + 50)  # cls and mean per (example, choice), at most 50 word rows
    train = 3 * 20 * 4 * 2  # no control; cls (the head) and mean (align.pooling)
    expected = 2 * (validation + train) * 4 * 32 * 4  # DVC's cache copy, layers + embeddings, float32
    assert disk.extract_bytes(params, spec, {"validation": 10, "train": 20}, runs, "cls", shape) == expected
    # Without the control, and align.pooling the head's own: one train table per trained run.
    other = parse_params({"model": "tiny-bert", "tasks": ["synth-choice"], "seeds": [1], "finetune": {"max_length": 64},
                          "similarity": {"random_control": None, "measures": {"cls": ["linear_cka"]}},
                          "align": {"pooling": "cls"}, "extract": {"poolings": ["cls"]}})
    assert disk.extract_bytes(other, spec, {"validation": 10, "train": 20}, 2, "cls", shape) == \
        2 * (2 * 10 * 4 + 2 * 20 * 4) * 4 * 32 * 4


def test_a_volume_too_small_is_refused_in_one_sentence(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 2 * 10**9, 2 * 10**9))
    disk.check_free_space(tmp_path / "not" / "yet", 10**9, "rte")  # fits: nothing said
    with pytest.raises(LayersimError) as error:
        disk.check_free_space(tmp_path / "not" / "yet", 71 * 10**9, "rte")
    assert str(error.value).startswith("extract of rte would write about 71.0 GB of activation tables (with DVC's "
                                       "cache copy) but the volume of")
    assert "has 2.0 GB free; lower extract.max_train_examples" in str(error.value)
