"""extract: per-layer pooled representations (CLS, mean, last sub-word) of every validation example, one
row per word ("tokens", validation only), and attention maps of a few, for the pretrained model (run
"orig"), each fine-tuned seed (runs "seed<k>") and, with similarity.random_control, the random-init control
(run "random": validation only) and similarity.random_controls − 1 more ("random2", …: validation tables only)."""

from pathlib import Path

from layersim import cli
from layersim.compute.device import resolve_device
from layersim.data.batching import encode_task
from layersim.experiments.extract import extract_activations, extract_task_attention
from layersim.errors import LayersimError
from layersim.data.io import atomic_path, finetuned_runs, read_task_table, run_expectations
from layersim.models.registry import load_encoder, load_tokenizer, model_shape, verified_info
from layersim.data.disk import check_free_space, extract_bytes, train_poolings
from layersim.models.random_control import RANDOM_RUN, control_runs, random_encoder, random_run_metadata
from layersim.data.tasks import get_task
from layersim.params.validate import head_pooling


def main(args, params):
    spec = get_task(args.task)
    p = params.extract
    # Validation tables at the top (what similarity compares); train tables in train/ (truncate's heads, align).
    splits = {"validation": (read_task_table(args.task_dir, spec, "validation", p.max_examples), ""),
              "train": (read_task_table(args.task_dir, spec, "train", p.max_train_examples), "train")}
    finetuned = finetuned_runs(params.finetune, params.seeds)  # finetune.method's, then compare_methods'
    compared = {run.name for run in finetuned if not run.primary}
    runs = {"orig": args.pretrained} | {run.name: run.folder(args.checkpoints) for run in finetuned}
    # The random-init controls' init seeds: the pretrained model's config and tokenizer, weights drawn afresh.
    controls = control_runs(params.similarity.random_control, params.similarity.random_controls)
    runs |= {run: args.pretrained for run in controls}
    known = run_expectations(args.checkpoints, finetuned, args.task_dir)  # fine-tuned on these tables
    task_digest = known["orig"]["task_digest"]
    if verified_info(args.pretrained)["digest"] != known["orig"]["model_digest"]:
        raise LayersimError(f"the checkpoints in {args.checkpoints} were not fine-tuned from {args.pretrained}; "
                            "re-run the finetune stage.")
    check_free_space(args.out, extract_bytes(params, spec, {s: t.num_rows for s, (t, _) in splits.items()}, len(runs),
                                             head_pooling(args.pretrained), model_shape(args.pretrained)), args.task)
    device = resolve_device(params.device)
    with atomic_path(args.out, is_dir=True) as tmp:
        for run, folder in runs.items():
            identity = {"model_digest": verified_info(folder)["digest"]}
            tokenizer = load_tokenizer(folder)
            if run in controls:
                identity = random_run_metadata(identity, controls[run])
            encoder = random_encoder(folder, controls[run]) if run in controls else load_encoder(folder)
            further = run in controls and run != RANDOM_RUN  # read for the above-random headline's spread only
            for split, (table, subfolder) in splits.items():
                if split != "validation" and (run in controls or run in compared):
                    continue  # the controls and compare_methods' runs: for similarity, which reads validation only
                # Words ("tokens") are validation data points only; train tables feed truncate's heads (the
                # pooling the model's own head reads: cls, or last for decoders) and align's maps (align.pooling).
                poolings = p.poolings if split == "validation" else train_poolings(params, head_pooling(args.pretrained))
                encoded = encode_task(table, spec, tokenizer, params.finetune.max_length, words="tokens" in poolings)
                metadata = {"model": params.model, **identity, "run": run, "task": spec.name, "split": split,
                            "task_digest": task_digest}
                outputs = {q: Path(tmp) / subfolder / f"{run}.{q}.parquet" for q in poolings}
                # Beside the validation tables: Block Influence over every token, angles on the head's token.
                pruning = Path(tmp) / f"{run}.pruning.json" if split == "validation" and not further else None
                extract_activations(encoder, tokenizer, spec, encoded, outputs, metadata, p.batch_size, device,
                                    max_tokens=p.max_tokens, pruning_path=pruning, precision=p.table_precision)
            if p.attention_examples and not further:  # attention maps of a few examples (Wu et al.'s measures)
                table = read_task_table(args.task_dir, spec, "validation", p.attention_examples)
                metadata = {"model": params.model, **identity, "run": run, "task": spec.name, "split": "validation",
                            "task_digest": task_digest}
                extract_task_attention(encoder, tokenizer, table, spec, params,
                                       Path(tmp) / "attention" / f"{run}.parquet", metadata, device)
            cli.log.info("read %s, wrote %s.{%s}.parquet", folder, run, ",".join(p.poolings))
    cli.log.info("wrote %s (%s)", args.out, ", ".join(f"{split}: {t.num_rows} examples" for split, (t, _) in splits.items()))


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    p.add_argument("--checkpoints", type=Path, required=True, help="folder of seed<k>/, <method>/seed<k>/")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--out", type=Path, required=True, help="folder of activation tables to write")
    cli.run_stage(main, p.parse_args())
