"""The compare stage's work: every layer of several models on the same inputs, one stacked matrix per
measure — the pretrained encoder, the random-init control of its architecture (RANDOM, with
similarity.random_control: what an untrained network of the same shape scores), its fine-tuned models for
each task (first seed; Wu et al. Figures 5–7) and the other pretrained models of `compare.models`, of any
family, width and depth, each followed by its own random-init control ("<name> (random init)"; Wu et al.
Figures 1, 8 and 9; pretrained, so not Phang et al.'s cross-model figure of fine-tuned models). Every measure compares layers of different widths (each is a function
of the two layers' example × example structure or of their canonical correlations, never of neuron identity
across models), so one matrix holds them all.
The probe is encoded by every model (the extract stage's pooling, layersim.experiments.extract); every number is
computed by layersim.similarity.results and summarised by layersim.reporting.similarity, as figures, plot rows and
metrics (:class:`layersim.reporting.similarity.SimilarityOutputs`, folders "plots" and "localization"); the stage
writes them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from layersim.compute.device import resolve_device
from layersim.data.batching import encode_task
from layersim.data.io import AttentionTable, read_task_table
from layersim.data.tasks import get_task
from layersim.experiments.extract import (Pooled, concatenate_pooled, extract_task_attention, models_for_pooling,
                                          pooled_layers)
from layersim.models.random_control import random_encoder
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.params import Params
from layersim.reporting.similarity import SimilarityOutputs, StackedReport, localization_summary, stacked_summary
from layersim.similarity.comparisons import RANDOM, attention_maps, attention_measure_label, number
from layersim.similarity.registry import MEASURES, check_computable
from layersim.similarity.results import Uncertainty, localization_of, reach_warning, settings, stacked_result

def probe_representations(folder: Path, params: Params, task_dirs: dict[str, Path], device, encoder=None) -> Pooled:
    """Per-layer arrays of each pooling of the model in `folder` (or of `encoder`, with the folder's tokenizer)
    over the probe: the first compare.probe_examples validation examples of every task, each encoded as its own
    task (words: the first extract.max_tokens of each task, keyed by task, example, choice, segment and word)."""
    tokenizer, encoder = load_tokenizer(folder), load_encoder(folder) if encoder is None else encoder
    poolings = params.similarity.poolings
    per_task = []
    for task, task_dir in task_dirs.items():
        spec = get_task(task)
        table = read_task_table(task_dir, spec, "validation", params.compare.probe_examples)
        encoded = encode_task(table, spec, tokenizer, params.finetune.max_length, words="tokens" in poolings)
        per_task.append(pooled_layers(encoder, tokenizer, encoded, poolings, params.extract.batch_size, device,
                                      max_tokens=params.extract.max_tokens))
    return concatenate_pooled(per_task)


def probe_attention(folder: Path, params: Params, task_dirs: dict[str, Path], device, scratch: Path,
                    encoder=None, name: str | None = None) -> list:
    """Attention maps of the model in `folder` (or of `encoder`, with the folder's tokenizer; `name` names its
    scratch file) over the first task's probe examples (same tokenizer only)."""
    task, task_dir = next(iter(task_dirs.items()))
    spec = get_task(task)
    tokenizer = load_tokenizer(folder)
    table = read_task_table(task_dir, spec, "validation", min(params.compare.probe_examples,
                                                              params.extract.attention_examples))
    path = scratch / f"{name or folder.name}.attention.parquet"
    encoder = load_encoder(folder) if encoder is None else encoder
    extract_task_attention(encoder, tokenizer, table, spec, params, path, {"run": name or folder.name, "task": task},
                           device)
    return attention_maps(AttentionTable(path))


def random_init_label(name: str) -> str:
    """The label (figures, plot rows, metrics) of the random-init control of compared model `name`."""
    return f"{name} (random init)"


def compared_folders(pretrained: Path, checkpoints: Path, compared: Path, params: Params
                     ) -> tuple[dict[str, Path], dict[str, Path]]:
    """Label → model folder of every stacked model, in stacking order: ORIG, RANDOM, FT:<task> (first seed), then
    each model of compare.models followed by its random-init control; and label → the folder whose config and
    tokenizer each random-init control takes (none with similarity.random_control null)."""
    with_controls = params.similarity.random_control is not None
    controls = {RANDOM: pretrained} if with_controls else {}
    folders = ({"ORIG": pretrained} | controls
               | {f"FT:{task}": checkpoints / task / f"seed{params.seeds[0]}" for task in params.tasks})
    for name in params.compare.models:
        folders[name] = compared / name
        if with_controls:
            folders[random_init_label(name)] = controls[random_init_label(name)] = compared / name
    return folders, controls


def compare_models(pretrained: Path, checkpoints: Path, compared: Path, tasks: Path, params: Params,
                   log=lambda *args: None, warn=lambda *args: None) -> SimilarityOutputs:
    device = resolve_device(params.device)
    task_dirs = {task: tasks / task for task in params.tasks}
    control = params.similarity.random_control
    folders, controls = compared_folders(pretrained, checkpoints, compared, params)
    same_tokenizer = {"ORIG", RANDOM, *(f"FT:{task}" for task in params.tasks)} & set(folders)

    def encoder(label: str):
        """A control's architecture and tokenizer (its folder's), weights drawn afresh (seed `control`); made
        when needed, so that only one untrained model is held at a time."""
        return random_encoder(controls[label], control) if label in controls else None

    representations = {label: probe_representations(folder, params, task_dirs, device, encoder(label))
                       for label, folder in folders.items()}
    log("encoded the probe (%d examples per task, %d tasks) with %d models", params.compare.probe_examples,
        len(task_dirs), len(folders))
    out = compare_representations(representations, params, warn)
    rows, p = out.rows["plots", "matrices.json"], params.similarity
    if p.attention_measures:
        with tempfile.TemporaryDirectory() as scratch:
            maps = {label: probe_attention(folders[label], params, task_dirs, device, Path(scratch),
                                           encoder(label), label)
                    for label in folders if label in same_tokenizer}
        for measure in p.attention_measures:
            report = stacked_report(maps, measure, f"{attention_measure_label(measure)} — {params.model} and its "
                                    "fine-tuned models", first_layer=1, attention=True, pooling="attention")
            out.figures["plots", f"attention.{measure}.png"] = report.figure
            rows += report.rows
            out.metrics.setdefault("attention", {})[measure] = report.summary
    return out


def compare_representations(representations: dict[str, Pooled], params: Params,
                            warn=lambda *args: None) -> SimilarityOutputs:
    """The measures of similarity.measures over each pooling's layers of the models in `representations` (label
    → Pooled, ORIG first) stacked: one block heatmap per measure with every cell's null (corrected over the
    heatmap), the summary against ORIG and the localization score; the plot rows under "matrices.json"."""
    p = params.similarity
    options, uncertainty = settings(p)
    out, rows, localization_rows = SimilarityOutputs(), [], []
    stacked = stacked_title(params)
    for pooling, measures in p.measures.items():
        # Word rows ("tokens") are lined up on their keys: the words every model's truncation kept.
        models = models_for_pooling(representations, pooling)
        sizes = {label: len(layers) for label, layers in models.items()}
        for measure in measures:  # before any work: e.g. mixedsim needs more examples than neurons
            check_computable(measure, len(models["ORIG"][0]), {label: layers[0].shape[1] for label, layers in models.items()})
        # Before any permutation: can the correction declare a cell of the heatmap with this many draws?
        shortfall = reach_warning(uncertainty, measures, len(models["ORIG"][0]), options, sum(sizes.values()) ** 2,
                                  f"compare ({pooling})")
        if shortfall:
            warn("%s", shortfall)
        matrices = {}
        for measure in measures:
            report = stacked_report(models, measure, f"{MEASURES[measure].label}, {pooling.upper()} — {stacked}",
                                    options=options, uncertainty=uncertainty, pooling=pooling)
            matrices[measure] = report.matrix
            out.figures["plots", f"{pooling}.{measure}.png"] = report.figure
            rows += report.rows
            out.metrics.setdefault(pooling, {})[measure] = report.summary
        controls = {RANDOM, *map(random_init_label, params.compare.models)}  # Wu et al.: trained models only
        scores = localization_of(matrices, sizes, p.localization, [label for label in sizes if label not in controls])
        if scores is not None:
            found = localization_summary(scores, p.localization, f"{pooling.upper()} — {stacked}", pooling=pooling)
            out.metrics[pooling]["localization"] = {label: [number(v) for v in values]
                                                    for label, values in found.scores.items()}
            localization_rows += found.rows
            out.figures["localization", f"{pooling}.png"] = found.figure
    out.rows["plots", "matrices.json"] = rows
    # Always written (empty without neuronsim and svcca): git cannot hold an empty output folder.
    out.rows["localization", "localization.json"] = localization_rows
    return out


def stacked_title(params: Params) -> str:
    """Which models a stacked figure holds, for its title: the base model as ORIG, its random init as RANDOM."""
    control = params.similarity.random_control is not None
    others = ", ".join(params.compare.models)
    return (f"{params.model} (ORIG){', its random init (RANDOM)' if control else ''}, its fine-tuned models"
            + (f"; {others}{' and their random inits' if control else ''}" if others else ""))


def stacked_report(models: dict[str, list], measure: str, title: str, *, options: dict | None = None,
                   uncertainty: Uncertainty | None = None, first_layer: int = 0, attention: bool = False,
                   **fields) -> StackedReport:
    """All layers of `models` stacked (Wu et al. Figures 1 and 5), the first model being
    the reference of the summary: computed (layersim.similarity.results.stacked_result), with `uncertainty`
    every cell's permutation null (not for attention maps), then reported with the cells not above it hatched
    (layersim.reporting.similarity.stacked_summary). `fields` are added to every plot row (e.g. pooling)."""
    result = stacked_result(models, measure, options=(options or {}).get(measure, {}), uncertainty=uncertainty,
                            attention=attention)
    return stacked_summary(result, title, uncertainty=uncertainty, first_layer=first_layer, attention=attention,
                           **fields)
