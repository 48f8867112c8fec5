"""check_params: validate the whole params.yaml before any other stage runs its command.

Every other stage depends on this stage's output, so DVC runs it first and stops if it fails: no
value of params.yaml reaches a shell in dvc.yaml's commands (`${model}`, `${item.task}`) before it has
been validated as a registry name or a hub id, which cannot hold shell syntax (docs/params-safety.md).
The output never changes, so a params change reruns only the stages that read the changed key.
It also refuses, in one sentence, params whose plan (layersim.plan) writes more than the volume has free, before
any model stage starts (docs/paper-configuration.md)."""

from layersim import cli
from layersim.data.io import atomic_path
from layersim.params.measure_sizes import check_measure_sizes
from layersim.plan import check_fits

CHECKED = "params.yaml passed validation; see docs/params-safety.md\n"


def main(args, params):
    check_measure_sizes(params)
    cli.log.info("%s", check_fits(params))
    with atomic_path(args.out) as tmp:
        tmp.write_text(CHECKED)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("out", help="file to write when the params are valid (its content is constant)")
    cli.run_stage(main, p.parse_args(), quiet_transformers=False)
