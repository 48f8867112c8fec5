"""Integration: the whole pipeline (`dvc repro`, offline, a tiny model) on two user tasks, a CSV of single
sentences with two classes (its training file over 100 MB: no file for git) and a TSV of sentence pairs with a
regression target; the data shared the DVC way as docs/experiments.md says (a colleague's clone gets every file,
`dvc status` clean); an edited label makes the task stage stale."""

from __future__ import annotations

import base64
import json
import random
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from dvc_project import (REMOTE_PLACEHOLDER, REPO, assert_figure, droppable_top_layers, dvc, heatmap_diagonal,
                         longest_skippable_span, make_project, model_outputs, output, project_env, rescored_accuracy,
                         run, sharing_steps, shell, stale_stages, tiny_params, with_venv_commands)

pytestmark = pytest.mark.integration

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]
TASKS = ("reviews", "pairs")
PER_PREMISE = 3  # pairs rows per premise: one cluster of the nulls and intervals (user_tasks.pairs.group)
LARGE = 100 * 2**20  # bytes of the reviews training file: over what git hosts take (GitHub: 100 MB)


def _configure(params: dict) -> None:
    tiny_params(params, model="tiny-bert", tasks=["reviews", "pairs"], seeds=[1])
    params["download"].update(max_train_examples=48)  # the first 48 of the large file's rows
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
                  "text": ["first", "second"], "label": "score", "regression": True, "group": "premise"},
    }


def _write_files(root: Path) -> None:
    rng = random.Random(0)
    for split, n in (("train", 48), ("dev", 24)):
        rows = ["review,sentiment"]
        for _ in range(n):
            words = rng.sample(WORDS, 3)
            label = "positive" if words[0] in WORDS[::2] else "negative"
            rows.append(f"\"the film was {' '.join(words)}, really\",{label}")
        with open(root / f"user_data/reviews_{split}.csv", "w") as out:
            out.write("\n".join(rows) + "\n")
            filler = "".join(f"\"the film was {WORDS[k % 8]} and {WORDS[k * 3 % 8]}, row {k:07d}\",positive\n"
                             for k in range(20_000))
            while split == "train" and out.tell() < LARGE:  # rows past the first 48: the same file, larger
                out.write(filler)
        rows = ["first\tsecond\tscore\tpremise"]  # three pairs share each first sentence (their premise)
        for k in range(n):
            if k % PER_PREMISE == 0:
                a = rng.sample(WORDS, 2)
            b = rng.sample(WORDS, 2)
            rows.append(f"it is {' '.join(a)}\tit is {' '.join(b)}\t{len(set(a) & set(b)) * 2.5}\tp{k // PER_PREMISE}")
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
    meta = json.loads(pq.read_schema(root / "data/tasks/reviews/splits/train.parquet").metadata[b"layersim"])
    assert meta["label_names"] == ["negative", "positive"] and meta["format"] == "single"
    assert meta["source"]["user_files"]["train"]["path"] == "user_data/reviews_train.csv"
    pairs = pq.read_table(root / "data/tasks/pairs/splits/validation.parquet")
    assert pairs.num_rows == 24 and pairs.schema.field("label").type.bit_width == 64
    reviews = json.loads((root / "metrics/finetune/reviews/seed1/metrics.json").read_text())
    sts = json.loads((root / "metrics/finetune/pairs/seed1/metrics.json").read_text())
    assert "accuracy" not in sts and "pearson" not in reviews
    # Each score is its checkpoint's own, re-scored here on the validation file's rows with transformers alone: the
    # classifier's argmax, the regression head's one output against the scores (Pearson's r).
    validation = {task: pq.read_table(root / f"data/tasks/{task}/splits/validation.parquet").to_pydict()
                  for task in TASKS}
    checkpoint = {task: root / f"data/checkpoints/{task}/seed1/model" for task in TASKS}
    assert reviews["accuracy"] == pytest.approx(rescored_accuracy(checkpoint["reviews"], validation["reviews"]), abs=1e-6)
    predicted = model_outputs(checkpoint["pairs"], validation["pairs"])
    assert predicted.shape == (24, 1)
    assert sts["pearson"] == pytest.approx(np.corrcoef(predicted[:, 0], validation["pairs"]["label"])[0, 1], abs=1e-4)
    # The summary's means over the two tasks, from each task's own outputs: a task score per metric (accuracy is
    # never averaged with a correlation), the FT–ORIG top layer (cls, linear CKA), the droppable top layers and the
    # longest skippable span within tolerance of each task's full score, and the INN's advantage over linear.
    params = yaml.safe_load((root / "params.yaml").read_text())
    full = {"reviews": reviews["accuracy"], "pairs": sts["pearson"]}
    per_task = {task: {} for task in TASKS}
    for task in TASKS:
        heatmap = json.loads((root / f"plots/similarity/{task}/heatmaps/cls.json").read_text())
        diagonal = heatmap_diagonal(heatmap, "FT–ORIG", "linear CKA")
        per_task[task]["ft_orig_top"] = diagonal[max(diagonal)]
        rows = json.loads((root / f"plots/truncate/{task}/truncate.json").read_text())
        for variant in ("untuned", "tuned"):
            per_task[task][f"{variant}_drop"] = droppable_top_layers(rows, variant, full[task],
                                                                     params["truncate"]["tolerance"])
        rows = json.loads((root / f"plots/skip/{task}/skip.json").read_text())
        per_task[task]["skip_span"] = longest_skippable_span(rows, full[task], params["skip"]["tolerance"])
        errors = json.loads((root / f"plots/align/{task}/errors.json").read_text())
        first = errors[0]["kind"]  # the headline's kind of pair: align.pairs' first
        error = {method: np.mean([row["relative_error"] for row in errors if row["method"] == method
                                  and row["kind"] == first]) for method in ("linear", "inn")}
        per_task[task]["inn_advantage"] = error["linear"] - error["inn"]
    summary = json.loads((root / "metrics/summary.json").read_text())
    expected = {"accuracy": reviews["accuracy"], "pearson": sts["pearson"]} | {
        key: np.mean([per_task[task][key] for task in TASKS]) for key in per_task["reviews"]}
    assert summary["mean"].keys() == expected.keys()
    assert [summary["mean"][key] for key in expected] == pytest.approx(list(expected.values()), abs=2e-6)
    own_check = sum(not metrics["convergence"]["converged"] for metrics in (reviews, sts))  # one seed: no sibling
    assert summary["finetune_runs"] == {"total": 2, "not_converged": own_check}
    # The report names both tasks, in its intro and as sections, and embeds each task's figures as written.
    page = (root / "report/index.html").read_text()
    assert "tasks reviews, pairs;" in page
    for task in TASKS:
        assert f'<h2 id="{task}">{task}</h2>' in page
        for figure in (f"similarity/{task}/heatmaps/cls.png", f"diagonals/{task}/curves/cls.png",
                       f"export/{task}/export.png", f"skip/{task}/skip.png", f"align/{task}/errors.png"):
            assert_figure(root / "plots" / figure, min_size=(400, 300))
            assert base64.b64encode((root / "plots" / figure).read_bytes()).decode("ascii") in page, figure
    # The pairs' premise (user_tasks.pairs.group) reaches the similarity stage's null through the task and
    # activation tables: 8 premises of 3 pairs are its blocks; the reviews, one row per example, are permuted as rows.
    units = {task: {row["metric"].split(".")[-1]: row["value"] for row in json.loads(
        (root / f"plots/details/similarity/{task}/values.json").read_text()) if row["metric"].startswith("cls.null_unit.")}
        for task in TASKS}
    assert units["pairs"] == {"unit": "examples sharing their premise", "blocks": 24 // PER_PREMISE, "rows": 24,
                              "movable": 1.0}
    assert units["reviews"] == {"unit": "row", "blocks": 24, "rows": 24, "movable": 1.0}
    for task in TASKS:
        assert (root / f"metrics/similarity/{task}/metrics.json").is_file() and (root / f"metrics/export/{task}/metrics.json").is_file()
    assert stale_stages(root) == set(), "up to date after the repro"


def user_data_steps() -> str:
    """docs/experiments.md's block that hands a user's data files to DVC ("Your own data")."""
    page = (REPO / "docs/experiments.md").read_text(encoding="utf-8")
    section = page[page.index("## Your own data"):]
    return next(block for block in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M) if "dvc add" in block)


def test_a_colleague_gets_the_user_data_through_dvc(project, tmp_path):
    """The documented steps as written (the file name replaced by this project's four): `dvc add`, `dvc repro`,
    then the sharing block; the colleague's clone has the 100 MB file from the remote, nothing stale."""
    root, env = project
    env = with_venv_commands(env)
    assert (root / "user_data/reviews_train.csv").stat().st_size >= LARGE
    files = " ".join(f"user_data/{name}" for name in ("reviews_train.csv", "reviews_dev.csv", "pairs_train.tsv",
                                                       "pairs_dev.tsv"))
    shell(user_data_steps().replace("user_data/reviews.csv", files), root, env)
    origin = tmp_path / "origin.git"
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], tmp_path, env)
    run(["git", "remote", "add", "origin", str(origin)], root, env)
    run(["git", "push", "-q", "-u", "origin", "main"], root, env)  # as tests/test_sharing.py: a repository with a remote
    owner, colleague = sharing_steps()
    shell(owner.replace(REMOTE_PLACEHOLDER, str(tmp_path / "dvc-remote")), root, env)
    assert run(["git", "status", "--porcelain"], root, env).stdout == ""
    tracked = run(["git", "ls-files", "user_data"], root, env).stdout.split()
    assert "user_data/reviews_train.csv.dvc" in tracked and "user_data/reviews_train.csv" not in tracked
    desk = tmp_path / "colleague"
    desk.mkdir()
    clone = desk / re.search(r"git clone <repo> (\S+)", colleague).group(1)
    clone_env = {**project_env(clone), "PATH": env["PATH"]}  # the clone's own src first on the path
    shell(colleague.replace("<repo>", str(origin)), desk, clone_env)
    assert (clone / "user_data/reviews_train.csv").read_bytes() == (root / "user_data/reviews_train.csv").read_bytes()
    assert "Data and pipelines are up to date." in run(dvc("status"), clone, clone_env).stdout
    repro = run(dvc("repro"), clone, clone_env)
    assert "Running stage" not in repro.stdout, output(repro)


def test_an_edited_label_makes_the_task_stage_stale(project):
    root, env = project
    path = root / "user_data/reviews_dev.csv"
    lines = path.read_text().splitlines()
    flipped = lines[1].replace("positive", "NEG").replace("negative", "positive").replace("NEG", "negative")
    path.write_text("\n".join([lines[0], flipped, *lines[2:]]) + "\n")
    stale = stale_stages(root)
    assert "download_task@reviews" in stale, output(run(dvc("status"), root, env))
    assert not stale & {"finetune@reviews-1", "similarity@reviews"}, "only the task stage itself changed"
