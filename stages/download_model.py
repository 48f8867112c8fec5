"""download_model: snapshot the encoder named by `model` into a local folder, or (--compared) every
encoder of `compare.models` into one subfolder each. The only stages, with download_task, that may
reach the network."""

from pathlib import Path

from layersim import cli
from layersim.io import atomic_path, write_json
from layersim.models import snapshot_model


def main(args, params):
    names = list(params.compare.models) if args.compared else [params.model]
    with atomic_path(args.out, is_dir=True) as tmp:
        for name in names:
            folder = Path(tmp) / name if args.compared else Path(tmp)
            info = snapshot_model(name, folder)
            cli.log.info("wrote %s (%s, revision %s)", Path(args.out) / folder.relative_to(tmp), name, info["revision"])
        if args.compared:
            write_json(names, Path(tmp) / "models.json")  # the folder is never empty, also for no models


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("out", help="folder to write, e.g. data/models/<model>/pretrained")
    p.add_argument("--compared", action="store_true", help="snapshot compare.models into subfolders of out")
    cli.run_stage(main, p.parse_args())
