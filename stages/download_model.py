"""download_model: snapshot the encoder named by `model` into a local folder, or (--compared) every
encoder of `compare.models`, or (--paired) every registry model of `align.pairs`, into one subfolder
each. The only stages, with download_task, that may reach the network."""

from pathlib import Path

from layersim import cli
from layersim.data.io import atomic_path, write_json
from layersim.params.lockfile import locked_model_revision
from layersim.models.registry import snapshot_model
from layersim.params import paired_models


def main(args, params):
    several = args.compared or args.paired
    names = list(params.compare.models) if args.compared else paired_models(params) if args.paired else [params.model]
    commits = {name: locked_model_revision(name) for name in names}  # layersim.lock, checked before any download
    with atomic_path(args.out, is_dir=True) as tmp:
        for name in names:
            folder = Path(tmp) / name if several else Path(tmp)
            info = snapshot_model(name, folder, revision=commits[name])
            cli.log.info("wrote %s (%s, revision %s)", Path(args.out) / folder.relative_to(tmp), name, info["revision"])
        if several:
            write_json(names, Path(tmp) / "models.json")  # the folder is never empty, also for no models


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("out", help="folder to write, e.g. data/models/<model>/pretrained")
    p.add_argument("--compared", action="store_true", help="snapshot compare.models into subfolders of out")
    p.add_argument("--paired", action="store_true", help="snapshot the registry models of align.pairs into subfolders")
    cli.run_stage(main, p.parse_args())
