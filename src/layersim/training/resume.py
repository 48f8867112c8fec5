"""Resumable fine-tuning: the whole training state, saved atomically every N steps.

A pre-empted run (SIGKILL at any instruction) that is started again continues from the last saved
state and ends with the same weights and metrics, bit for bit on CPU, as a run that was never
interrupted. That needs everything the remaining steps depend on:

- model weights, optimizer moments and step counts, the LR scheduler's position;
- the RNG streams (torch — dropout —, NumPy, Python's `random`; CUDA's when used);
- the data position: the data order is a pure function of the seed (`layersim.training.train.DataOrder`),
  so the step number is the position;
- the loss accumulated since the last log line, and the history of logged values, which is replayed
  into the logger so that curves (dvclive) come out as if the run had never stopped.

A state carries a fingerprint of what produced it (params, seed, base weights, data); a state with a
different fingerprint is stale — from another configuration — and is discarded, never resumed.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from layersim.errors import LayersimError

from layersim.data.io import atomic_path

log = logging.getLogger("layersim")

STATE_FILE = "state.pt"


@dataclass
class TrainingState:
    """Everything a fine-tuning run needs to continue after `step` completed steps."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    running_loss: torch.Tensor
    running_count: int
    history: list[tuple[int, dict[str, float]]]

    @classmethod
    def capture(cls, step: int, model, optimizer, scheduler, running_loss: torch.Tensor, running_count: int,
                history: list) -> "TrainingState":
        return cls(step=step, model=model.state_dict(), optimizer=optimizer.state_dict(),
                   scheduler=scheduler.state_dict(), rng=_rng_state(), running_loss=running_loss.detach().clone(),
                   running_count=running_count, history=[(s, dict(v)) for s, v in history])

    def restore(self, model, optimizer, scheduler) -> tuple[int, torch.Tensor, int]:
        """Load the state into freshly built objects; returns (next step, running loss, running count)."""
        model.load_state_dict(self.model)
        optimizer.load_state_dict(self.optimizer)
        scheduler.load_state_dict(self.scheduler)
        _set_rng_state(self.rng)
        return self.step, self.running_loss, self.running_count


class TrainingCheckpoint:
    """The folder where one run's :class:`TrainingState` lives (outside the stage's DVC outputs, so
    that DVC does not delete it before re-running the stage).

    `fingerprint` is any JSON-able description of what determines the run; a saved state resumes
    only a run with the same fingerprint.
    """

    def __init__(self, folder: str | Path, fingerprint: dict[str, Any]):
        self.folder = Path(folder)
        self.fingerprint = json.dumps(fingerprint, sort_keys=True)

    @property
    def path(self) -> Path:
        return self.folder / STATE_FILE

    def save(self, state: TrainingState) -> None:
        """Write the state atomically: a kill mid-write leaves the previous state intact."""
        with atomic_path(self.path) as tmp:
            torch.save({"format": STATE_FORMAT, "fingerprint": self.fingerprint, **vars(state)}, tmp)
        log.info("saved resumable training state at step %d to %s", state.step, self.path)

    def load(self, device: torch.device) -> TrainingState | None:
        """The saved state if it belongs to this run, else None (a stale state is removed)."""
        self._remove_partial_writes()
        if self.path.exists() and not self.path.is_file():  # found now, not when the first save fails mid-run
            raise LayersimError(f"the training state {self.path} is a folder, not a file; remove it so that the run "
                                "can save its resumable state there.")
        if not self.path.is_file():
            return None
        try:
            saved = torch.load(self.path, map_location=device, weights_only=True)
        except Exception as err:  # a state we cannot read is as good as none: start over, loudly
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            log.warning("ignoring unreadable training state %s (%s); starting from step 0", self.path, reason)
            self.clear()
            return None
        problem = _incompatible(saved)
        if problem:
            log.warning("discarded resume state at %s: %s; starting from step 0", self.path, problem)
            self.clear()
            return None
        saved.pop("format")
        if saved.pop("fingerprint") != self.fingerprint:
            log.warning("ignoring training state %s: it was saved by a run with other params, seed or data; "
                        "starting from step 0", self.path)
            self.clear()
            return None
        state = TrainingState(**saved)
        log.info("resuming from %s at step %d", self.path, state.step)
        return state

    def clear(self) -> None:
        """Delete the state (and the folder, if nothing else is in it): a finished run keeps only its final
        checkpoint. Nothing but the state's own files is deleted, wherever the folder points."""
        self.path.unlink(missing_ok=True)
        self._remove_partial_writes()
        try:
            self.folder.rmdir()
        except OSError:  # missing, or holds something else: not ours to delete
            pass

    def _remove_partial_writes(self) -> None:
        # A kill during `save` leaves a hidden temporary beside the state; it is never read.
        for leftover in self.folder.glob(f".{STATE_FILE}.*.tmp"):
            leftover.unlink(missing_ok=True)


# Version of the saved dictionary's layout; a state of another version is discarded, never misread.
STATE_FORMAT = 1
_FIELDS = {"step": int, "model": dict, "optimizer": dict, "scheduler": dict, "rng": dict,
           "running_loss": torch.Tensor, "running_count": int, "history": list}


def _incompatible(saved: Any) -> str | None:
    """Why a loaded state cannot be resumed (another format, a missing or mistyped entry), or None."""
    if not isinstance(saved, dict):
        return f"it holds a {type(saved).__name__}, not a training state"
    if saved.get("format") != STATE_FORMAT:
        return f"it has format {saved.get('format')!r}, this version reads format {STATE_FORMAT}"
    missing = [key for key in (*_FIELDS, "fingerprint") if key not in saved]
    if missing:
        return f"it lacks {', '.join(missing)}"
    extra = [key for key in saved if key not in _FIELDS and key not in ("format", "fingerprint")]
    if extra:
        return f"it has unknown entries {', '.join(map(str, extra))}"
    wrong = [key for key, kind in _FIELDS.items() if not isinstance(saved[key], kind)]
    if wrong:
        return f"its {', '.join(wrong)} {'has' if len(wrong) == 1 else 'have'} the wrong type"
    if not all(key in saved["rng"] for key in ("torch", "python", "numpy")):
        return "its random-number state is incomplete"
    return None


def _rng_state() -> dict[str, Any]:
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             # As plain values: torch.load(weights_only=True) refuses NumPy arrays.
             "numpy": [kind, keys.tolist(), position, has_gauss, cached_gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(_as_tuples(state["python"]))
    kind, keys, position, has_gauss, cached_gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _as_tuples(value):
    """random.setstate wants the nested tuples random.getstate gave; serialisation may turn them to lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
