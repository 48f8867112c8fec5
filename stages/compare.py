"""compare: every layer of several models on the same inputs, one stacked matrix per measure — the
pretrained encoder, its fine-tuned models for each task (first seed; Wu et al. Figures 5–7) and the
other pretrained encoders of `compare.models` (Phang et al. Figure 7, Wu et al. Figure 1)."""

import tempfile
from pathlib import Path

from layersim import cli
from layersim.batching import encode_task
from layersim.comparisons import attention_maps, attention_measure_label, number
from layersim.extract import Pooled, concatenate_pooled, extract_attention, models_for_pooling, pooled_layers
from layersim.io import AttentionTable, atomic_path, read_task_table, write_figure, write_json
from layersim.models import load_encoder, load_tokenizer
from layersim.similarity import MEASURES, check_computable
from layersim.similarity_report import localization_report, settings, stacked_report
from layersim.tasks import get_task
from layersim.train import default_device


def probe_representations(folder: Path, params, task_dirs: dict[str, Path], device) -> Pooled:
    """Per-layer arrays of each pooling of the model in `folder` over the probe: the first
    compare.probe_examples validation examples of every task, each encoded as its own task (words:
    the first extract.max_tokens of each task, keyed by task, example, choice, segment and word)."""
    tokenizer, encoder = load_tokenizer(folder), load_encoder(folder)
    poolings = params.similarity.poolings
    per_task = []
    for task, task_dir in task_dirs.items():
        spec = get_task(task)
        table = read_task_table(task_dir, spec, "validation", params.compare.probe_examples)
        encoded = encode_task(table, spec, tokenizer, params.finetune.max_length, words="tokens" in poolings)
        per_task.append(pooled_layers(encoder, tokenizer, encoded, poolings, params.extract.batch_size, device,
                                      max_tokens=params.extract.max_tokens))
    return concatenate_pooled(per_task)


def probe_attention(folder: Path, params, task_dirs: dict[str, Path], device, scratch: Path) -> list:
    """Attention maps of the model in `folder` over the first task's probe examples (same tokenizer only)."""
    task, task_dir = next(iter(task_dirs.items()))
    spec = get_task(task)
    tokenizer = load_tokenizer(folder)
    table = read_task_table(task_dir, spec, "validation", min(params.compare.probe_examples,
                                                              params.extract.attention_examples))
    path = scratch / f"{folder.name}.attention.parquet"
    extract_attention(load_encoder(folder), tokenizer, encode_task(table, spec, tokenizer, params.finetune.max_length),
                      path, {"run": folder.name, "task": task}, params.extract.batch_size, device)
    return attention_maps(AttentionTable(path))


def main(args, params):
    device = default_device()
    task_dirs = {task: args.tasks / task for task in params.tasks}
    seed = params.seeds[0]
    folders = {"ORIG": args.pretrained} | {f"FT:{task}": args.checkpoints / task / f"seed{seed}" for task in params.tasks}
    same_tokenizer = set(folders)
    folders |= {name: args.compared / name for name in params.compare.models}
    representations = {label: probe_representations(folder, params, task_dirs, device) for label, folder in folders.items()}
    cli.log.info("encoded the probe (%d examples per task, %d tasks) with %d models", params.compare.probe_examples,
                 len(task_dirs), len(folders))
    p = params.similarity
    options, uncertainty = settings(p)
    metrics, rows, localization_rows = {}, [], []
    with atomic_path(args.plots, is_dir=True) as tmp, atomic_path(args.localization, is_dir=True) as tmp_localization:
        plots, localization_dir = Path(tmp), Path(tmp_localization)
        for pooling, measures in p.measures.items():
            # Word rows ("tokens") are lined up on their keys: the words every model's truncation kept.
            models = models_for_pooling(representations, pooling)
            sizes = {label: len(layers) for label, layers in models.items()}
            for measure in measures:  # before any work: e.g. mixedsim needs more examples than neurons
                check_computable(measure, len(models["ORIG"][0]),
                                 {label: layers[0].shape[1] for label, layers in models.items()})
            matrices = {}
            for measure in measures:
                report = stacked_report(models, measure, f"{MEASURES[measure].label}, {pooling.upper()} — {params.model} "
                                        "and its fine-tuned models", options=options, uncertainty=uncertainty,
                                        pooling=pooling)
                matrices[measure] = report.matrix
                write_figure(report.figure, plots / f"{pooling}.{measure}.png")
                rows += report.rows
                metrics.setdefault(pooling, {})[measure] = report.summary
            found = localization_report(matrices, sizes, p.localization, f"{pooling.upper()} — base and fine-tuned",
                                        pooling=pooling)
            if found is not None:
                metrics[pooling]["localization"] = {label: [number(v) for v in values]
                                                    for label, values in found.scores.items()}
                localization_rows += found.rows
                write_figure(found.figure, localization_dir / f"{pooling}.png")
        if p.attention_measures:
            with tempfile.TemporaryDirectory() as scratch:
                maps = {label: probe_attention(folders[label], params, task_dirs, device, Path(scratch))
                        for label in folders if label in same_tokenizer}
            for measure in p.attention_measures:
                report = stacked_report(maps, measure, f"{attention_measure_label(measure)} — {params.model} and its "
                                        "fine-tuned models", first_layer=1, attention=True, pooling="attention")
                write_figure(report.figure, plots / f"attention.{measure}.png")
                rows += report.rows
                metrics.setdefault("attention", {})[measure] = report.summary
        write_json(rows, plots / "matrices.json")
        # Always written (empty without neuronsim and svcca): git cannot hold an empty output folder.
        write_json(localization_rows, localization_dir / "localization.json")
    write_json(metrics, args.metrics)
    cli.log.info("wrote %s and %s", args.plots, args.metrics)


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    parser.add_argument("--checkpoints", type=Path, required=True, help="folder holding <task>/seed<k>/ checkpoints")
    parser.add_argument("--compared", type=Path, required=True, help="folder written by download_compared")
    parser.add_argument("--tasks", type=Path, required=True, help="folder holding <task>/ task tables")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plots", type=Path, required=True, help="folder for figures and plot data")
    parser.add_argument("--localization", type=Path, required=True, help="folder for localization curves")
    cli.run_stage(main, parser.parse_args())
