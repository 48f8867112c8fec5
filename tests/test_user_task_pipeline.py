"""Integration: the whole pipeline (`dvc repro`, offline, a tiny model) on two user tasks, a CSV of single
sentences with two classes and a TSV of sentence pairs with a regression target; an edited label makes
the task stage stale."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dvc_project import dvc, make_project, output, run, stale_stages, tiny_params

pytestmark = pytest.mark.integration

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]


def _configure(params: dict) -> None:
    tiny_params(params, model="tiny-bert", tasks=["reviews", "pairs"], seeds=[1])
    params["finetune"].update(max_steps=3, eval_every=0)
    params["extract"].update(max_train_examples=32, attention_examples=0)
    params["similarity"].update(measures={"cls": ["linear_cka", "svcca", "neuronsim"]}, attention_measures=[])
    params["compare"].update(models=[], probe_examples=10)
    params["truncate"].update(head_epochs=1)
    params["align"].update(methods=["linear", "inn"], steps=5, matrix_steps=2, inn_depth=1, inn_hidden=8, mlp_hidden=8)
    params["freeze"].update(layers=[])  # no frozen fine-tuning: the user tasks' path, not Wu's table
    params["user_tasks"] = {
        "reviews": {"train": "user_data/reviews_train.csv", "validation": "user_data/reviews_dev.csv",
                    "text": ["review"], "label": "sentiment"},
        "pairs": {"train": "user_data/pairs_train.tsv", "validation": "user_data/pairs_dev.tsv", "format": "pair",
                  "text": ["first", "second"], "label": "score", "regression": True},
    }


def _write_files(root: Path) -> None:
    rng = random.Random(0)
    for split, n in (("train", 48), ("dev", 24)):
        rows = ["review,sentiment"]
        for _ in range(n):
            words = rng.sample(WORDS, 3)
            label = "positive" if words[0] in WORDS[::2] else "negative"
            rows.append(f"\"the film was {' '.join(words)}, really\",{label}")
        (root / f"user_data/reviews_{split}.csv").write_text("\n".join(rows) + "\n")
        rows = ["first\tsecond\tscore"]
        for _ in range(n):
            a, b = rng.sample(WORDS, 2), rng.sample(WORDS, 2)
            rows.append(f"it is {' '.join(a)}\tit is {' '.join(b)}\t{len(set(a) & set(b)) * 2.5}")
        (root / f"user_data/pairs_{split}.tsv").write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("user-tasks")
    env = make_project(root, _configure)
    _write_files(root)
    run(dvc("repro"), root, env)
    return root, env


def test_the_pipeline_runs_on_user_files(project):
    root, env = project
    import pyarrow.parquet as pq

    meta = json.loads(pq.read_schema(root / "data/tasks/reviews/train.parquet").metadata[b"layersim"])
    assert meta["label_names"] == ["negative", "positive"] and meta["format"] == "single"
    assert meta["source"]["user_files"]["train"]["path"] == "user_data/reviews_train.csv"
    pairs = pq.read_table(root / "data/tasks/pairs/validation.parquet")
    assert pairs.num_rows == 24 and pairs.schema.field("label").type.bit_width == 64
    reviews = json.loads((root / "metrics/finetune/reviews/seed1.json").read_text())
    sts = json.loads((root / "metrics/finetune/pairs/seed1.json").read_text())
    assert 0.0 <= reviews["accuracy"] <= 1.0 and -1.0 <= sts["pearson"] <= 1.0 and "accuracy" not in sts
    for task in ("reviews", "pairs"):
        assert (root / f"metrics/similarity/{task}.json").is_file() and (root / f"metrics/export/{task}.json").is_file()
    assert "reviews" in (root / "report/index.html").read_text()
    assert stale_stages(root) == set(), "up to date after the repro"


def test_an_edited_label_makes_the_task_stage_stale(project):
    root, env = project
    path = root / "user_data/reviews_dev.csv"
    lines = path.read_text().splitlines()
    flipped = lines[1].replace("positive", "NEG").replace("negative", "positive").replace("NEG", "negative")
    path.write_text("\n".join([lines[0], flipped, *lines[2:]]) + "\n")
    stale = stale_stages(root)
    assert "download_task@reviews" in stale, output(run(dvc("status"), root, env))
    assert not stale & {"finetune@reviews-1", "similarity@reviews"}, "only the task stage itself changed"
