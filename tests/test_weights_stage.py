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


def _run(monkeypatch, models, method="full", target_modules="auto", runs=(3, 5), null_draws=0):
    """task_weights with load_encoder replaced by a lookup of the folders it must read (layersim.data.layout)."""
    import layersim.models.registry as registry

    monkeypatch.setattr(registry, "load_encoder", lambda folder: models[Path(folder)])
    finetune = SimpleNamespace(method=method, lora=SimpleNamespace(target_modules=target_modules))
    out = task_weights(Path("pre"), Path("ckpt"), list(runs), finetune, 10, 0.5, lambda *a: None,
                       null_draws=null_draws)
    return out.rows, out.headline, out.figure


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


def _spread_intruder(model, layer, role):
    """`model` with W = W0 + s u v^T in `role` of layer index `layer`, u and v spread evenly over W0's singular
    vectors (|cos| = 1/√d with each) and s ten times W0's top singular value: the new top vector is nearly u, an
    intruder, whatever the matrix's shape."""
    edited = copy.deepcopy(model)
    matrix = layer_matrices(edited, (role,))[(layer, role)]
    w0 = matrix.double().numpy()
    left, spectrum, right_t = np.linalg.svd(w0, full_matrices=False)
    u, v = left.sum(axis=1) / np.sqrt(left.shape[1]), right_t.sum(axis=0) / np.sqrt(right_t.shape[0])
    with torch.no_grad():
        matrix.add_(torch.from_numpy(10 * spectrum[0] * np.outer(u, v)).float())
    return edited


def test_every_adapted_count_has_its_null_and_the_totals_add_the_draws(monkeypatch, planted):
    rows, headline, _ = _run(monkeypatch, planted[0], null_draws=19)
    again = _run(monkeypatch, planted[0], null_draws=19)[0]
    assert rows == again  # the draws' streams are fixed by the run and the matrix
    hit = next(row for row in rows if row["intruders"])
    assert 0 <= hit["intruders_null_mean"] <= 10 and 1 / 20 <= hit["intruders_p_value"] <= 1
    unchanged = [row for row in rows if row is not hit]
    assert all(row["intruders_null_mean"] == 0 and row["intruders_p_value"] == 1 for row in unchanged)
    # Every other matrix's null is 0: the total's null is the planted matrix's, so are its mean and p.
    assert headline["intruders_per_adapted_matrix_null"] == pytest.approx(hit["intruders_null_mean"] / 36, abs=1e-6)
    assert headline["intruders_p_value"] == hit["intruders_p_value"]
    assert list(headline["by_role"]) == list(MATRIX_TYPES)
    intermediate = headline["by_role"]["intermediate"]
    assert intermediate["matrices"] == 2 * LAYERS and intermediate["intruders_per_matrix"] == round(1 / 6, 6)
    assert intermediate["p_value"] == hit["intruders_p_value"]
    assert all(found["p_value"] == 1 and found["null_per_matrix"] == 0
               for role, found in headline["by_role"].items() if role != "intermediate")


def test_methods_are_compared_on_the_roles_both_adapted(monkeypatch, planted):
    """Full fine-tuning (seed 3: the planted intermediate intruder) beside LoRA (seed 3: one in layer 1's query):
    per adapted matrix the two average over different roles (6 and 2); on the roles both adapted they do not."""
    from layersim.data.layout import FinetunedRun

    models = dict(planted[0])
    lora = FinetunedRun("lora", 3, primary=False)
    models[lora.folder("ckpt")] = _spread_intruder(models[Path("pre")], 0, "query")
    rows, headline, _ = _run(monkeypatch, models, runs=(FinetunedRun("full", 3), lora), null_draws=9)
    assert headline["shared_roles"] == ["query", "value"]
    assert headline["intruders_per_adapted_matrix"] == round(1 / (6 * LAYERS), 6)
    assert headline["intruders_per_shared_role_matrix"] == 0.0 and headline["intruders_shared_roles_p_value"] == 1
    compared = headline["compared"]["lora"]
    assert compared["intruders_per_adapted_matrix"] == compared["intruders_per_shared_role_matrix"] == \
        round(1 / (2 * LAYERS), 6)
    assert list(compared["by_role"]) == ["query", "value"]
    assert 0 < compared["intruders_shared_roles_p_value"] <= 1
    # LoRA's frozen matrices did not train: no null is drawn for them.
    assert all("intruders_p_value" not in row for row in rows if row.get("method") == "lora" and not row["adapted"])


def test_the_changes_are_the_same_on_one_thread_or_several_and_with_the_pretrained_svds_shared(planted):
    """weight_changes computes the matrices on torch's threads, each from its own stream, and takes the pretrained
    model's SVDs once when given them (pretrained_matrices): neither changes a number."""
    from layersim.experiments.weights import pretrained_matrices, weight_changes

    models = planted[0]
    base, tuned = models[Path("pre")], models[finetuned("ckpt", 3)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = weight_changes(base, tuned, 10, 0.5, null_draws=9, seed=4)
        torch.set_num_threads(3)
        several = weight_changes(pretrained_matrices(base), tuned, 10, 0.5, null_draws=9, seed=4)
    finally:
        torch.set_num_threads(before)
    assert one == several
    assert sum(change.intruders for change in one.values()) == 1
    assert any(change.null_intruders for change in one.values())
