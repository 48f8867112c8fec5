"""Intermediate states of a fine-tuning run (finetune.keep_states), kept for the dynamics stage.

A run keeps `keep_states` states evenly spaced over its steps (:func:`kept_steps`); the final model, its end point,
is the checkpoint itself. Each state is the encoder's weights only (safetensors, ``step<N>/model.safetensors``),
which the final checkpoint's config and tokenizer rebuild (:func:`load_state`); ``states.json`` indexes them: their
steps, each state's SHA-256, and the checkpoint they lead to (its weights digest), so that the dynamics stage reads
only states this run kept, in their order (:func:`read_index`: a swapped, replaced, zeroed or cut-short state is
refused as a model folder is, layersim.models.registry.verified_info). Nothing wall-clock goes in: a rerun writes
the same bytes.

While the run trains, the states are staged outside the stage's DVC outputs — beside the resumable training state
(layersim.training.resume) when there is one — so that a run killed and started again keeps the states written
before its last saved training state and writes the later ones again, from the same weights: a resumed run ends with
the same states as one never interrupted. When the run has finished, :meth:`StateKeeper.publish` moves them into
the output folder at once (layersim.data.io.atomic_path).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from layersim.data.io import atomic_path
from layersim.errors import LayersimError

WEIGHTS = "model.safetensors"
INDEX = "states.json"
STAGING = "states"  # the staging folder's name inside the resume folder


def kept_steps(max_steps: int, keep: int) -> tuple[int, ...]:
    """The steps of `keep` states evenly spaced over a run of `max_steps` steps: ``i · max_steps / (keep + 1)``
    rounded (half up), i = 1 … keep, so that with step 0 (the pretrained model) and `max_steps` (the final one) the
    points are evenly spaced. Distinct, and strictly between 0 and max_steps, for keep < max_steps."""
    if not 0 <= keep < max_steps:
        raise LayersimError(f"finetune.keep_states = {keep} must be at least 0 and smaller than finetune.max_steps = "
                            f"{max_steps}.")
    return tuple((2 * i * max_steps + keep + 1) // (2 * (keep + 1)) for i in range(1, keep + 1))


def step_folder(states: str | Path, step: int) -> Path:
    return Path(states) / f"step{step}"


def encoder_of(model):
    """The bare encoder of a task model (its base model); under LoRA, of a merged copy, the training model untouched
    (merging in place and unmerging would not give back the same bits)."""
    from layersim.training.adapters import is_adapted, merged

    return (merged(copy.deepcopy(model)) if is_adapted(model) else model).base_model


def save_state(model, folder: str | Path) -> None:
    """The encoder weights of `model` (a task model, adapted or not) into `folder`/model.safetensors, atomically."""
    from safetensors.torch import save_file

    # Copies on the CPU: no two names share storage (which safetensors refuses), whatever the model ties.
    weights = {name: value.detach().to("cpu", copy=True).contiguous()
               for name, value in encoder_of(model).state_dict().items()}
    with atomic_path(folder, is_dir=True) as tmp:
        save_file(weights, str(Path(tmp) / WEIGHTS))


def load_state(encoder, folder: str | Path):
    """`encoder` (the final checkpoint's, layersim.models.registry.load_encoder) with a kept state's weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS
    if not path.is_file():
        raise LayersimError(f"the kept state {path} is missing; re-run the finetune stage.")
    try:
        encoder.load_state_dict(load_file(str(path)), strict=True)
    except (RuntimeError, OSError, SafetensorError) as err:
        raise LayersimError(f"the kept state {path} cannot be loaded into the checkpoint's encoder "
                            f"({str(err).splitlines()[0][:200]}); re-run the finetune stage.") from None
    return encoder


class StateKeeper:
    """Where a run stages its kept states while it trains, and which steps it keeps."""

    def __init__(self, staging: str | Path, steps: Sequence[int]):
        self.staging, self.steps = Path(staging), tuple(steps)

    @classmethod
    def for_run(cls, finetune, out: str | Path, resume: str | Path | None) -> "StateKeeper":
        """The keeper of a run of `finetune` (FinetuneParams) whose states go to `out`: staged in the resume folder
        when there is one, else in a hidden sibling of `out` (cleared as the run starts)."""
        staging = Path(resume) / STAGING if resume else Path(out).parent / f".{Path(out).name}.staging"
        return cls(staging, kept_steps(finetune.max_steps, finetune.keep_states))

    def start(self, step: int) -> None:
        """The run starts after `step` completed steps (0: from the beginning): states staged after it, by a run
        that went further before it was killed (or by another configuration, at step 0), are removed."""
        if not self.staging.is_dir():
            return
        for folder in self.staging.iterdir():
            number = folder.name[4:] if folder.name.startswith("step") else ""
            if not number.isdigit() or int(number) > step:
                shutil.rmtree(folder) if folder.is_dir() else folder.unlink()

    def keeps(self, step: int) -> bool:
        return step in self.steps

    def save(self, step: int, model) -> None:
        save_state(model, step_folder(self.staging, step))

    def publish(self, out: str | Path, checkpoint: str | Path, max_steps: int) -> None:
        """Every staged state into `out` (written at once) with the index naming the final `checkpoint`; then the
        staging folder is removed."""
        from layersim.models.registry import model_info

        missing = [step for step in self.steps if not (step_folder(self.staging, step) / WEIGHTS).is_file()]
        if missing:
            raise LayersimError(f"the states of steps {', '.join(map(str, missing))} were not kept in {self.staging}; "
                                "re-run the finetune stage.")
        from layersim.models.registry import file_digest

        with atomic_path(out, is_dir=True) as tmp:
            for step in self.steps:
                shutil.copytree(step_folder(self.staging, step), step_folder(tmp, step))
            index = {"steps": list(self.steps), "max_steps": max_steps, "checkpoint_digest": model_info(checkpoint)["digest"],
                     "digests": {f"step{step}": file_digest(step_folder(tmp, step) / WEIGHTS) for step in self.steps}}
            (Path(tmp) / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(self.staging, ignore_errors=True)


def read_index(states: str | Path, checkpoint_digest: str) -> dict:
    """A run's kept states' index (``steps``, ``max_steps``, ``digests``), checked as a checkpoint is before anything
    reads a state: it names the final checkpoint's digest (the run the states belong to), its steps are those the run
    keeps (:func:`kept_steps`, ascending), and each state's file hashes to the digest recorded when it was kept."""
    from layersim.models.registry import file_digest

    path, rerun = Path(states) / INDEX, "re-run the finetune stage"
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LayersimError(f"the kept states' index {path} cannot be read ({type(err).__name__}); {rerun}.") from None
    if not isinstance(index, dict):
        raise LayersimError(f"the kept states' index {path} holds no JSON object; {rerun}.")
    if index.get("checkpoint_digest") != checkpoint_digest:
        raise LayersimError(f"the kept states in {states} belong to another checkpoint than the one beside them; "
                            f"{rerun}.")
    steps, max_steps, digests = index.get("steps"), index.get("max_steps"), index.get("digests")
    try:
        expected = kept_steps(max_steps, len(steps))
    except (TypeError, LayersimError):
        expected = None
    if expected is None or list(expected) != steps:
        raise LayersimError(f"the kept states' index {path} lists steps {steps} of {max_steps}, not the evenly spaced "
                            f"ascending steps a run keeps; {rerun}.")
    if not isinstance(digests, dict) or set(digests) != {f"step{step}" for step in steps}:
        raise LayersimError(f"the kept states' index {path} records no digest for every state (written before kept "
                            f"states were checked, or edited); {rerun}.")
    for step in steps:
        weights = step_folder(states, step) / WEIGHTS
        if not weights.is_file():
            raise LayersimError(f"the kept state {weights} is missing; {rerun}.")
        if file_digest(weights) != digests[f"step{step}"]:
            raise LayersimError(f"the kept state {weights} is not the state of step {step} its run kept (its digest "
                                f"differs from the recorded one: changed, cut short, swapped or replaced since the "
                                f"finetune stage wrote it); {rerun}.")
    return index


def refuse_kept_state(folder: str | Path, name: str) -> None:
    """A kept state (``step<N>``: the encoder's weights only) or a run's folder of them, given where a model folder
    is expected, refused in one sentence that says how to compare it: loaded onto its run's final checkpoint."""
    folder = Path(folder)
    if (folder / INDEX).is_file() or ((folder / WEIGHTS).is_file() and (folder.parent / INDEX).is_file()
                                      and not (folder / "config.json").is_file()):
        state = folder if (folder / WEIGHTS).is_file() else folder / "step<N>"
        raise LayersimError(f"{name} {str(folder)!r} is a fine-tuning run's kept state{'' if state == folder else 's'} "
                            "(the encoder's weights only, no config or tokenizer); pass the state loaded onto its run's "
                            f"checkpoint, load_state(load_encoder(checkpoint), '{state}') from layersim.training.states, "
                            "and the checkpoint folder (data/checkpoints/<task>/seed<k>/model) as its tokenizer.")
