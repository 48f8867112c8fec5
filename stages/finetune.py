"""finetune: fine-tune the pretrained encoder on one task with one seed (Phang et al. §2)."""

import json
from pathlib import Path

from dvclive import Live

from layersim import cli
from layersim.training.convergence import enforce
from layersim.compute.device import resolve_device
from layersim.data.io import atomic_path, task_tables_digest, write_json
from layersim.models.registry import load_tokenizer
from layersim.data.tasks import get_task
from layersim.training.resume import TrainingCheckpoint
from layersim.training.train import encoded_splits, finetune, run_fingerprint, save_checkpoint


def main(args, params):
    cli.check_separate(args, "out", "metrics", "live", "resume", "timings")
    spec = get_task(args.task)
    tokenizer = load_tokenizer(args.pretrained)
    max_length = params.finetune.max_length
    train, validation = encoded_splits(args.task_dir, spec, tokenizer, max_length)
    cli.log.info("read %s: %d train / %d validation examples", args.task_dir, len(train), len(validation))

    resume = None
    if args.resume:
        fingerprint = run_fingerprint(args.pretrained, args.task_dir, spec, params.finetune, args.seed)
        resume = TrainingCheckpoint(args.resume, fingerprint)

    # The matrix declares these curves in dvc.yaml itself, so dvclive must not write a dvc.yaml. A resumed
    # run starts the curves afresh: finetune replays the steps logged before the interruption.
    with Live(str(args.live), dvcyaml=False, save_dvc_exp=False) as live:
        def log(step, values):
            live.step = step
            for name, value in values.items():
                live.log_metric(name, value)

        timing, checks = {}, {}
        model, metrics = finetune(args.pretrained, spec, train, validation, params.finetune, args.seed, log=log,
                                  resume=resume, timing=timing, checks=checks, device=resolve_device(params.device))
    # Before any output: with finetune.require_convergence an unconverged run leaves no checkpoint or metrics.
    convergence = checks["convergence"].record()
    enforce(checks["convergence"], f"fine-tuning {spec.name} seed {args.seed}", params.finetune, cli.log)

    with atomic_path(args.out, is_dir=True) as tmp:
        save_checkpoint(model, tokenizer, tmp, base_dir=args.pretrained, task=spec.name, seed=args.seed,
                        task_digest=task_tables_digest(args.task_dir), convergence=convergence)
    # the task's metrics and the convergence check: task and seed are in the path, steps in params
    write_json(metrics | {"convergence": convergence}, args.metrics)
    if args.timings:  # wall clock: kept out of every output DVC hashes
        write_json({"train_seconds": timing["train_seconds"]}, args.timings)
    if resume:
        resume.clear()  # the run is finished: later stages need only the checkpoint
    cli.log.info("wrote %s and %s: %s", args.out, args.metrics, json.dumps(metrics))


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    p.add_argument("--metrics", type=Path, required=True, help="validation metrics JSON to write")
    p.add_argument("--live", type=Path, required=True, help="dvclive folder for the training curves")
    p.add_argument("--timings", type=Path, help="JSON of the training time (wall clock), which no DVC-hashed "
                                                "output holds")
    p.add_argument("--resume", type=Path, help="folder for the resumable training state (kept outside DVC's "
                                              "outputs; a killed run started again continues from it)")
    cli.run_stage(main, p.parse_args())
