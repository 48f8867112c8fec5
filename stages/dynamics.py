"""dynamics: for one task, how far each layer moved over fine-tuning — every seed's points (ORIG at step 0, the
states the finetune stage kept, finetune.keep_states, and the final checkpoint) against ORIG and against the final
model, layer k against layer k, in linear CKA on the similarity headline's points, each value with its permutation
null and bootstrap interval; the run's evaluations and convergence verdict on the same step axis
(layersim.experiments.dynamics). With no kept state it compares the end points only."""

from pathlib import Path

from layersim import cli
from layersim.data.io import atomic_path, write_figure, write_json
from layersim.experiments.dynamics import task_dynamics
from layersim.reporting.headlines import write_metrics


def main(args, params):
    out = task_dynamics(args.activations, args.checkpoints, args.states, args.task_dir, args.live, args.task, params,
                        cli.log.info)
    with atomic_path(args.plots / "curves", is_dir=True) as curves:  # the folder appears complete or not at all
        for name, rows in out.curves.items():
            write_json(rows, Path(curves) / name)
    write_figure(out.figure, args.plots / "dynamics.png")
    write_metrics(out.full, out.headline, args.metrics, args.details)
    cli.log.info("wrote %s, %s and %s", args.plots, args.metrics, args.details)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    p.add_argument("--checkpoints", type=Path, required=True, help="folder of the task's checkpoints")
    p.add_argument("--states", type=Path, required=True, help="folder of the task's kept states (finetune.keep_states)")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--live", type=Path, help="the finetune stage's dvclive folder of the task (its evaluations)")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for curves/ (rows per layer) and dynamics.png")
    cli.run_stage(main, p.parse_args(), analysis=True)
