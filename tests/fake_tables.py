"""Activation tables and model folders as the pipeline's stages write them, from no real model: the inputs of the
unit tests of the similarity stage and of the readers' integrity checks (tests/test_integrity.py,
test_bad_inputs_integrity.py, test_every_measure.py, test_similarity_pruning.py; the `extracted` fixture in
tests/conftest.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from layersim.data.io import ActivationWriter, finetuned, layer_column, with_metadata, write_parquet
from layersim.models.registry import MODEL_INFO_FILE, weights_digest
from layersim.params import parse_params

NUM_LAYERS = 2
HIDDEN = 4
TASK = "synth-negation"
ROWS = 40  # examples of the `extracted` tables


def fake_model_folder(folder: Path, weights: bytes, **info) -> str:
    """A model folder as far as its integrity checks go (weights bytes, config, info with the digest of its
    files): the activation tables of these tests come from no real model. Returns the digest."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": NUM_LAYERS, "hidden_size": HIDDEN}))
    digest = weights_digest(folder)
    (folder / MODEL_INFO_FILE).write_text(json.dumps({**info, "digest": digest}))
    return digest


with tempfile.TemporaryDirectory() as _scratch:
    DIGESTS = {"orig": "d0" * 32} | {run: fake_model_folder(Path(_scratch) / run, run.encode())
                                     for run in ("seed1", "seed2")}


def write_activations(path: Path, ids=(3, 1, 4, 5, 9), *, run: str = "orig", task: str = TASK,
                      split: str = "validation", pooling: str = "cls", digest: str | None = None, seed: int = 0,
                      label_type=pa.int64(), nan_at: tuple[int, int] | None = None, rows_per_group: int = 4096) -> dict:
    """An activation table as the extract stage writes it; returns the arrays written."""
    rng = np.random.default_rng(seed)
    ids = np.asarray(ids, dtype=np.int64)
    layers = [rng.standard_normal((len(ids), HIDDEN)).astype(np.float32) for _ in range(NUM_LAYERS + 1)]
    if nan_at is not None:
        layer, row = nan_at
        layers[layer][row, 1] = np.nan
    labels = (ids % 2).astype(np.float64 if label_type == pa.float64() else np.int64)
    metadata = {"model": "tiny-bert", "model_digest": digest or DIGESTS.get(run, "dx" * 32), "run": run, "task": task,
                "split": split, "pooling": pooling}
    with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=label_type, metadata=metadata,
                          rows_per_group=rows_per_group) as writer:
        half = len(ids) // 2
        for part in (slice(0, half), slice(half, None)):
            writer.write(ids[part], np.zeros(len(ids[part]), np.int16), labels[part], [a[part] for a in layers])
    return {"example_id": ids, "layers": layers, "labels": labels}


def similarity_params(measure: str, **similarity):
    """Params of the tiny project with one CLS measure, 20 permutations and 10 bootstrap resamples."""
    return parse_params({"model": "tiny-bert", "tasks": [TASK], "seeds": [1, 2], "finetune": {"max_length": 32},
                         "similarity": {"measures": {"cls": [measure]}, "attention_measures": [], "permutations": 20,
                                        "bootstrap": 10, "random_control": None, **similarity}})


def fake_runs(rng) -> dict[str, list[np.ndarray]]:
    """ORIG, and two fine-tuned runs that keep ORIG's first two layers (plus noise) and replace the last."""
    orig = [rng.normal(size=(ROWS, HIDDEN)).astype(np.float32) for _ in range(NUM_LAYERS + 1)]
    runs = {"orig": orig}
    for seed in (1, 2):
        runs[f"seed{seed}"] = [(a + 0.3 * rng.normal(size=a.shape)).astype(np.float32) if k < NUM_LAYERS
                               else rng.normal(size=a.shape).astype(np.float32) for k, a in enumerate(orig)]
    return runs


def write_extracted(root: Path) -> Path:
    """Activation tables of orig, seed1 and seed2 (CLS, :func:`fake_runs`) under ``root/activations`` and the info
    files of the checkpoints they came from under ``root/checkpoints``; returns `root`."""
    base = "d0" * 32
    digests = {"orig": base} | {run: fake_model_folder(finetuned(root / "checkpoints", int(run.removeprefix("seed"))),
                                                       run.encode(), source="finetune", task=TASK, base_digest=base)
                                for run in ("seed1", "seed2")}
    ids = np.arange(ROWS, dtype=np.int64)
    for run, layers in fake_runs(np.random.default_rng(0)).items():
        metadata = {"model": "tiny-bert", "model_digest": digests[run], "run": run, "task": TASK,
                    "split": "validation", "pooling": "cls"}
        with ActivationWriter(root / "activations" / f"{run}.cls.parquet", num_layers=NUM_LAYERS, hidden_size=HIDDEN,
                              label_type=pa.int64(), metadata=metadata) as writer:
            writer.write(ids, np.zeros(ROWS, np.int16), ids % 2, layers)
    return root


def write_attention(path: Path, maps: list[list[np.ndarray]], example_ids, *, run: str, digest: str,
                    task: str = TASK) -> None:
    """An attention table as the extract stage writes it (float32): `maps[k][e]` is layer k + 1's (heads, t, t) map of
    example `example_ids[e]` (choice 0), each query row a distribution over the keys."""
    heads = maps[0][0].shape[0]
    lengths = [m.shape[-1] for m in maps[0]]
    query = np.concatenate([np.divmod(np.arange(t * t), t)[0] for t in lengths]).astype(np.int16)
    key = np.concatenate([np.divmod(np.arange(t * t), t)[1] for t in lengths]).astype(np.int16)
    columns = {"example_id": pa.array(np.repeat(np.asarray(example_ids, np.int64), [t * t for t in lengths])),
               "choice": pa.array(np.zeros(len(query), np.int16)), "query": pa.array(query), "key": pa.array(key)}
    for k, layer in enumerate(maps, start=1):
        weights = np.concatenate([m.transpose(1, 2, 0).reshape(-1, heads) for m in layer]).astype(np.float32)
        columns[layer_column(k)] = pa.FixedSizeListArray.from_arrays(pa.array(weights.ravel()), heads)
    metadata = {"model": "tiny-bert", "model_digest": digest, "run": run, "task": task, "split": "validation",
                "num_layers": len(maps), "num_heads": heads, "kind": "attention", "attention_unit": "words"}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(with_metadata(pa.Table.from_pydict(columns), metadata), path)
