"""Helpers for integration tests that run the real DVC pipeline in a temporary git repository.

``make_project(dest, configure)`` copies this repository (what git tracks, and the untracked files it does not
ignore outside the folders a pipeline run writes: never what a user's run left) into ``dest``, lets ``configure`` edit the parsed params.yaml, and commits the copy to a fresh git repo.
``run`` and ``dvc`` run commands with their output captured and shown when they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import fork_server
import yaml

from dvc_yaml import from_root, lock_path

REPO = Path(__file__).resolve().parents[1]
# Environment variable naming a DVC cache folder that every project of a test run shares: a stage that
# another project already ran with the same command, deps and params is restored from DVC's run-cache.
SHARED_CACHE = "LAYERSIM_TEST_DVC_CACHE"


def run(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd``; on failure (with ``check``) raise with its stdout and stderr."""
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({result.returncode}) in {cwd}:\n"
                             f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")
    return result


def dvc(*args: str) -> list[str]:
    """The command line of ``dvc <args>`` with this interpreter's DVC (through the fork server, once started)."""
    return [fork_server.python(), "-m", "dvc", *map(str, args)]


def output(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr of a finished command, for assertion messages."""
    return f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def project_env(root: Path) -> dict:
    """Environment for commands in a project copy: offline, no analytics, a git identity, the copy's own
    ``src`` first on the path, and its stages' ``python`` run by the test process's fork server
    (tests/fork_server.py)."""
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env.pop("DVC_ROOT", None)
    return fork_server.environment(env)


def with_venv_commands(env: dict) -> dict:
    """`env` with this interpreter's commands (dvc, ray) on PATH, as after `pip install` in a virtual
    environment, and the fork server's `python` still before them (else every stage imports torch anew)."""
    return fork_server.environment({**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"})


def tiny_params(params: dict, *, model: str = "tiny-bert", tasks: list[str] = ("synth-negation",),
                seeds: list[int] = (1, 2)) -> dict:
    """Shrink the paper configuration in place to a tiny model and a small built-in task (seconds per stage)."""
    params.update(model=model, tasks=list(tasks), seeds=list(seeds))
    params["download"].update(generated_train_examples=200, generated_validation_examples=60)
    params["finetune"].update(batch_size=8, learning_rate=1e-3, warmup_steps=2, max_steps=6, eval_every=3,
                              max_length=32)
    params["extract"].update(max_train_examples=100)
    params["similarity"].update(permutations=20, bootstrap=20)
    params["truncate"].update(head_epochs=2)
    params["align"].update(steps=20, matrix_steps=5, synthetic_steps=20, synthetic_rows=200, inn_hidden=16,
                           mlp_hidden=16, batch_size=32)
    params.setdefault("export", {}).update(selection_examples=100, timing_examples=8, timing_repeats=1)
    return params


def _committed(name: str, root: Path = REPO) -> str | None:
    """The file as HEAD holds it, or None outside a git checkout or for a file HEAD lacks."""
    found = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=root, capture_output=True, text=True)
    return found.stdout if found.returncode == 0 else None


def _key_paths(doc, prefix: str = "") -> set[str]:
    if not isinstance(doc, dict):
        return set()
    return {f"{prefix}{key}" for key in doc} | {path for key, value in doc.items()
                                                for path in _key_paths(value, f"{prefix}{key}.")}


def repository_params_text(root: Path = REPO) -> str:
    """params.yaml as committed. `bash quickstart.sh` is a DVC experiment: it leaves its own values (and its
    dvc.lock) in the working tree, which the tests must not inherit. A working tree whose params.yaml declares
    other keys than HEAD's (a key being added or removed) is read as it is."""
    working = (root / "params.yaml").read_text()
    committed = _committed("params.yaml", root)
    if committed is None or _key_paths(yaml.safe_load(committed)) != _key_paths(yaml.safe_load(working)):
        return working
    return committed


def repository_params() -> dict:
    return yaml.safe_load(repository_params_text())


def run_output_folders(root: Path = REPO) -> set[str]:
    """The top folders a pipeline run writes into: those of every path dvc.yaml declares (each stage's outs,
    metrics and plots, and the top-level metrics and plots: timings/, environment/)."""
    pipeline = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))
    declared = [entry for stage in pipeline["stages"].values() for kind in ("outs", "metrics", "plots")
                for entry in stage.get(kind) or ()]
    declared += [*(pipeline.get("metrics") or ()), *(pipeline.get("plots") or ())]
    paths = [entry if isinstance(entry, str) else next(iter(entry)) for entry in declared]
    return {Path(from_root(path)).parts[0] for path in paths}


def repository_files(root: Path = REPO) -> list[str]:
    """The files of the repository at `root` a test project is made of: what git tracks (as the working tree holds
    it: a change being made is tested), and untracked files git does not ignore (a new module not yet added)
    except in the folders a run writes into (:func:`run_output_folders`). `bash quickstart.sh` leaves there
    records that are no output, so that no .gitignore of DVC's hides them (environment/*.json, timings/), and
    DVC's own .gitignore files: a copy holding them would start with a user's run."""
    def listed(*options: str) -> list[str]:
        found = subprocess.run(["git", "ls-files", "-z", *options], cwd=root, capture_output=True, text=True,
                               check=True).stdout.split("\0")
        return [name for name in found if name and (root / name).is_file()]

    outputs = run_output_folders(root)
    untracked = [name for name in listed("--others", "--exclude-standard") if Path(name).parts[0] not in outputs]
    return sorted({*listed("--cached"), *untracked})


def copy_repository(dest: Path, root: Path = REPO) -> None:
    """Copy :func:`repository_files` of the repository at `root` into ``dest``, with params.yaml as
    :func:`repository_params_text` reads it and dvc.lock as committed (an experiment run here rewrites both)."""
    for name in repository_files(root):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
    lock = _committed("dvc.lock", root)
    if lock is not None:
        (dest / "dvc.lock").write_text(lock)
    elif (dest / "dvc.lock").exists():
        (dest / "dvc.lock").unlink()
    (dest / "params.yaml").write_text(repository_params_text(root))


def make_project(dest: Path, configure: Callable[[dict], object], *, share_cache: bool = True) -> dict:
    """Copy the repository into ``dest``, edit its params with ``configure(params)``, and commit it to a
    fresh git repository. Returns the environment to run commands in it with. With `share_cache` (and a
    shared cache set up by tests/conftest.py) it uses the test run's one DVC cache and run-cache; a test
    that needs its stages to really run passes False."""
    copy_repository(dest)
    # The project links DVC's cache into the workspace (.dvc/config: cache.type hardlink,symlink). Tests damage
    # outputs in place on purpose, and share one cache: through a link that damage would reach the cache, so a
    # test project copies (DVC's default on ext4), as it did before the link; config.local outranks config.
    (dest / ".dvc" / "config.local").write_text("[cache]\n    type = copy\n")
    params = repository_params()
    configure(params)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = project_env(dest)
    run(["git", "init", "-q", "-b", "main"], dest, env)
    run(["git", "add", "-A"], dest, env)
    run(["git", "commit", "-qm", "copy"], dest, env)
    shared = os.environ.get(SHARED_CACHE)
    if shared and share_cache:  # one DVC cache, and so one run-cache, for every project of a test run (tests/conftest.py)
        run(dvc("cache", "dir", "--local", shared), dest, env)
    return env


def built_project(builds: Path, dest: Path, configure: Callable[[dict], object], name: str) -> tuple[dict, str]:
    """Copy into ``dest`` the project ``make_project(..., configure)`` after its first ``dvc repro`` (not
    committed); returns the copy's environment and that repro's output. The project is built once per test
    run, as ``builds/name``, under a file lock that every xdist worker shares (tests/conftest.py), so test
    modules that start from one configuration copy it instead of running its stages again. The build itself
    is never handed out: a module that edits its copy cannot change what another one copies."""
    from filelock import FileLock

    source, log = builds / name, builds / f"{name}.repro.log"
    with FileLock(str(builds / f"{name}.lock")):
        if not log.exists():  # a build that failed left no log: the next module tries again, and fails alike
            shutil.rmtree(source, ignore_errors=True)
            source.mkdir(parents=True)
            repro = run(dvc("repro"), source, make_project(source, configure))
            log.write_text(repro.stdout + repro.stderr)
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    return project_env(dest), log.read_text()


def dry_run_stages(text: str) -> set[str]:
    """Names of the stages that ``dvc repro --dry`` (or ``dvc exp run --dry``) output says it would run."""
    return {line.split("'")[1] for line in text.splitlines() if line.startswith("Running stage")}


@contextmanager
def _dvc_repo(root: Path):
    """DVC's Python API (what `dvc status` and `dvc repro --dry` call) on the project at ``root``, in this
    process: test_incremental asks ~40 times, and a `dvc` process costs about a second more each time. DVC
    resolves stage paths against the working directory, so it is ``root`` for the duration."""
    from dvc.repo import Repo

    before = os.getcwd()
    os.chdir(root)
    try:
        with Repo(".") as repo:
            yield repo
    finally:
        os.chdir(before)


def stale_stages(root: Path) -> set[str]:
    """Stages that ``dvc status`` reports as changed themselves (their params, deps or outs)."""
    with _dvc_repo(root) as repo:
        return set(repo.status())


# The stage every other depends on (dvc.yaml): it validates params.yaml and its output never changes, so it
# is stale after any params change and reruns nothing after it.
GATE = "check_params"


def stages_to_rerun(root: Path) -> tuple[set[str], set[str]]:
    """The stages ``dvc status`` reports as changed, and those ``dvc repro`` would run: the changed ones and
    every stage downstream of them (``--dry --force-downstream``: a dry run cannot know that a rerun stage
    changes its outputs), but not downstream of the params gate, whose output is constant
    (tests/test_incremental.py checks that with a real repro). One DVC repo for both: its index is built once."""
    with _dvc_repo(root) as repo:
        stale = set(repo.status())
        targets = sorted(stale - {GATE})
        if not targets:
            return stale, stale
        would_run = repo.reproduce(targets, dry=True, force_downstream=True, downstream=True)
    return stale, {stage.addressing for stage in would_run} | (stale & {GATE})


@contextmanager
def edited_params(root: Path, **changes) -> Iterator[dict]:
    """params.yaml of the project at ``root`` with dotted keys set (``edited_params(root, **{"skip.tolerance":
    0.5})``) for the duration of the block, then restored byte for byte. Yields the edited params."""
    path = root / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    for dotted, value in changes.items():
        *sections, key = dotted.split(".")
        target = params
        for section in sections:
            target = target[section]
        target[key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        yield params
    finally:
        path.write_text(original)


def command_output(root: Path, env: dict, stage: str, produced: str, scratch: Path) -> Path:
    """The file `produced` (a path in the project) that only `stage`'s command writes, outside every output DVC
    restores (a timings file). The project's own when its first repro ran the command; when that repro restored
    the stage from the shared run-cache instead (no command ran, so no such file), a copy of the project in
    `scratch` runs it with ``dvc repro --force`` (which skips the run-cache), and that copy's file is returned:
    the project itself is left as it was."""
    if (root / produced).is_file():
        return root / produced
    copy = scratch / f"{root.name}-forced"
    shutil.copytree(root, copy, symlinks=True)
    result = run(dvc("repro", "--force", "--single-item", stage), copy, project_env(copy))
    assert f"Running stage '{stage}'" in result.stdout, output(result)
    assert (copy / produced).is_file(), f"{stage} ran and wrote no {produced}:\n{output(result)}"
    return copy / produced


def assert_figure(path: Path, min_size: tuple[int, int] = (600, 400)) -> None:
    """`path` is a PNG image at least `min_size` (width, height) pixels, not blank: many colours (lines, text and
    fills are anti-aliased) and at least 2 % of its pixels unlike the background (its top-left pixel)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", f"{path}: {image.format}, not a PNG"
        width, height = image.size
        pixels = np.asarray(image.convert("RGB"))
    assert width >= min_size[0] and height >= min_size[1], f"{path}: {width} x {height} pixels, under {min_size}"
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    drawn = float(np.any(pixels != pixels[0, 0], axis=-1).mean())
    assert colours >= 100 and drawn >= 0.02, f"{path} looks blank: {colours} colours, {drawn:.1%} of pixels drawn"


def check_freeze_outputs(root: Path, task: str, labels: tuple[str, ...], *, examples: int,
                         unfrozen: dict[int, float] | None = None) -> None:
    """The freeze stage's outputs of `task` against its plot rows (one per run, frozen or not): every run of every
    configuration (`labels`, e.g. "bottom1") and seed there, each score an accuracy over `examples` validation rows
    (k / examples); each configuration's details (its seeds' scores, their mean, the change against the unfrozen runs
    of the same seeds, the runs not converged) and the metrics file re-derived from the rows. `unfrozen` (seed →
    score): the finetune stage's runs that recipe "finetune" compares with; None for recipe "wu", whose unfrozen runs
    the stage trains itself. A run is flagged as not converged by its own check (its reason then says why) or when
    its score is more than SEED_GAP below its only sibling seed's (layersim.training.convergence)."""
    import json

    import numpy as np

    from layersim.training.convergence import SEED_GAP

    rows = json.loads((root / f"plots/freeze/{task}/freeze.json").read_text())
    details = json.loads((root / f"plots/details/freeze/{task}/values.json").read_text())
    full = {row["metric"]: row["value"] for row in details if row["layer"] is None}
    seeds = sorted({row["seed"] for row in rows})
    assert len(seeds) <= 2, "the sibling rule below is the two-seed case"
    assert sorted((row["config"], row["seed"]) for row in rows) == sorted(
        (config, seed) for config in ("unfrozen", *labels) for seed in seeds)
    run = {(row["config"], row["seed"]): row for row in rows}
    for row in rows:
        assert round(row["score"] * examples, 4) % 1 == 0, row  # an accuracy: k of `examples` right
        assert row["converged"] == (row["reason"] == ""), row
        sibling = [run[row["config"], seed]["score"] for seed in seeds if seed != row["seed"]]
        if sibling and row["score"] < sibling[0] - SEED_GAP - 1e-6:
            assert not row["converged"] and "below the median" in row["reason"], row
        if row["config"] == "unfrozen":
            assert row["unfrozen_score"] is None and row["unfrozen_converged"] is None
            if unfrozen is not None:
                assert row["score"] == approx6(unfrozen[row["seed"]])
        else:
            base = run["unfrozen", row["seed"]]
            assert (row["unfrozen_score"], row["unfrozen_converged"]) == (base["score"], base["converged"]), row
    unfrozen_rows = [run["unfrozen", seed] for seed in seeds]
    assert full["unfrozen.score"] == round(float(np.mean([row["score"] for row in unfrozen_rows])), 6)
    assert full["unfrozen.not_converged"] == sum(not row["converged"] for row in unfrozen_rows)
    assert full["unfrozen.baseline"] == ("the finetune stage's run of the same recipe and seed" if unfrozen is not None
                                         else "trained in the freeze stage with the same recipe")
    headline = {}
    for label in labels:
        side, layers = re.fullmatch(r"(bottom|top)(\d+)", label).groups()
        mine = [run[label, seed] for seed in seeds]
        assert (full[f"{label}.side"], full[f"{label}.layers"]) == (side, int(layers))
        assert {seed: full[f"{label}.seeds.{seed}"] for seed in seeds} == approx6(
            {seed: row["score"] for seed, row in zip(seeds, mine)})
        assert full[f"{label}.score"] == approx6(np.mean([row["score"] for row in mine]))
        change = float(np.mean([row["score"] - row["unfrozen_score"] for row in mine]))
        assert full[f"{label}.score_change"] == approx6(change)
        assert full[f"{label}.unfrozen_score"] == approx6(np.mean([row["unfrozen_score"] for row in mine]))
        assert full[f"{label}.not_converged"] == sum(not row["converged"] for row in mine)
        assert full[f"{label}.unfrozen_not_converged"] == sum(not row["unfrozen_converged"] for row in mine)
        headline[label] = {"score_change": approx6(change),
                           "backward_flops_saved": full[f"{label}.backward_flops_saved"]}
    headline["not_converged"] = sum(not row["converged"] for row in rows)
    assert json.loads((root / f"metrics/freeze/{task}/metrics.json").read_text()) == headline


def approx6(expected):
    """pytest.approx for values the stages round to 6 digits."""
    import pytest

    return pytest.approx(expected, abs=2e-6)


# Pipeline outputs re-derived from the files a stage wrote (plot rows, checkpoints), for the integration tests.


def model_outputs(folder: Path, table: dict, max_length: int = 32):
    """The logits of the task model saved in `folder` on a split's columns (`text`, or `text_a` and `text_b` for
    pairs), computed as a user would: transformers alone, the folder's own tokenizer, one padded batch."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = (table["text"],) if "text" in table else (table["text_a"], table["text_b"])
    with torch.no_grad():
        batch = tokenizer(*texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return model(**batch).logits.numpy()


def rescored_accuracy(folder: Path, table: dict) -> float:
    """The accuracy of the classifier in `folder` on a split's columns: :func:`model_outputs`' argmax."""
    import numpy as np

    return float((model_outputs(folder, table).argmax(-1) == np.asarray(table["label"])).mean())


def heatmap_diagonal(rows: list[dict], comparison: str, measure: str) -> dict[int, float | None]:
    """Layer k against layer k of one comparison and measure, from a similarity heatmap's plot rows."""
    return {row["x_layer"]: row["similarity"] for row in rows if row["comparison"] == comparison
            and row["measure"] == measure and row["x_layer"] == row["y_layer"]}


def droppable_top_layers(rows: list[dict], variant: str, full: float, tolerance: float) -> int:
    """How many top layers the `variant` of truncate's plot rows (one per seed and exit layer) can drop: the number
    of layers above the lowest exit layer whose seed-mean score is within `tolerance` of `full` (none within: 0)."""
    import numpy as np

    layers = sorted({row["layer"] for row in rows})
    mean = {k: np.mean([row["score"] for row in rows if row["variant"] == variant and row["layer"] == k])
            for k in layers}
    within = [k for k in layers if mean[k] >= full - tolerance]
    return layers[-1] - within[0] if within else 0


def longest_skippable_span(rows: list[dict], full: float, tolerance: float) -> int:
    """The length of the longest span [first, last] in skip's plot rows (one per seed and span) whose seed-mean
    score is within `tolerance` of `full`; 0 when none is."""
    import numpy as np

    spans = {(row["first"], row["last"]) for row in rows}
    mean = {span: np.mean([row["score"] for row in rows if (row["first"], row["last"]) == span]) for span in spans}
    return max([last - first + 1 for (first, last), score in mean.items() if score >= full - tolerance], default=0)


# The two tiny projects that several test modules build once per test run (built_project) and share.

PIPELINE_TASK, PIPELINE_SEEDS = "synth-negation", [1, 2]
WORKFLOWS_TASK = "synth-negation"


def configure_pipeline(params: dict) -> None:
    """The "pipeline" project (tests/test_pipeline.py, test_incremental.py, test_pretraining_seeds.py, test_plan.py):
    every stage on tiny-bert with two seeds, compare, every kind of align pair, attention and freeze."""
    tiny_params(params, model="tiny-bert", tasks=[PIPELINE_TASK], seeds=PIPELINE_SEEDS)
    params["extract"].update(attention_examples=60)
    measures = ["linear_cka", "svcca", "pwcca", "neuronsim"]
    params["similarity"].update(measures={"cls": measures, "tokens": measures})
    params["compare"].update(models=["tiny-roberta"], probe_examples=20)
    # Every kind of pair; tiny-bert-seed1/2 stand in for MultiBERTs (tiny-bert from other init seeds).
    params["align"].update(pairs=[["FT1", "FT2"], ["ORIG", "FT1"], ["tiny-bert-seed1", "tiny-bert-seed2"],
                                  ["tiny-bert-seed2", "ORIG"]], attention=True,
                           pretraining_models=["tiny-bert", "tiny-bert-seed1"])  # tests/test_pretraining_seeds.py
    # Wu's recipe (its own unfrozen run, 3 epochs) is tested in tests/test_freezing.py and, end to end, in the
    # "workflows" project (tests/test_dvc_workflows.py); here the finetune stage's
    # runs are the unfrozen baseline.
    params["freeze"].update(recipe="finetune")
    # Issue 52: LoRA (rank 2) beside full fine-tuning, the same seeds, in this one experiment.
    params["finetune"].update(compare_methods=["lora"])
    params["finetune"]["lora"].update(rank=2)
    params["finetune"].update(keep_states=2)  # of max_steps 6: the states of steps 2 and 4 (the dynamics stage)
    params["grounding"].update(enabled=True, bootstrap=100)  # which measure to trust: both tests (two seeds)


def configure_workflows(params: dict) -> None:
    """The "workflows" project (tests/test_dvc_workflows.py, test_sharing.py, test_browser.py,
    test_fresh_interpreters.py): every stage on tiny-bert with one seed, few measures, freeze as by default."""
    tiny_params(params, model="tiny-bert", tasks=[WORKFLOWS_TASK], seeds=[1])
    params["download"].update(generated_train_examples=64, generated_validation_examples=32)
    params["finetune"].update(max_steps=3, eval_every=0)
    params["extract"].update(max_train_examples=32, attention_examples=0)
    # svcca and neuronsim give the localization score: without them plots/localization/* are empty
    # folders, which git cannot carry, so a clone would never be up to date.
    params["similarity"].update(measures={"cls": ["linear_cka", "svcca", "neuronsim"]}, attention_measures=[])
    params["compare"].update(models=[], probe_examples=10)
    params["truncate"].update(head_epochs=1)
    params["align"].update(methods=["linear", "inn"], steps=5, matrix_steps=2, inn_depth=1, inn_hidden=8,
                           mlp_hidden=8)
    # On, so that the report page and `dvc plots show` carry its table and figure (tests/test_browser.py): off, its
    # ranking.json is an empty plot. One seed: layer monotonicity alone.
    params["grounding"].update(enabled=True, bootstrap=100)


# The documented sharing steps (docs/experiments.md, "Sharing results").

REMOTE_PLACEHOLDER = "/mnt/shared/layersim-dvc"
COLLEAGUE = "# a colleague"
SHARING_PAGE = "docs/experiments.md"


def sharing_steps() -> tuple[str, str]:
    """The owner's and the colleague's commands from the docs' sharing block, as written."""
    page = (REPO / SHARING_PAGE).read_text(encoding="utf-8")
    section = page[page.index("## Sharing results"):]
    section = section[:section.index("\n## ", 1)]
    blocks = [b for b in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M) if "dvc remote add" in b]
    assert blocks, f"{SHARING_PAGE}: the sharing section has no bash block that adds a remote"
    owner, colleague = blocks[0].split(COLLEAGUE)
    assert REMOTE_PLACEHOLDER in owner and "<repo>" in colleague, blocks[0]
    return owner, colleague


def shell(script: str, cwd: Path, env: dict) -> None:
    """Run the documented lines with bash, stopping at the first that fails (as a user would notice)."""
    run(["bash", "-euo", "pipefail", "-c", script], cwd, env)


def lock_outs(root: Path) -> dict[str, dict]:
    """Every stage's outputs in dvc.lock: {stage: {path from the root: md5}} (the path guard's stages record theirs
    from their own wdir)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {stage: {lock_path(out["path"]): out.get("md5") for out in entry.get("outs", [])}
            for stage, entry in lock["stages"].items()}
