"""download_task: write the normalized train and validation tables of one task (registry, generated, or
declared on the user's files under user_tasks: every file read and checked before anything is written)."""

from pathlib import Path

from layersim import cli
from layersim.errors import LayersimError
from layersim.data.io import atomic_path, write_parquet
from layersim.params.lockfile import locked_task_revision
from layersim.data.tasks import SPLITS, generated_table, get_task, hub_table, subsample


def main(args, params):
    if args.task not in params.tasks:
        raise LayersimError(f"task {args.task!r} is not in params.yaml tasks ({', '.join(params.tasks)}).")
    spec = get_task(args.task)
    p = params.download
    limits = {"train": p.max_train_examples, "validation": p.max_validation_examples}
    tables = {}
    if spec.user is not None:
        from layersim.data.tasks.user import user_tables

        tables = {split: subsample(table, limits[split], seed=0) for split, table in user_tables(spec).items()}
    revision = locked_task_revision(spec, p.revisions.get(spec.name))  # layersim.lock's commit, before any work
    with atomic_path(args.out, is_dir=True) as tmp:
        for split in SPLITS:
            if split in tables:
                table = tables[split]
            elif spec.hub is None:
                size = p.generated_train_examples if split == "train" else p.generated_validation_examples
                table = generated_table(spec, split, size, p.generated_seed)
            else:
                table = subsample(hub_table(spec, split, revision), limits[split], seed=0)
            write_parquet(table, Path(tmp) / f"{split}.parquet")
            cli.log.info("%s %s: %d examples", spec.name, split, table.num_rows)
    cli.log.info("wrote %s", args.out)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("task")
    p.add_argument("out", help="folder to write, e.g. data/tasks/<task>")
    cli.run_stage(main, p.parse_args())
