"""The rows and states the layer-pruning measures read, as the papers define them, summed during extraction.

* **Block Influence** (ShortGPT; Men et al. 2024): ``BI_k = 1 − (1/T) Σ_t cos(x_{k−1,t}, x_{k,t})`` over every
  token ``t`` of every input sequence that is not padding, special tokens ([CLS], [SEP], <s>, BOS) included —
  not the word points of the ``tokens`` tables. A multiple-choice example gives one sequence per choice.
* **Angular distance** (Gromov et al. 2024): ``d(l, n) = arccos(cos(x_l, x_{l+n})) / π`` on one token per
  sequence, averaged over sequences. Gromov take the final token: in a causal model it is the one that has
  seen the whole input and that the prediction is read from, so decoders (and XLNet) use the last non-pad
  token, as their heads do. In a bidirectional encoder every token sees the whole input; the token the
  prediction is read from is the first ([CLS], <s>), so encoders use it (their last token is [SEP], a special
  token many heads attend to as a no-op, Clark et al. 2019): the rule, applied to the token the task reads.
* **State**: every layer's state is its block's output at the same point. Transformers' ``hidden_states[k]``
  is that for ``k < L``, but for decoders and ModernBERT ``hidden_states[L]`` is after the final norm, whose
  per-channel gain changes cosines; layer L's state is taken by a forward hook on the last block instead
  (:func:`layersim.models.encoders.last_block_output`), for every architecture.

Tokens are normalised in float32 on the device, ``1 − cos = |â − b̂|² / 2`` (no cancellation near cos = 1), and
summed in float64; a zero state has no direction and is left out of the pairs it is in, as in
:mod:`layersim.similarity.pruning` (the per-sequence angles: :class:`layersim.compute.angles.LayerAngleSums`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from layersim.compute.angles import LayerAngleSums
from layersim.errors import LayersimError

if TYPE_CHECKING:  # torch is imported where tensors are handled: the stages that only read records need none
    import torch

BLOCK_INFLUENCE_ROWS = "every non-pad token of every sequence, special tokens included (ShortGPT)"
ANGULAR_ROWS = {"first": "the first token of each sequence, which the head reads ([CLS], <s>)",
                "last": "the last non-pad token of each sequence (Gromov et al.'s final token)"}
STATE = "each layer's block output, before any final norm (layer L by a forward hook on the last block)"


class PruningStates:
    """Block Influence sums over every token and the angular-distance accumulator over one token per sequence,
    batch after batch; :meth:`record` gives what the extract stage writes as ``<run>.pruning.json``."""

    def __init__(self, num_layers: int, head_token: str):
        self.head_token = head_token
        self._influence = np.zeros(num_layers)
        self._tokens = np.zeros(num_layers, dtype=np.int64)
        self._final = LayerAngleSums(num_layers)

    def update(self, states: Sequence[torch.Tensor], attention_mask: torch.Tensor, head_position: torch.Tensor):
        """Add a batch: ``states[k]`` (sequences, length, hidden) for layers 0 … L, batch-first; the non-pad
        tokens are where `attention_mask` is 1; `head_position` (sequences,) the token the angles read."""
        import torch

        attended = attention_mask.bool()
        previous = None
        for k, state in enumerate(states):
            units, nonzero = _unit_tokens(state[attended])
            if previous is not None:
                both = nonzero & previous[1]
                diff = units[both] - previous[0][both]
                self._influence[k - 1] += float((diff * diff).sum(-1).double().sum()) / 2.0
                self._tokens[k - 1] += int(both.sum())
            previous = units, nonzero
        rows = torch.arange(attended.shape[0], device=attended.device)
        self._final.update([s[rows, head_position].float().cpu().numpy() for s in states])

    def record(self) -> dict:
        """The JSON the skip and similarity stages read (layersim.similarity.pruning.measures_from_record)."""
        angular, cosine, rows = self._final.means()
        with np.errstate(invalid="ignore", divide="ignore"):
            influence = self._influence / self._tokens

        def listed(a: np.ndarray) -> list:
            return [listed(row) for row in a] if a.ndim > 1 else [None if np.isnan(v) else float(v) for v in a]

        return {"state": STATE,
                "block_influence": {"rows": BLOCK_INFLUENCE_ROWS, "tokens": self._tokens.tolist(),
                                    "values": listed(influence)},
                "angular_distance": {"rows": ANGULAR_ROWS[self.head_token], "angular": listed(angular),
                                     "cosine_distance": listed(cosine), "rows_per_pair": rows.tolist()}}


def read_pruning_record(path: Path, expect: Mapping) -> dict:
    """One run's record as :meth:`PruningStates.record` wrote it beside its tables (``<run>.pruning.json``),
    checked against `expect` (run, task, digests); layersim.similarity.pruning.measures_from_record reads it."""
    if not path.is_file():
        raise LayersimError(f"{path} does not exist; re-run the extract stage, which writes it beside the tables.")
    record = json.loads(path.read_text())
    for key, value in expect.items():
        if record.get(key) != value:
            raise LayersimError(f"{path} has {key} = {record.get(key)!r}, expected {value!r}; re-run the extract "
                                "stage on this checkpoint.")
    return record


def measured_rows(record: Mapping) -> dict[str, str]:
    """Measure → the rows it averages over, in words, from a record."""
    return {name: record[name]["rows"] for name in ("block_influence", "angular_distance")}


def _unit_tokens(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows scaled to unit length in float32 (each first divided by its largest |value|, so no square
    overflows), and which rows are not all zero."""
    import torch

    tokens = tokens.float()
    peak = tokens.abs().amax(-1, keepdim=True)
    nonzero = peak[:, 0] > 0
    scaled = tokens / torch.where(peak > 0, peak, 1.0)
    return scaled / scaled.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny), nonzero
