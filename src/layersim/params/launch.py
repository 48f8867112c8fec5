"""The launch section of params.yaml: how `layersim launch` runs the pipeline's nodes as Ray tasks (resources per
task, retries). No stage reads it; :mod:`layersim.params.schema` declares it beside the stages' sections."""

from __future__ import annotations

from dataclasses import dataclass

from layersim.params.rules import NON_NEGATIVE, POSITIVE, at_most, knob


# The pipeline's stages (dvc.yaml's names; tests/test_launch.py keeps the two in step), for launch.gpu_stages.
STAGES = ("check_params", "download_model", "download_compared", "download_paired", "download_task", "finetune",
          "finetune_compared", "finetune_pretrained", "extract", "similarity", "grounding", "compare", "truncate", "skip", "align", "freeze", "export",
          "weights", "dynamics", "summary", "report")


@dataclass(frozen=True)
class LaunchParams:  # `layersim launch`: the pipeline's nodes as Ray tasks (not read by any stage)
    gpu_stages: tuple[str, ...] = knob(("finetune", "finetune_compared", "finetune_pretrained", "extract", "similarity",
                                        "compare", "truncate", "skip", "align", "freeze", "export", "dynamics"),
                                       "stages whose tasks ask Ray for num_gpus (the others for num_cpus)",
                                       names=lambda: (STAGES, True))
    num_gpus: float = knob(1.0, "GPUs per task of a GPU stage (a fraction shares a GPU between tasks)", POSITIVE,
                           at_most(64, "GPUs per task"))
    num_cpus: float = knob(1.0, "CPUs per task of the other stages", POSITIVE, at_most(1024, "CPUs per task"))
    retries: int = knob(2, "times a task is retried when its worker dies (preemption, lost node); a stage that "
                        "fails is not retried", NON_NEGATIVE, at_most(100, "retries"))
