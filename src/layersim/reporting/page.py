"""One page per experiment: per task, the similarity heatmaps with their blocks and chance marks, the truncation
curve with the exit the export chose, the exported model's score and size, and every reported number with
its null and interval. A single HTML file with the figures inside it (PNG data URIs): it renders offline, in
any browser, and can be mailed or committed as it is.

The page reads what the stages wrote (their details plot data, metrics and figures, see docs/outputs.md); it computes nothing new, so it cannot disagree with them. The similarity tables are
:mod:`layersim.reporting.similarity_tables`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from layersim.errors import LayersimError
from layersim.training.convergence import NOT_CONVERGED, marked, title_note
from layersim.reporting.cells import block_spans, fmt, top_layer
from layersim.reporting.headlines import details_to_metrics, finetune_flags, read_metrics_file
from layersim.reporting.html import Figure, Section, Table, png, render  # noqa: F401 (png, render: the API)
from layersim.data.layout import METHOD_LABELS, finetune_metrics, stage_details, stage_metrics
from layersim.reporting.grounding import grounding_table
from layersim.reporting.similarity_tables import similarity_tables


@dataclass(frozen=True)
class Layout:
    """Where the stages wrote their results (the pipeline's folders)."""

    metrics: Path
    details: Path
    plots: Path

    def details_of(self, stage: str, task: str) -> dict | None:
        """Every value a stage wrote for a task, nested again; None if absent."""
        path = stage_details(self.details, stage, task)
        if not path.is_file():
            return None
        try:
            return details_to_metrics(read_metrics_file(path))  # not JSON: one sentence naming the file
        except (TypeError, KeyError) as err:
            raise LayersimError(f"details file {path} cannot be read ({type(err).__name__}); re-run the stage that "
                                "wrote it.") from None

    def figure(self, relative: str, caption: str) -> Figure | None:
        path = self.plots / relative
        return Figure(caption, path.read_bytes()) if path.is_file() else None


def export_facts(export: Mapping | None) -> list[str]:
    if not export:
        return []
    chosen, full = export["exported"], export["full"]
    return [f"Exported model: {chosen['description']} — {chosen['layers']} of {full['layers']} layers, "
            f"{export['metric']} {fmt(chosen['validation'])} on validation against {fmt(full['validation'])} for the "
            f"full model (chosen on {export['selection_examples']} train examples within {export['tolerance']:g}: "
            f"{fmt(chosen['train'])} against {fmt(full['train'])}).",
            f"Parameters: {_share(chosen.get('parameters'), export.get('full_parameters'))} of the full model's; "
            "measured speed-ups (wall clock, kept out of this page so that it hashes the same on a rerun): "
            "timings/export/."]


def _share(part, whole) -> str:
    return f"{part / whole:.0%}" if isinstance(part, int) and isinstance(whole, int) and whole else "–"


def overview_row(task: str, scores: Sequence[float], similarity: Mapping | None, truncate: Mapping | None,
                 export: Mapping | None, measure: tuple[str, str], flagged: Sequence[int] = ()) -> list[str]:
    """A task's overview row; `flagged`: the seeds whose run did not converge (named beside the mean score)."""
    pooling, name = measure
    result = ((similarity or {}).get(pooling) or {}).get(name) or {}
    blocks = (result.get("blocks") or {}).get("ft_ft") or {}
    top = result.get("ft_orig") or {}
    chosen = (export or {}).get("exported") or {}
    full = (export or {}).get("full") or {}
    mean = sum(scores) / len(scores) if scores else None
    note = (f" ({len(flagged)} of {len(scores)} runs {NOT_CONVERGED}: seed {', '.join(map(str, flagged))})"
            if flagged else "")
    return [task, fmt(mean) + note, block_spans(blocks.get("block_of_layer") or {}) or "–",
            f"{fmt(top.get('last_layer'))} (null {fmt(top_layer(top.get('null_mean') or {}))})",
            fmt((truncate or {}).get("droppable_top_layers_untuned")), fmt((truncate or {}).get("droppable_top_layers_tuned")),
            f"{fmt(chosen.get('layers'))} / {fmt(full.get('layers'))}",
            f"{fmt(full.get('validation'))} → {fmt(chosen.get('validation'))}",
            _share(chosen.get("parameters"), (export or {}).get("full_parameters"))]


OVERVIEW_HEADER = ["task", "fine-tuned score", "FT–FT blocks", "FT–ORIG top layer", "droppable top layers (Untuned)",
                   "droppable top layers (Tuned)", "exported layers", "validation: full → exported", "exported parameters"]


def _finetuned_runs(layout: Layout, task: str, metric: str, seeds: Sequence[int],
                    method: str | None = None) -> dict[int, dict]:
    """Seed → its finetune metrics file, for the seeds whose file holds a score; with `method`, the runs of that
    method of finetune.compare_methods."""
    runs = {}
    for seed in seeds:
        path = finetune_metrics(layout.metrics / "finetune" / task, seed, method)
        if path.is_file():
            metrics = read_metrics_file(path)
            if isinstance(metrics, dict) and isinstance(metrics.get(metric), (int, float)):
                runs[seed] = metrics
    return runs


def convergence_facts(flags: Mapping[int, str], seeds: Sequence[int], method: str | None = None) -> list[str]:
    """One sentence per flagged seed: why, and which results rest on the run; with `method`, the runs of that
    method of finetune.compare_methods (LoRA[i])."""
    position = {seed: i for i, seed in enumerate(seeds, start=1)}
    if method is None:
        label, uses = "FT", ("FT–ORIG, FT[1]–FT[2], truncation, skipping, alignment, freezing, the export of the first "
                             "seed")
    else:
        label = METHOD_LABELS.get(method, method)
        uses = f"{label}–ORIG, {label}–FT, its weights and dynamics"
    return [f"Seed {seed} ({label}[{position[seed]}]) did not converge: {reason}. Every result that uses it ({uses}) "
            f"describes the failed run rather than fine-tuning; its figures say \"{NOT_CONVERGED}\"."
            for seed, reason in flags.items()]


def score_facts(layout: Layout, task: str, metric: str, seeds: Sequence[int],
                method: str | None = None) -> tuple[list[str], list[float], dict[int, str]]:
    """The fine-tuned runs' validation scores (finetune.method's, or with `method` a compared method's) as a sentence
    naming the runs that did not converge, then one sentence per such run; and the scores and flags themselves."""
    runs = _finetuned_runs(layout, task, metric, seeds, method)
    scores = [float(metrics[metric]) for metrics in runs.values()]
    flags = {list(runs)[k]: reason for k, reason in finetune_flags(runs.values(), metric).items()}
    if not scores:
        return [], scores, flags
    who = "Fine-tuned" if method is None else f"{METHOD_LABELS.get(method, method)} fine-tuning (finetune.compare_methods)"
    facts = [f"{who} {metric}: " + ", ".join(
        marked(f"seed {seed} {fmt(score)}", seed in flags) for seed, score in zip(runs, scores)) + "."]
    return facts + convergence_facts(flags, seeds, method), scores, flags


def truncation_figure(layout: Layout, task: str, truncate: Mapping, export: Mapping | None,
                      flagged: Sequence[str] = (), model: str = "") -> Figure | None:
    """The truncation curve (Phang Fig. 3) redrawn from the truncate stage's rows with the export's exit marked;
    the title names the `flagged` runs (e.g. "seed 1") that did not converge, which its band includes; the caption
    names `model`'s kind (encoder or decoder)."""
    from layersim.reporting.plots import truncation_curves

    path = layout.plots / "truncate" / task / "truncate.json"
    if not path.is_file():
        return None
    rows = read_metrics_file(path)
    per_seed: dict[str, dict[int, dict[int, float]]] = {}
    for row in rows:
        per_seed.setdefault(row["variant"], {}).setdefault(row["seed"], {})[row["layer"]] = row["score"]
    curves = {variant: [[by_layer[k] for k in sorted(by_layer)] for _, by_layer in sorted(seeds.items())]
              for variant, seeds in per_seed.items()}
    chosen = (export or {}).get("exported") or {}
    exit_layer = chosen.get("exit_layer") if not chosen.get("skipped_first") else None
    figure = truncation_curves(curves, [truncate["full"]], truncate["majority_baseline"], truncate["metric"],
                               f"truncation — {task}{title_note(flagged)}", exported_exit=exit_layer)
    from layersim.params.model_kind import model_noun

    caption = (f"Score when the {model_noun(model)} exits after layer k (Phang et al. Fig. 3): mean over seeds, the band their "
               "range; the dotted black line is the exit the export stage chose")
    if chosen.get("skipped_first"):
        caption += f" (here it skipped layers {chosen['skipped_first']}–{chosen['skipped_last']} instead)"
    return Figure(caption + ".", png(figure))


def weights_table(weights: Mapping | None) -> Table | None:
    """The weights stage's intruder counts per method and adapted role against the rotated-update null
    (metrics/weights/<task>/metrics.json), with the roles every method adapted first: None without the null."""
    if not weights or "intruders_p_value" not in weights:
        return None
    methods = {weights["method"]: weights, **(weights.get("compared") or {})}
    rows = []
    shared = weights.get("shared_roles")
    for method, found in methods.items():
        label = METHOD_LABELS.get(method, method)
        if shared is not None:
            rows.append([label, f"roles every method adapted ({', '.join(shared) or 'none'})", "",
                         fmt(found.get("intruders_per_shared_role_matrix")),
                         fmt(found.get("intruders_per_shared_role_matrix_null")),
                         fmt(found.get("intruders_shared_roles_p_value"))])
        rows.append([label, "every adapted matrix", "", fmt(found.get("intruders_per_adapted_matrix")),
                     fmt(found.get("intruders_per_adapted_matrix_null")), fmt(found.get("intruders_p_value"))])
        for role, test in (found.get("by_role") or {}).items():
            rows.append([label, role, fmt(test.get("matrices")), fmt(test.get("intruders_per_matrix")),
                         fmt(test.get("null_per_matrix")), fmt(test.get("p_value"))])
    return Table("weights: intruder dimensions against a structureless update of the same size", [
        "method", "matrices", "count", "intruders per matrix", "the null expects", "p (one-sided)"], rows,
        "The null keeps each adapted matrix's update singular values and draws its singular vectors at random "
        "(weights.null_draws); p counts the null's totals at least the observed total over seeds and layers. Compare "
        "methods on the roles both adapted: full fine-tuning adapts all six roles, LoRA only its target modules.")


POINTS = {"cls": "CLS", "last": "last-token (the decoder's head token)", "mean": "mean-pooled"}


def task_section(task: str, layout: Layout, seeds: Sequence[int], significance: float,
                 first_measure: tuple[str, str], model: str,
                 compare_methods: Sequence[str] = ()) -> tuple[Section, list[str]]:
    """One task's section, and its row of the overview table; each method of finetune.compare_methods gets its
    runs' scores and convergence beside the full runs'."""
    from layersim.data.tasks import get_task

    spec = get_task(task)
    similarity = layout.details_of("similarity", task)
    truncate = layout.details_of("truncate", task)
    skip = layout.details_of("skip", task)
    export = layout.details_of("export", task)
    section = Section(task)
    facts, scores, flags = score_facts(layout, task, spec.primary_metric, seeds)
    section.facts += facts
    for method in compare_methods:
        section.facts += score_facts(layout, task, spec.primary_metric, seeds, method)[0]
    if truncate:
        section.facts.append(f"Top layers that can go within {truncate['tolerance']:g} of the full model "
                             f"({fmt(truncate['full'])}): {truncate['droppable_top_layers_untuned']} with the "
                             f"fine-tuned head as it is (Untuned), {truncate['droppable_top_layers_tuned']} with the head "
                             f"trained further (Tuned); {'predicting the mean' if spec.regression else 'the majority class'}"
                             f" scores {fmt(truncate['majority_baseline'])}.")
    if skip and skip.get("largest_span_within_tolerance"):
        span = skip["largest_span_within_tolerance"]
        section.facts.append(f"Longest span of layers that can be skipped within {skip['tolerance']:g}: "
                             f"{span.get('first')}–{span.get('last')} ({span['length']} layer{'s' if span['length'] != 1 else ''}).")
    section.facts += export_facts(export)
    if export:
        loader = "AutoModelForMultipleChoice" if spec.format == "multiple_choice" else "AutoModelForSequenceClassification"
        section.facts.append(f"Load it with transformers alone: {loader}.from_pretrained(\"data/export/{task}/model\").")
    if similarity:
        section.tables += similarity_tables(similarity, significance)
    grounding = grounding_table(layout.details_of("grounding", task))  # None unless grounding.enabled
    if grounding:
        section.tables.append(grounding)
    weights_path = stage_metrics(layout.metrics, "weights", task)
    weights = weights_table(read_metrics_file(weights_path) if weights_path.is_file() else None)
    if weights:
        section.tables.append(weights)
    head = first_measure[0]  # the model's own head token: cls, or last for a decoder
    for relative, caption in ((f"similarity/{task}/heatmaps/{head}.png", "Each measure between every pair of layers, "
                               f"{POINTS.get(head, head)} points, in Phang et al.'s layout; cyan outlines: blocks of "
                               "layers; hatched cells: not above chance."),
                              (f"diagonals/{task}/curves/{head}.png", "Layer k against layer k, with the permutation null's "
                               "mean and 95% bootstrap intervals."),
                              (f"similarity/{task}/heatmaps/tokens.png", "The same on word points (Wu et al.)."),
                              (f"grounding/{task}/ranking/grounding.png", "Which measure to trust on this model: each "
                               "measure's layer monotonicity and seeds-vs-fine-tuning AUPRC (ReSi's grounding tests), "
                               "best first, with 95 % paired-bootstrap intervals over runs and layers."),
                              (f"similarity/{task}/heatmaps/attention.png", "Attention maps layer against layer; hatched "
                               "cells: not above chance (a null exchanging whole examples with examples of equal "
                               "length, those sharing a text together)."),
                              (f"diagonals/{task}/curves/attention.png", "Attention maps, layer k against layer k, "
                               "with the permutation null's mean and 95% bootstrap intervals over examples."),):
        figure = layout.figure(relative, caption)
        if figure:
            section.figures.append(figure)
    if truncate:
        figure = truncation_figure(layout, task, truncate, export, [f"seed {seed}" for seed in flags], model)
        if figure:
            section.figures.append(figure)
    for relative, caption in ((f"export/{task}/export.png", "The exported model's choice: the score with n layers kept, on "
                               "the train examples it was chosen on and on validation."),
                              (f"skip/{task}/skip.png", "The score with layers i..j skipped (Phang et al. §4.1)."),
                              (f"align/{task}/errors.png", "Held-out alignment error per layer and map (Ren et al.)."),
                              (f"freeze/{task}/freeze.png", "Fine-tuning with layers frozen (Wu et al. Table 1)."),
                              (f"weights/{task}/intruders.png", "Intruder dimensions per layer and weight matrix, each "
                               "seed's checkpoint against the pretrained model (Shuttleworth et al.): top singular "
                               "vectors of the fine-tuned matrix unlike every pretrained one."),
                              (f"dynamics/{task}/dynamics.png", "How far each layer moved over fine-tuning, and when: each "
                               "kept state's layers against ORIG's (linear CKA, layer × step, and curves to ORIG and to "
                               "the final model with the null's mean), on the step axis of the run's evaluations.")):
        figure = layout.figure(relative, caption)
        if figure:
            section.figures.append(figure)
    return section, overview_row(task, scores, similarity, truncate, export, first_measure, list(flags))


def build_report(model: str, tasks: Sequence[str], seeds: Sequence[int], significance: float,
                 first_measure: tuple[str, str], layout: Layout, compare_methods: Sequence[str] = ()) -> str:
    """The experiment's page: an overview row per task, the summary figure, then one section per task (with the
    runs of finetune.compare_methods' `compare_methods` beside finetune.method's)."""
    sections, rows = [], []
    for task in tasks:
        section, row = task_section(task, layout, seeds, significance, first_measure, model, compare_methods)
        sections.append(section)
        rows.append(row)
    pooling, measure = first_measure
    overview = Table("Overview", OVERVIEW_HEADER, rows,
                     f"Blocks and the FT–ORIG top layer in {measure} on {pooling} points; the exported model is the "
                     "first seed's, chosen on train examples, scored on validation. The fine-tuned score is the mean "
                     f"over seeds, runs {NOT_CONVERGED} included and named beside it.")
    intro = [f"Model {model}; tasks {', '.join(tasks)}; seeds {', '.join(map(str, seeds))}. Every number below is "
             "read from the pipeline's outputs (plots/details/, metrics/); each similarity comes with what chance "
             f"gives (the permutation null) and a 95% bootstrap interval; p < {significance:g} counts as above chance."]
    summary = [f for f in (layout.figure("summary/last_block.png", "Where the last block of layers starts, counted "
                                         "over tasks (Phang et al.'s \"the top layers form a block\")."),) if f]
    return render(f"layersim report — {model}", intro, overview, summary, sections)
