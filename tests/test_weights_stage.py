"""The weights stage's rows, headline and figure (layersim.experiments.weights.task_weights) on a hand-built case:
two tiny BERTs, one of them with a rank-1 update of layer 2's intermediate matrix along a direction orthogonal to
every pretrained left singular vector, which must give exactly one intruder there and none anywhere else."""

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from layersim.data.layout import finetuned
from layersim.experiments.weights import task_weights
from layersim.models.tiny_configs import LAYERS, tiny_config
from layersim.models.weight_matrices import MATRIX_TYPES, layer_matrices
from layersim.reporting.weight_plots import intruder_grids


def _tiny():
    from transformers import AutoModel

    torch.manual_seed(0)
    return AutoModel.from_config(tiny_config("bert", 1000, 0))


def _planted(model):
    """`model` with W = W0 + s u v^T in layer index 1's intermediate (64 × 32): u orthogonal to W0's 32 left singular
    vectors, v W0's last right singular vector, s three times W0's top singular value. Then W^T W = W0^T W0 + s² v v^T:
    W keeps W0's other singular pairs exactly and gains one top vector whose best |cos| is σ_min / √(σ_min² + s²) < 1/3."""
    edited = copy.deepcopy(model)
    w0 = layer_matrices(model, ("intermediate",))[(1, "intermediate")].double().numpy()
    left, spectrum, right_t = np.linalg.svd(w0, full_matrices=True)
    u, v, strength = left[:, -1], right_t[-1], 3 * spectrum[0]
    with torch.no_grad():
        edited.encoder.layer[1].intermediate.dense.weight.add_(torch.from_numpy(strength * np.outer(u, v)).float())
    return edited, strength / np.linalg.norm(w0)


def _run(monkeypatch, models, method="full", target_modules="auto"):
    """task_weights with load_encoder replaced by a lookup of the folders it must read (layersim.data.layout)."""
    import layersim.models.registry as registry

    monkeypatch.setattr(registry, "load_encoder", lambda folder: models[Path(folder)])
    finetune = SimpleNamespace(method=method, lora=SimpleNamespace(target_modules=target_modules))
    return task_weights(Path("pre"), Path("ckpt"), [3, 5], finetune, 10, 0.5, lambda *a: None)


@pytest.fixture(scope="module")
def planted():
    model = _tiny()
    edited, relative = _planted(model)
    return {Path("pre"): model, finetuned("ckpt", 3): edited, finetuned("ckpt", 5): copy.deepcopy(model)}, relative


def test_one_planted_intruder_in_the_rows_the_headline_and_the_grid(monkeypatch, planted):
    models, relative = planted
    rows, headline, figure = _run(monkeypatch, models)
    assert len(rows) == 2 * LAYERS * len(MATRIX_TYPES)
    assert {(row["seed"], row["run"]) for row in rows} == {(3, "FT[1]"), (5, "FT[2]")}
    assert {row["layer"] for row in rows} == set(range(1, LAYERS + 1))  # transformer layers, from 1
    assert all(row["series"] == f"{row['run']} {row['matrix']}" for row in rows)
    hit = [row for row in rows if row["intruders"]]
    assert [(r["seed"], r["layer"], r["matrix"], r["intruders"], r["update_rank"]) for r in hit] == \
        [(3, 2, "intermediate", 1, 1)]
    assert hit[0]["relative_update_norm"] == pytest.approx(relative, rel=1e-5)
    assert all(row["update_rank"] == 0 and row["relative_update_norm"] == 0 for row in rows if row is not hit[0])
    assert headline == {"method": "full", "intruders_per_adapted_matrix": round(1 / 36, 6),
                        "max_relative_update_norm": hit[0]["relative_update_norm"], "max_update_rank_adapted": 1}
    grids = intruder_grids(rows, MATRIX_TYPES)
    assert list(grids) == ["FT[1]", "FT[2]"] and grids["FT[1]"].shape == (LAYERS, len(MATRIX_TYPES))
    assert grids["FT[1]"].sum() == grids["FT[1]"][1, MATRIX_TYPES.index("intermediate")] == 1
    assert grids["FT[2]"].sum() == 0
    assert len([ax for ax in figure.axes if ax.get_title()]) == 2  # one panel per seed (and the colour bar)


def test_lora_counts_the_matrices_it_adapted_apart(monkeypatch, planted):
    """Under LoRA on query and value (auto) the planted intermediate change is a frozen matrix's."""
    rows, headline, _ = _run(monkeypatch, planted[0], method="lora")
    assert {row["matrix"] for row in rows if row["adapted"]} == {"query", "value"}
    assert headline["method"] == "lora" and headline["intruders_per_adapted_matrix"] == 0.0
    assert headline["max_update_rank_adapted"] == 0
    assert headline["intruders_per_frozen_matrix"] == round(1 / 24, 6)
