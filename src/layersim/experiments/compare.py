"""The compare stage's work: every layer of several models on the same inputs, one stacked matrix per
measure — the pretrained encoder, the random-init control of its architecture (RANDOM, with
similarity.random_control: what an untrained network of the same shape scores), its fine-tuned models for
each task (first seed; Wu et al. Figures 5–7) and the other pretrained models of `compare.models`, of any
family, width and depth, each followed by its own random-init control ("<name> (random init)"; Wu et al.
Figures 1, 8 and 9; pretrained, so not Phang et al.'s cross-model figure of fine-tuned models). Every measure
compares layers of different widths (each is a function of the two layers' example × example structure or of their
canonical correlations, never of neuron identity across models), so one matrix holds them all.
The probe is encoded by every model (the extract stage's pooling, layersim.experiments.extract); every number is
computed by layersim.similarity.results and summarised by layersim.reporting.similarity, as figures, plot rows and
metrics (:class:`layersim.reporting.similarity.SimilarityOutputs`, folders "plots" and "localization"); the stage
writes them.

One corpus at a time (:func:`probe_result`). The probe holds the first compare.probe_examples validation examples
of every task. Mixed as they are, the tasks' differences (length, genre, one sentence, a pair or four choices) are
a large, low-rank component that every model shows, random-init ones included, and that alone makes two unrelated
models look alike: two representations that share only a 12-group structure, x = a_g + e and y = b_g + f with a, b
independent (12 x 100 rows, d = 64, noise sd 0.5), have linear CKA 0.78 against a row-permutation null mean of
0.011. So with more than one task, every layer's rows are first centred within their task, x_i - mean(x over the
rows of i's task), before any measure, and the null permutes whole examples only within their task (the
permutation null's `strata` = task, `groups` = example: the words or the choices of one example move together).
For linear CKA the centred value is the CKA of the pooled within-task cross-covariance, ||sum_t X_t' Y_t||_F^2 /
(||sum_t X_t' X_t||_F ||sum_t Y_t' Y_t||_F), each task's centred rows X_t: what the models share *within* a corpus,
pooled over corpora (Wu et al. compute their cross-model figures on one corpus). The test is exact: a permutation
within a task leaves the task's means, so the centring, unchanged, and under "no relation within any task" the
pairings it draws are equally likely. One matrix over all rows (rather than one per task, averaged) keeps the
null's bias at the probe's n (12 x 100 rows: linear CKA's null mean ~0.05 at d = 64, against ~0.39 at 100 rows)
and every measure, null and correction as they are. With one task nothing is centred and the null is as before."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layersim.compute.device import resolve_device
from layersim.data.batching import encode_task
from layersim.data.io import AttentionTable, read_task_table
from layersim.data.tasks import get_task
from layersim.data.words import align_rows
from layersim.experiments.extract import Pooled, concatenate_pooled, extract_task_attention, pooled_layers
from layersim.models.random_control import random_encoder
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.params import Params
from layersim.reporting.similarity import SimilarityOutputs, StackedReport, localization_summary, stacked_summary
from layersim.similarity.cka import is_constant
from layersim.similarity.comparisons import RANDOM, attention_maps, attention_measure_label, number
from layersim.similarity.inference.attention_null import attention_null_units
from layersim.similarity.inference.exchangeability import block_permutations, unmovable
from layersim.similarity.registry import MEASURES, check_computable
from layersim.similarity.results import Uncertainty, localization_of, reach_warning, settings
from layersim.similarity.stacked_results import StackedResult, stacked_result
from layersim.data.layout import finetuned, task_tables


@dataclass
class Probe(Pooled):
    """One model's layers over the probe (:class:`Pooled`, word keys led by the task's index) and where each
    per-example row (cls, mean, last: one per example and choice) comes from: (rows, 2) task index, example id;
    and each example's cluster (examples sharing a premise, question or context: the task table's cluster_id),
    (examples, 3) task index, example id, cluster id."""
    example_keys: np.ndarray | None = None
    clusters: np.ndarray | None = None


def probe_representations(folder: Path, params: Params, task_dirs: dict[str, Path], device, encoder=None) -> Probe:
    """Per-layer arrays of each pooling of the model in `folder` (or of `encoder`, with the folder's tokenizer)
    over the probe: the first compare.probe_examples validation examples of every task, each encoded as its own
    task (words: the first extract.max_tokens of each task, keyed by task, example, choice, segment and word), with
    the task and example of every per-example row."""
    tokenizer, encoder = load_tokenizer(folder), load_encoder(folder) if encoder is None else encoder
    poolings = params.similarity.poolings
    per_task, keys, clusters = [], [], []
    for k, (task, task_dir) in enumerate(task_dirs.items()):
        spec = get_task(task)
        table = read_task_table(task_dir, spec, "validation", params.compare.probe_examples)
        encoded = encode_task(table, spec, tokenizer, params.finetune.max_length, words="tokens" in poolings)
        per_task.append(pooled_layers(encoder, tokenizer, encoded, poolings, params.extract.batch_size, device,
                                      max_tokens=params.extract.max_tokens))
        example = np.repeat(encoded.example_id, encoded.num_choices)  # pooled_batches' row order
        keys.append(np.column_stack([np.full(len(example), k), example]))
        clusters.append(np.column_stack([np.full(len(encoded), k), encoded.example_id, encoded.cluster_id]))
    pooled = concatenate_pooled(per_task)
    return Probe(pooled.layers, pooled.word_keys, np.concatenate(keys).astype(np.int64),
                 np.concatenate(clusters).astype(np.int64))


def probe_attention(folder: Path, params: Params, task_dirs: dict[str, Path], device, scratch: Path,
                    encoder=None, name: str | None = None) -> tuple[list, np.ndarray]:
    """Attention maps of the model in `folder` (or of `encoder`, with the folder's tokenizer; `name` names its
    scratch file) over the first task's probe examples (same tokenizer only), and each map's cluster (the task
    table's cluster_id: examples sharing a premise, question or context), the attention null's blocks."""
    task, task_dir = next(iter(task_dirs.items()))
    spec = get_task(task)
    tokenizer = load_tokenizer(folder)
    table = read_task_table(task_dir, spec, "validation", min(params.compare.probe_examples,
                                                              params.extract.attention_examples))
    path = scratch / f"{name or folder.name}.attention.parquet"
    encoder = load_encoder(folder) if encoder is None else encoder
    encoded = extract_task_attention(encoder, tokenizer, table, spec, params, path,
                                     {"run": name or folder.name, "task": task}, device)
    found = AttentionTable(path)
    return attention_maps(found), encoded.clusters_of(found.map_examples)


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
               | {f"FT:{task}": finetuned(checkpoints / task, params.seeds[0]) for task in params.tasks})
    for name in params.compare.models:
        folders[name] = compared / name
        if with_controls:
            folders[random_init_label(name)] = controls[random_init_label(name)] = compared / name
    return folders, controls


def compare_models(pretrained: Path, checkpoints: Path, compared: Path, tasks: Path, params: Params,
                   log=lambda *args: None, warn=lambda *args: None) -> SimilarityOutputs:
    device = resolve_device(params.device)
    task_dirs = {task: task_tables(tasks, task) for task in params.tasks}
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
            probed = {label: probe_attention(folders[label], params, task_dirs, device, Path(scratch),
                                             encoder(label), label)
                      for label in folders if label in same_tokenizer}
        maps, clusters = {label: found[0] for label, found in probed.items()}, probed["ORIG"][1]
        options, uncertainty = settings(p)
        for measure in p.attention_measures:  # the similarity stage's attention null and bootstrap
            report = stacked_report(maps, measure, f"{attention_measure_label(measure)} — {params.model} and its "
                                    "fine-tuned models", options=options, uncertainty=uncertainty, groups=clusters,
                                    first_layer=1, attention=True, pooling="attention")
            out.figures["plots", f"attention.{measure}.png"] = report.figure
            rows += report.rows
            out.metrics.setdefault("attention", {})[measure] = report.summary
            if "no_null" in report.summary:
                warn("compare: attention: no null and no bootstrap interval for %s: %s", measure,
                     report.summary["no_null"])
        out.metrics["attention"]["null_unit"] = attention_null_units(maps["ORIG"][0], clusters)
    return out


def compare_representations(representations: dict[str, Pooled], params: Params,
                            warn=lambda *args: None) -> SimilarityOutputs:
    """The measures of similarity.measures over each pooling's layers of the models in `representations` (label
    → Pooled, ORIG first) stacked: one block heatmap per measure with every cell's null (corrected over the
    heatmap), the summary against ORIG and the localization score; the plot rows under "matrices.json"."""
    p = params.similarity
    options, uncertainty = settings(p)
    out, rows, localization_rows = SimilarityOutputs(), [], []
    for pooling, measures in p.measures.items():
        # Word rows ("tokens") are lined up on their keys: the words every model's truncation kept.
        models, strata, groups = probe_rows(representations, pooling)
        sizes = {label: len(layers) for label, layers in models.items()}
        stacked = stacked_title(params, strata)
        for measure in measures:  # before any work: e.g. mixedsim needs more examples than neurons
            check_computable(measure, len(models["ORIG"][0]),
                             {label: layers[0].shape[1] for label, layers in models.items()})
        # Before any permutation: can the correction declare a cell of the heatmap with this many draws?
        shortfall = reach_warning(uncertainty, measures, len(models["ORIG"][0]), options, sum(sizes.values()) ** 2,
                                  f"compare ({pooling})")
        if shortfall:
            warn("%s", shortfall)
        num_rows = len(models["ORIG"][0])  # whole examples move within their task: can a p-value reach α?
        blocks = None if unmovable(num_rows, groups, strata) else block_permutations(num_rows, groups, strata)
        if blocks is not None and blocks.note(uncertainty.significance):
            warn("compare (%s): %s", pooling, blocks.note(uncertainty.significance))
        matrices = {}
        for measure in measures:
            report = stacked_report(models, measure, f"{MEASURES[measure].label}, {pooling.upper()} — {stacked}",
                                    options=options, uncertainty=uncertainty, strata=strata, groups=groups,
                                    pooling=pooling)
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


def stacked_title(params: Params, strata: np.ndarray | None = None) -> str:
    """Which models a stacked figure holds, for its title: the base model as ORIG, its random init as RANDOM; with
    several tasks in the probe (`strata`), a second line saying how they are kept apart (:func:`probe_result`)."""
    control = params.similarity.random_control is not None
    others = ", ".join(params.compare.models)
    title = (f"{params.model} (ORIG){', its random init (RANDOM)' if control else ''}, its fine-tuned models"
             + (f"; {others}{' and their random inits' if control else ''}" if others else ""))
    if strata is None:
        return title
    return (f"{title}\n{len(np.unique(strata))} tasks' probes: rows centred within each task, the null permutes "
            "examples only within their task")


def probe_rows(representations: dict[str, Probe | Pooled], pooling: str
               ) -> tuple[dict[str, list[np.ndarray]], np.ndarray | None, np.ndarray | None]:
    """Label → per-layer arrays of one pooling, rows lined up across the models (word rows on their keys,
    :func:`layersim.data.words.align_rows`: the words every model's truncation kept), each row's task (None for a
    probe of one task) and each row's block: its cluster of examples sharing a text within its task (its example
    when the probe records no clusters; None when every row is a block of its own, as before)."""
    first = next(iter(representations.values()))
    if pooling == "tokens":
        keys, models = align_rows({label: (reps.word_keys, reps.layers[pooling])
                                   for label, reps in representations.items()})
        # Keys: (task, example, choice, segment, word) from the probe; (example, …) from one task's table.
        keys = keys[:, :2] if keys.shape[1] == 5 else np.column_stack([np.zeros(len(keys), np.int64), keys[:, 0]])
    else:
        models = {label: reps.layers[pooling] for label, reps in representations.items()}
        keys = getattr(first, "example_keys", None)
    if keys is None:
        return models, None, None
    strata = keys[:, 0] if len(np.unique(keys[:, 0])) > 1 else None
    clusters = getattr(first, "clusters", None)
    if clusters is not None:  # (task, example) → (task, cluster): examples sharing a text move as one block
        cluster_of = {(task, example): cluster for task, example, cluster in clusters.tolist()}
        keys = np.array([(task, cluster_of[task, example]) for task, example in keys.tolist()],
                        dtype=np.int64).reshape(-1, 2)
    groups = np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)
    return models, strata, None if len(np.unique(groups)) == len(groups) else groups


def centred_within(layers: list[np.ndarray], strata: np.ndarray) -> list[np.ndarray]:
    """Each layer's rows minus the mean of the rows of their stratum (feature by feature, in float64, returned in
    the layer's dtype). A layer that is constant within every stratum becomes exactly zero, so that it stays
    undefined (is_constant) rather than keep the rounding residue of its stratum means."""
    _, index = np.unique(strata, return_inverse=True)
    index = index.reshape(-1)
    members = np.zeros((len(index), index.max() + 1))
    members[np.arange(len(index)), index] = 1.0
    counts = members.sum(axis=0)
    out = []
    for layer in layers:
        if all(is_constant(layer[index == s]) for s in range(len(counts))):
            out.append(np.zeros_like(layer))
            continue
        means = (members.T @ layer.astype(np.float64)) / counts[:, None]
        out.append(np.subtract(layer, means[index], dtype=np.float64).astype(layer.dtype))
    return out


def probe_result(models: dict[str, list], measure: str, *, options: dict | None = None,
                 uncertainty: Uncertainty | None = None, strata: np.ndarray | None = None,
                 groups: np.ndarray | None = None, attention: bool = False) -> StackedResult:
    """The compare stage's numbers for one measure over one pooling of the probe (the module docstring): with
    `strata` (row → task), every layer's rows centred within their task and every cell's null permuting examples
    only within their task; with `groups` (row → example), the rows of one example moved together. Without
    either, :func:`layersim.similarity.stacked_results.stacked_result` as it is."""
    keywords = {key: value for key, value in (("strata", strata), ("groups", groups)) if value is not None}
    if strata is not None and not attention:
        models = {label: centred_within(layers, strata) for label, layers in models.items()}
    return stacked_result(models, measure, options=options, uncertainty=uncertainty, attention=attention, **keywords)


def stacked_report(models: dict[str, list], measure: str, title: str, *, options: dict | None = None,
                   uncertainty: Uncertainty | None = None, first_layer: int = 0, attention: bool = False,
                   strata: np.ndarray | None = None, groups: np.ndarray | None = None, **fields) -> StackedReport:
    """All layers of `models` stacked (Wu et al. Figures 1 and 5), the first model being
    the reference of the summary: computed (:func:`probe_result`: within task with `strata`), with `uncertainty`
    every cell's permutation null (attention maps: the attention null, `groups` each map's cluster, and bootstrap
    intervals against the first model: layersim.similarity.stacked_results.attention_uncertainty), then reported with the
    cells not above it hatched (layersim.reporting.similarity.stacked_summary). `fields` are added to every plot
    row (e.g. pooling)."""
    result = probe_result(models, measure, options=(options or {}).get(measure, {}), uncertainty=uncertainty,
                          strata=strata, groups=groups, attention=attention)
    return stacked_summary(result, title, uncertainty=uncertainty, first_layer=first_layer, attention=attention,
                           **fields)
