"""finetune: fine-tune the pretrained encoder on one task with one seed (Phang et al. §2); or, with
--pretraining-models, each model of align.pretraining_models with the first of seeds, one subfolder each (Ren et al.)."""

import json
from contextlib import nullcontext
from pathlib import Path

from dvclive import Live

from layersim import cli
from layersim.training.convergence import checked_convergence
from layersim.compute.compiled import compiles
from layersim.compute.device import resolve_device
from layersim.data.io import atomic_path, task_tables_digest, write_json
from layersim.models.registry import load_tokenizer
from layersim.data.tasks import get_task
from layersim.training.resume import TrainingCheckpoint
from layersim.training.train import (StateKeeper, encoded_splits, finetune, live_logger, run_fingerprint,
                                     save_checkpoint, with_method)


def run(args, params, spec, pretrained: Path, seed: int, out: Path, live_dir, resume_dir, states=None):
    """Fine-tune `pretrained` with `seed` into `out`, kept states into `states`; returns its metrics and convergence."""
    tokenizer = load_tokenizer(pretrained)
    train, validation = encoded_splits(args.task_dir, spec, tokenizer, params.finetune.max_length)
    cli.log.info("read %s: %d train / %d validation examples", args.task_dir, len(train), len(validation))
    device = resolve_device(params.device)
    resume = resume_dir and TrainingCheckpoint(resume_dir, run_fingerprint(
        pretrained, args.task_dir, spec, params.finetune, seed, compiled=compiles(params.finetune.compile, device)))
    # dvc.yaml declares these curves (dvclive writes none); a resumed run replays the steps logged before it stopped.
    with (Live(str(live_dir), dvcyaml=False, save_dvc_exp=False) if live_dir else nullcontext()) as live:
        timing, checks, keep = {}, {}, states and StateKeeper.for_run(params.finetune, states, resume_dir)
        model, metrics = finetune(pretrained, spec, train, validation, params.finetune, seed, log=live_logger(live),
                                  keep=keep, resume=resume, timing=timing, checks=checks, device=device)
    # Before any output: with finetune.require_convergence an unconverged run leaves no checkpoint or metrics.
    convergence = checked_convergence(checks["convergence"], spec.name, seed, pretrained, params.finetune, cli.log)
    with atomic_path(out, is_dir=True) as tmp:
        save_checkpoint(model, tokenizer, tmp, base_dir=pretrained, task=spec.name, seed=seed, method=params.finetune.method,
                        task_digest=task_tables_digest(args.task_dir), convergence=convergence)
    if keep:  # after the checkpoint, whose digest their index names
        keep.publish(states, out, params.finetune.max_steps)
    if args.timings:  # wall clock: kept out of every output DVC hashes
        write_json({"train_seconds": timing["train_seconds"]}, args.timings)
    if resume:  # the run is finished: later stages need only the checkpoint (and the kept states)
        resume.clear()
    cli.log.info("wrote %s: %s", out, json.dumps(metrics))
    return metrics | {"convergence": convergence}  # task and seed are in the path, steps in params


def main(args, params):
    cli.check_separate(args, "out", "states", "metrics", "live", "resume", "timings")
    spec, params = get_task(args.task), with_method(params, args.method)  # a run of finetune.compare_methods
    if args.pretraining_models is None:
        return write_json(run(args, params, spec, args.pretrained, args.seed, args.out, args.live, args.resume,
                              args.states), args.metrics)
    with atomic_path(args.out, is_dir=True) as out:  # one folder per model; empty without align.pretraining_models
        write_json({name: run(args, params, spec, args.pretraining_models / name, params.seeds[0], Path(out) / name,
                              None, args.resume and args.resume / name)
                    for name in params.align.pretraining_models}, args.metrics)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--seed", type=int, help="the fine-tuning seed (required without --pretraining-models)")
    p.add_argument("--method", help="a method of finetune.compare_methods (default: finetune.method)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--pretrained", type=Path, help="folder written by download_model")
    source.add_argument("--pretraining-models", type=Path, help="download_paired's folder (align.pretraining_models)")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to write (one subfolder per model)")
    p.add_argument("--states", type=Path, help="folder of the kept intermediate states (finetune.keep_states)")
    p.add_argument("--metrics", type=Path, required=True, help="validation metrics JSON to write (per model)")
    p.add_argument("--live", type=Path, help="dvclive folder for the training curves")
    p.add_argument("--timings", type=Path, help="JSON of the training time (wall clock; no DVC-hashed output)")
    p.add_argument("--resume", type=Path, help="folder of the resumable training state (outside DVC's outputs)")
    args = p.parse_args()
    if args.pretrained and (args.seed is None or args.live is None):
        p.error("--pretrained needs --seed and --live")
    cli.run_stage(main, args)
