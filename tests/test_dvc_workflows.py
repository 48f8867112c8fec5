"""Integration: DVC experiments and shared remotes (a local folder, an S3 server) on a tiny pipeline.

One `dvc repro` in a temporary git repo is shared by every test: the remote tests push its outputs,
clone the repo and pull them back; the experiment tests run `dvc exp run` in a clone that shares the
first repo's DVC cache, so the base model's stages come from DVC's run-cache instead of running again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dvc_project import (WORKFLOWS_TASK, assert_figure, built_project, check_freeze_outputs, configure_workflows,
                         dry_run_stages, dvc, output, project_env, run)

pytestmark = pytest.mark.integration

TASK = WORKFLOWS_TASK
FINETUNE_METRICS = f"metrics/finetune/{TASK}/seed1/metrics.json"
SIMILARITY_METRICS = f"metrics/similarity/{TASK}/metrics.json"
ACTIVATIONS = f"data/activations/tiny-bert/{TASK}/tables/seed1.cls.parquet"


@pytest.fixture(scope="module")
def base(tmp_path_factory, built_projects) -> tuple[Path, dict]:
    """The tiny project after `dvc repro` (built once per test run: tests/test_sharing.py starts from it too),
    with dvc.lock and the git-tracked outputs (metrics, plots, dvclive curves: `cache: false`) committed;
    data/ is in .gitignore and goes to DVC remotes."""
    root = tmp_path_factory.mktemp("base")
    env, _ = built_project(built_projects, root, configure_workflows, "workflows")
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "repro"], root, env)
    return root, env


def test_freeze_with_wus_recipe_trains_its_own_unfrozen_runs(base):
    """freeze as configured by default (recipe wu, layers [4, 6] of 12): Hugging Face's Trainer defaults for 3 epochs,
    as Wu et al. ran them, the unfrozen runs trained by the freeze stage itself; on the tiny model's 3 layers, 4 and 6
    of 12 are round(1.0) = 1 and round(1.5) = 2."""
    import dataclasses
    import math

    import numpy as np
    import pyarrow.parquet as pq
    from transformers import TrainingArguments

    root, _ = base
    settings = yaml.safe_load((root / "params.yaml").read_text())["freeze"]
    assert settings["recipe"] == "wu" and settings["layers"] == [4, 6] and settings["seeds"] is None
    details = {row["metric"]: row["value"] for row in json.loads(
        (root / f"plots/details/freeze/{TASK}/values.json").read_text()) if row["layer"] is None}
    assert details["metric"] == "accuracy" and details["num_layers"] == 3
    splits = root / f"data/tasks/{TASK}/splits"
    train, validation = (np.asarray(pq.read_table(splits / f"{split}.parquet").column("label").to_pylist())
                         for split in ("train", "validation"))
    trainer = {field.name: field.default for field in dataclasses.fields(TrainingArguments)}
    batch = trainer["per_device_train_batch_size"]
    assert {key[len("recipe."):]: value for key, value in details.items() if key.startswith("recipe.")} == {
        "name": "wu", "batch_size": batch, "learning_rate": trainer["learning_rate"],
        "adam_epsilon": trainer["adam_epsilon"], "warmup_steps": trainer["warmup_steps"],
        "weight_decay": trainer["weight_decay"], "max_grad_norm": trainer["max_grad_norm"],
        "max_steps": int(trainer["num_train_epochs"]) * math.ceil(len(train) / batch)}
    # Every run of seed 1 (params seeds) and configuration, its scores, the details and the headline from the rows.
    check_freeze_outputs(root, TASK, ("bottom1", "bottom2", "top1", "top2"), examples=len(validation))
    # Each run's convergence check names the task's references: the loss of predicting the train labels' shares
    # (their entropy) and the best constant predictor's validation accuracy.
    shares = [np.bincount(labels, minlength=2) / len(labels) for labels in (train, validation)]
    trivial, constant = -(shares[0] * np.log(shares[0])).sum(), shares[1].max()
    for row in json.loads((root / f"plots/freeze/{TASK}/freeze.json").read_text()):
        if "trivial predictor's" in row["reason"]:
            assert f"the trivial predictor's {trivial:.4f}" in row["reason"], row
        if "best constant predictor's" in row["reason"]:
            assert f"the best constant predictor's {constant:.3f}" in row["reason"], row
    assert_figure(root / f"plots/freeze/{TASK}/freeze.png")


def _clone(source: Path | str, dest: Path) -> dict:
    env = project_env(dest)
    run(["git", "clone", "-q", str(source), str(dest)], dest.parent, env)
    return env


def _assert_pulled_copy_is_complete(original: Path, clone: Path, env: dict) -> None:
    status = run(dvc("status"), clone, env)
    assert "up to date" in status.stdout.lower(), output(status)
    dry = run(dvc("repro", "--dry"), clone, env)
    assert not dry_run_stages(dry.stdout), output(dry)
    assert (clone / ACTIVATIONS).read_bytes() == (original / ACTIVATIONS).read_bytes()
    checkpoint = f"data/checkpoints/{TASK}/seed1/model/model.safetensors"
    assert (clone / checkpoint).read_bytes() == (original / checkpoint).read_bytes()
    # Metrics are git-tracked (cache: false): the clone has them from git, equal to the original's.
    assert json.loads((clone / FINETUNE_METRICS).read_text()) == json.loads((original / FINETUNE_METRICS).read_text())


def test_local_remote_round_trip(base, tmp_path):
    """`dvc remote add -d` a folder, commit the config, `dvc push`; a git clone then `dvc pull`s everything."""
    root, env = base
    store = tmp_path / "dvc-store"
    run(dvc("remote", "add", "-d", "shared", store), root, env)
    run(["git", "commit", "-qm", "shared remote", ".dvc/config"], root, env)
    pushed = run(dvc("push"), root, env)
    assert any(store.rglob("*")), output(pushed)

    clone = tmp_path / "clone"
    clone_env = _clone(root, clone)
    assert not (clone / ACTIVATIONS).exists()
    pulled = run(dvc("pull"), clone, clone_env)
    assert (clone / ACTIVATIONS).is_file(), output(pulled)
    _assert_pulled_copy_is_complete(root, clone, clone_env)


@pytest.fixture
def s3_server():
    """A moto S3 server on 127.0.0.1 (random port) with an empty bucket; yields its endpoint URL."""
    pytest.importorskip("dvc_s3", reason="dvc-s3 is not installed (pip install dvc-s3)")
    boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (pip install dvc-s3)")
    moto_server = pytest.importorskip("moto.server", reason="moto's server is not installed (pip install 'moto[server]')")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="layersim-test")
        yield endpoint
    finally:
        server.stop()


def _s3_credentials(root: Path, env: dict) -> None:
    # --local: credentials go to .dvc/config.local, which git ignores.
    run(dvc("remote", "modify", "--local", "s3store", "access_key_id", "testing"), root, env)
    run(dvc("remote", "modify", "--local", "s3store", "secret_access_key", "testing"), root, env)


def test_s3_remote_round_trip(base, s3_server, tmp_path):
    """The same round trip through an S3-compatible server (`endpointurl`), credentials kept out of git."""
    root, env = base
    run(dvc("remote", "add", "s3store", "s3://layersim-test/dvc-store"), root, env)
    run(dvc("remote", "modify", "s3store", "endpointurl", s3_server), root, env)
    run(dvc("remote", "modify", "s3store", "region", "us-east-1"), root, env)
    _s3_credentials(root, env)
    run(["git", "commit", "-qm", "s3 remote", ".dvc/config"], root, env)
    assert "testing" not in (root / ".dvc/config").read_text()
    pushed = run(dvc("push", "-r", "s3store"), root, env)
    assert "pushed" in (pushed.stdout + pushed.stderr).lower(), output(pushed)

    clone = tmp_path / "clone"
    clone_env = _clone(root, clone)
    _s3_credentials(clone, clone_env)
    pulled = run(dvc("pull", "-r", "s3store"), clone, clone_env)
    assert (clone / ACTIVATIONS).is_file(), output(pulled)
    _assert_pulled_copy_is_complete(root, clone, clone_env)


@pytest.fixture(scope="module")
def experiments(base, tmp_path_factory) -> dict:
    """A clone of the base project (through a bare git remote, sharing its DVC cache) with two
    experiments: `dvc exp run -n bert -S model=tiny-bert` and `-n electra -S model=tiny-electra`."""
    root, _ = base
    where = tmp_path_factory.mktemp("experiments")
    bare = where / "origin.git"
    run(["git", "clone", "-q", "--bare", str(root), str(bare)], where, project_env(where))
    work = where / "work"
    env = _clone(bare, work)
    # Reuse the base project's cache (and so its run-cache): the tiny-bert stages need not run again.
    base_cache = run(dvc("cache", "dir"), root, project_env(root)).stdout.strip()
    run(dvc("cache", "dir", "--local", base_cache), work, env)
    runs = {}
    for name, model in (("bert", "tiny-bert"), ("electra", "tiny-electra")):
        runs[name] = run(dvc("exp", "run", "-n", name, "-S", f"model={model}"), work, env)
    return {"work": work, "env": env, "bare": bare, "where": where, "runs": runs}


def _experiment_rows(shown: list) -> dict[str, dict]:
    """`dvc exp show --json` → {experiment name: its data (params, metrics, …)}."""
    rows = {}
    for commit in shown:
        for experiment in commit.get("experiments") or []:
            for rev in experiment.get("revs") or []:
                if rev.get("name"):
                    rows[rev["name"]] = rev.get("data") or {}
    return rows


def test_experiments_show_params_and_metrics(experiments):
    work, env = experiments["work"], experiments["env"]
    bert = experiments["runs"]["bert"]
    assert f"Running stage 'finetune@{TASK}-1'" not in bert.stdout, "tiny-bert should come from the run-cache\n" + output(bert)
    electra = experiments["runs"]["electra"]
    assert f"Running stage 'finetune@{TASK}-1'" in electra.stdout, output(electra)

    shown = run(dvc("exp", "show", "--json"), work, env)
    rows = _experiment_rows(json.loads(shown.stdout))
    assert {"bert", "electra"} <= set(rows), shown.stdout
    for name, model in (("bert", "tiny-bert"), ("electra", "tiny-electra")):
        data = rows[name]
        params = data["params"]["params.yaml"]["data"]
        assert params["model"] == model and params["tasks"] == [TASK], shown.stdout
        finetune = data["metrics"][FINETUNE_METRICS]["data"]
        assert 0.0 <= finetune["accuracy"] <= 1.0, shown.stdout
        similarity = data["metrics"][SIMILARITY_METRICS]["data"]
        assert "linear_cka" in similarity["cls"], shown.stdout
    # Different encoders: different fine-tuned models.
    assert rows["bert"]["metrics"][SIMILARITY_METRICS] != rows["electra"]["metrics"][SIMILARITY_METRICS]


def test_summary_columns_of_two_experiments_fit_a_terminal(experiments):
    """The documented command (docs/experiments.md): the summary metrics of both experiments in a 160-column
    terminal, nothing cut."""
    work, env = experiments["work"], {**experiments["env"], "COLUMNS": "160"}
    shown = run(dvc("exp", "show", "--no-pager", "--drop", ".*", "--keep", r"Experiment|^model$|^mean\."), work, env)
    lines = [line.rstrip() for line in shown.stdout.splitlines() if line.strip()]
    assert all(len(line) <= 160 for line in lines) and "…" not in shown.stdout, shown.stdout
    header = next(line for line in lines if "Experiment" in line).split()
    assert header == ["Experiment", "mean.accuracy", "mean.ft_orig_top", "mean.inn_advantage", "mean.skip_span",
                      "mean.tuned_drop", "mean.untuned_drop", "model"], shown.stdout
    for name, model in (("bert", "tiny-bert"), ("electra", "tiny-electra")):
        row = next(line for line in lines if f"[{name}]" in line).split()
        assert row[-1] == model and all(_is_number(value) for value in row[-7:-1]), shown.stdout


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_set_param_lists_reshape_the_fan_out(base):
    """`-S 'seeds=[1,2]' -S 'tasks=[...]'` set lists, and the matrix fans out over them: the new seed and
    task add their finetune (and download) stages; what already ran (seed 1 of the first task) does not rerun.

    `dvc exp run --dry` cannot show this: DVC runs it in a temporary copy without the cached data and
    fails ("No such file or directory: .dvc/tmp/exps/standalone/…/data/models/…"). So the overrides are
    checked on a queued experiment, and the fan-out with `dvc repro --dry` (new seeds) and `dvc status`
    (new tasks: `repro --dry` stops at the first stage that needs the new task's folder)."""
    root, env = base
    params_path = root / "params.yaml"
    before = params_path.read_text()
    queued = run(dvc("exp", "run", "--queue", "-n", "wide", "-S", "seeds=[1,2]",
                     "-S", f"tasks=[{TASK},synth-roles]"), root, env)
    try:
        shown = run(dvc("exp", "show", "--json"), root, env)
        params = _experiment_rows(json.loads(shown.stdout))["wide"]["params"]["params.yaml"]["data"]
        assert params["seeds"] == [1, 2] and params["tasks"] == [TASK, "synth-roles"], output(queued) + shown.stdout
    finally:
        run(dvc("queue", "remove", "--queued"), root, env)
    assert params_path.read_text() == before, "queueing an experiment leaves the workspace alone"

    def with_params(**values):
        params = yaml.safe_load(before)
        params.update(values)
        params_path.write_text(yaml.safe_dump(params, sort_keys=False))

    try:
        with_params(seeds=[1, 2])
        dry = run(dvc("repro", "--dry"), root, env)
        stages = dry_run_stages(dry.stdout)
        assert f"finetune@{TASK}-2" in stages and f"finetune@{TASK}-1" not in stages, output(dry)

        with_params(seeds=[1, 2], tasks=[TASK, "synth-roles"])
        listed = run(dvc("stage", "list", "--name-only"), root, env).stdout.split()
        new = {"download_task@synth-roles", f"finetune@{TASK}-2", "finetune@synth-roles-1", "finetune@synth-roles-2"}
        assert new <= set(listed), listed
        status = run(dvc("status", "--json"), root, env)
        stale = set(json.loads(status.stdout))
        unchanged = {"download_model", "download_compared", "download_paired", f"download_task@{TASK}",
                     f"finetune@{TASK}-1"}
        assert "check_params" in stale  # the gate checks every params change
        assert stale == set(listed) - unchanged, output(status)
    finally:
        params_path.write_text(before)
    assert not (root / f"data/checkpoints/{TASK}/seed2/model").exists()


def test_exp_push_and_pull_through_git_and_dvc_remotes(experiments):
    """`dvc exp push origin electra`: the experiment's git ref goes to the bare repo, its data to the
    DVC remote; a fresh clone `dvc exp pull`s it and `dvc exp apply` + `dvc checkout` restore it."""
    work, env, bare, where = experiments["work"], experiments["env"], experiments["bare"], experiments["where"]
    store = where / "exp-store"
    run(dvc("remote", "add", "--local", "-d", "store", store), work, env)
    pushed = run(dvc("exp", "push", "origin", "electra"), work, env)
    refs = run(["git", "ls-remote", str(bare), "refs/exps/*"], where, env)
    assert "electra" in refs.stdout, output(pushed) + output(refs)
    assert any(store.rglob("*")), output(pushed)

    fresh = where / "fresh"
    fresh_env = _clone(bare, fresh)
    run(dvc("remote", "add", "--local", "-d", "store", store), fresh, fresh_env)
    listed = run(dvc("exp", "list", "origin"), fresh, fresh_env)
    assert "electra" in listed.stdout, output(listed)
    pulled = run(dvc("exp", "pull", "origin", "electra"), fresh, fresh_env)
    applied = run(dvc("exp", "apply", "electra"), fresh, fresh_env)
    run(dvc("checkout"), fresh, fresh_env)
    activations = f"data/activations/tiny-electra/{TASK}/tables/seed1.cls.parquet"
    assert (fresh / activations).is_file(), output(pulled) + output(applied)
    status = run(dvc("status"), fresh, fresh_env)
    assert "up to date" in status.stdout.lower(), output(status)
    assert (fresh / activations).read_bytes() == (work / activations).read_bytes()
