"""download_model: snapshot the encoder named by `model` into a local folder. The only stage, with
download_task, that may reach the network."""

from layersim import cli
from layersim.io import atomic_path
from layersim.models import snapshot_model


def main(args, params):
    with atomic_path(args.out, is_dir=True) as tmp:
        info = snapshot_model(params.model, tmp)
    cli.log.info("wrote %s (%s, revision %s)", args.out, params.model, info["revision"])


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("out", help="folder to write, e.g. data/models/<model>/pretrained")
    cli.run_stage(main, p.parse_args())
