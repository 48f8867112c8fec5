"""Integration: a params change reruns exactly the stages that read that param, and what runs after them.

One tiny project is `dvc repro`-ed once and committed; each case edits one key of params.yaml, asks DVC
what is stale (`dvc status --json`: the stages whose own params changed) and what `dvc repro` would run
(`dvc repro --dry --force-downstream`: those and every stage after them, since a dry run cannot know
that a rerun stage will change its outputs), then restores params.yaml byte for byte.

tests/test_pipeline.py checks, with a plain `dvc repro --dry`, that a few analysis params rerun only
their own stage; here every analysis section is covered with both views, params that several stages
share, and a change to fine-tuning that must rerun everything after it; and one change is reproduced
for real.
"""

from __future__ import annotations

import json

import pytest

from dvc_project import (GATE, PIPELINE_TASK as TASK, built_project, configure_pipeline, dvc, edited_params, output,
                         run, stale_stages, stages_to_rerun)

pytestmark = pytest.mark.integration

DOWNLOAD = {"download_model", "download_compared", "download_paired", f"download_task@{TASK}"}
# finetune_pretrained: the pretraining-seed models (align.pretraining_models) fine-tuned on the task
# finetune_compared: the LoRA runs of finetune.compare_methods (tests/test_pipeline.py's project holds [lora])
FINETUNE = {f"finetune@{TASK}-1", f"finetune@{TASK}-2", f"finetune_pretrained@{TASK}",
            f"finetune_compared@{TASK}-lora-1", f"finetune_compared@{TASK}-lora-2"}
EXTRACT, SIMILARITY, TRUNCATE, SKIP, ALIGN = (f"{stage}@{TASK}" for stage in
                                              ("extract", "similarity", "truncate", "skip", "align"))
COMPARE, SUMMARY, FREEZE, EXPORT, REPORT = "compare", "summary", f"freeze@{TASK}", f"export@{TASK}", "report"
WEIGHTS = f"weights@{TASK}"  # reads the checkpoints' weights only
DYNAMICS = f"dynamics@{TASK}"  # the kept states, and ORIG's and the final models' tables
GROUNDING = f"grounding@{TASK}"  # the runs' tables; every similarity param (the measures and their options)
# The report page reads every per-task result and the summary (not compare's).
# skip reads the seeds' activation tables too (Block Influence, angular distance)
AFTER_EXTRACT = {SIMILARITY, GROUNDING, COMPARE, TRUNCATE, SKIP, ALIGN, DYNAMICS, SUMMARY, REPORT}
AFTER_FINETUNE = {EXTRACT, SKIP, FREEZE, EXPORT, WEIGHTS, *AFTER_EXTRACT}
EXPENSIVE = DOWNLOAD | FINETUNE | {EXTRACT}


@pytest.fixture(scope="module")
def project(tmp_path_factory, built_projects):
    """The tiny project of tests/test_pipeline.py after one `dvc repro`, everything (dvc.lock, metrics,
    plots) committed to its git repo, and nothing stale."""
    root = tmp_path_factory.mktemp("incremental")
    env, _ = built_project(built_projects, root, configure_pipeline, "pipeline")
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "repro"], root, env)
    assert stale_stages(root) == set()
    return root, env


# (dotted key, new value, stages whose params changed, stages `dvc repro` would then run)
ANALYSIS = [
    # The summary averages the first measure's headline: it reads similarity.measures too.
    # The report names the first measure in its overview.
    ("similarity.measures", {"cls": ["linear_cka", "svcca", "neuronsim", "pwcca"]},
     {SIMILARITY, GROUNDING, COMPARE, SUMMARY, REPORT}, None),
    ("similarity.measures", {"cls": ["linear_cka"], "last": ["svcca"]},
     {SIMILARITY, GROUNDING, COMPARE, SUMMARY, REPORT}, None),
    # grounding reads the whole section: a measure's options are similarity.<key> (cheap to rerun, never stale)
    ("similarity.permutations", 30, {SIMILARITY, GROUNDING, COMPARE, DYNAMICS}, None),  # dynamics: its block nulls
    ("similarity.localization", "zscore", {SIMILARITY, GROUNDING, COMPARE}, None),
    ("similarity.svcca_variance", 0.9, {SIMILARITY, GROUNDING, COMPARE}, None),
    ("grounding.bootstrap", 50, {GROUNDING}, None),
    ("compare.probe_examples", 12, {COMPARE}, None),
    ("truncate.tolerance", 0.05, {TRUNCATE, EXPORT}, None),  # export keeps the score within it
    ("truncate.head_learning_rate", 0.01, {TRUNCATE}, None),
    ("skip.tolerance", 0.05, {SKIP}, None),
    ("align.steps", 6, {ALIGN}, None),
    ("align.methods", ["linear", "cca", "inn"], {ALIGN}, None),
    ("freeze.layers", [4], {FREEZE}, None),
    ("freeze.seeds", [1], {FREEZE}, None),
    ("weights.threshold", 0.6, {WEIGHTS}, None),
    ("weights.top_k", 5, {WEIGHTS}, None),
]
UPSTREAM = [
    # Read by extract (which attention maps to keep) and by compare (how many it encodes itself).
    ("extract.attention_examples", 6, {EXTRACT, COMPARE}, {EXTRACT, *AFTER_EXTRACT}),
    # Read by extract (word rows it writes) and by compare (word rows it encodes itself).
    ("extract.max_tokens", 50, {EXTRACT, COMPARE}, {EXTRACT, *AFTER_EXTRACT}),
    # Read by every stage that tokenizes: all but the downloads and similarity (which reads tables).
    ("finetune.max_length", 24, FINETUNE | {EXTRACT, COMPARE, TRUNCATE, SKIP, ALIGN, FREEZE, EXPORT, DYNAMICS},
     FINETUNE | AFTER_FINETUNE),
    # The control that makes the cases above able to fail: a new learning rate is new fine-tuned models.
    ("finetune.learning_rate", 2e-3, FINETUNE | {FREEZE}, FINETUNE | AFTER_FINETUNE),
    # How many states a run keeps: the seeds' runs again, full and LoRA (finetune_pretrained keeps none); a dry run
    # lists what follows them too, though their final models, which those stages read, come out the same (the states
    # live in data/states: test_keeping_other_states_reruns_only_the_runs_and_dynamics).
    ("finetune.keep_states", 1, FINETUNE - {f"finetune_pretrained@{TASK}"},
     FINETUNE - {f"finetune_pretrained@{TASK}"} | AFTER_FINETUNE),
    # How often fine-tuning saves a resumable state cannot change its result: nothing reruns.
    ("finetune.checkpoint_every", 2, set(), set()),
    ("download.generated_seed", 1, {f"download_task@{TASK}"},
     {f"download_task@{TASK}"} | FINETUNE | AFTER_FINETUNE),
]


@pytest.mark.parametrize("key, value, stale, rerun", [pytest.param(*case, id=case[0]) for case in ANALYSIS + UPSTREAM])
def test_a_param_change_reruns_only_the_stages_that_read_it(project, key, value, stale, rerun) -> None:
    root, env = project
    with edited_params(root, **{key: value}):
        stale_now, would_run = stages_to_rerun(root)
    assert stale_now == stale | {GATE}  # any params change: the gate checks them again
    # Without an explicit list, what reruns is the stale stages, the summary after any per-task analysis and the
    # report after any result it shows.
    summarised = {SUMMARY} if stale & {SIMILARITY, TRUNCATE, SKIP, ALIGN} else set()
    reported = {REPORT} if stale & {SIMILARITY, GROUNDING, TRUNCATE, SKIP, ALIGN, FREEZE, EXPORT, WEIGHTS, DYNAMICS} \
        else set()
    assert would_run == (rerun or stale | summarised | reported) | {GATE}
    if not rerun:  # an analysis param (or one that changes no result): nothing expensive reruns
        assert not would_run & EXPENSIVE
    assert stale_stages(root) == set(), "params.yaml restored: nothing stale"


def test_a_real_repro_after_an_analysis_change_runs_only_that_stage(project) -> None:
    """What the dry run predicts is what happens: `dvc repro` after a skip.tolerance change runs skip
    alone; restoring the committed files (params.yaml, dvc.lock, skip's metrics and plots) and `dvc checkout` (the
    cached report) leaves the project up to date again."""
    root, env = project
    try:
        headline = (root / f"metrics/skip/{TASK}/metrics.json").read_text()
        with edited_params(root, **{"skip.tolerance": 0.2}):
            repro = run(dvc("repro"), root, env)
            ran = {line.split("'")[1] for line in repro.stdout.splitlines() if line.startswith("Running stage")}
            # The gate's constant output reruns nothing else; the summary reruns only if skip's headline changed; the
            # report, which shows skip's details, always.
            changed = (root / f"metrics/skip/{TASK}/metrics.json").read_text() != headline
            assert ran == {GATE, SKIP, REPORT} | ({"summary"} if changed else set()), output(repro)
            details = json.loads((root / f"plots/details/skip/{TASK}/values.json").read_text())
            assert {"metric": "tolerance", "layer": None, "value": 0.2} in details
    finally:
        # From HEAD, not the index: the project's .dvc/config sets core.autostage, so `dvc repro` has
        # staged the new dvc.lock and metrics.
        run(["git", "checkout", "HEAD", "--", "."], root, env)
        run(dvc("checkout"), root, env)  # the report is a cached output: DVC, not git, puts it back
    status = run(dvc("status"), root, env)
    assert "up to date" in status.stdout.lower(), output(status)


def test_keeping_other_states_reruns_only_the_runs_and_dynamics(project) -> None:
    """finetune.keep_states 2 → 1: the runs that keep states train again (full and LoRA) and write the same final
    models, which live apart from the states (data/checkpoints vs data/states), so nothing that reads the final
    models reruns: only the dynamics stage (and the report, which shows it)."""
    root, env = project
    try:
        models = {p: p.read_bytes() for p in (root / "data/checkpoints").rglob("model.safetensors")}
        with edited_params(root, **{"finetune.keep_states": 1}):
            repro = run(dvc("repro"), root, env)
            ran = {line.split("'")[1] for line in repro.stdout.splitlines() if line.startswith("Running stage")}
            runs = FINETUNE - {f"finetune_pretrained@{TASK}"}
            assert ran - {"summary"} == {GATE, DYNAMICS, REPORT} | runs, output(repro)
            assert {p: p.read_bytes() for p in models} == models
            kept = json.loads((root / f"data/states/{TASK}/lora/seed1/states/states.json").read_text())
            assert kept["steps"] == [3]
    finally:
        run(["git", "checkout", "HEAD", "--", "."], root, env)
        run(dvc("checkout"), root, env)
    status = run(dvc("status"), root, env)
    assert "up to date" in status.stdout.lower(), output(status)
