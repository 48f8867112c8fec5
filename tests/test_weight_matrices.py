"""Each architecture's weight matrices by role (layersim.models.weight_matrices): every role of every layer found,
fused matrices split into the maps they compute, and the per-layer weight changes of a known edit
(layersim.experiments.weights)."""

import copy

import pytest
import torch

from layersim.models.tiny_configs import ARCHITECTURES, HIDDEN, LAYERS, tiny_config
from layersim.experiments.weights import weight_changes
from layersim.models.weight_matrices import MATRIX_TYPES, adapter_targets, layer_matrices


def _tiny(architecture):
    from transformers import AutoModel

    torch.manual_seed(0)
    return AutoModel.from_config(tiny_config(architecture, 1000, 0))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_role_of_every_layer_is_found_with_its_map_shape(architecture):
    matrices = layer_matrices(_tiny(architecture))
    layers = 1 if architecture == "albert" else LAYERS  # ALBERT's one shared group
    assert sorted(matrices) == sorted((i, role) for i in range(layers) for role in MATRIX_TYPES)
    for (_, role), matrix in matrices.items():
        out, inner = matrix.shape
        if role == "intermediate":
            assert (out, inner) == (2 * HIDDEN, HIDDEN)
        elif role == "output":
            assert (out, inner) == (HIDDEN, 2 * HIDDEN)
        else:  # the tiny decoders have one KV head of half the width: grouped-query attention
            assert inner == HIDDEN and out in (HIDDEN, HIDDEN // 2)


def test_fused_query_key_value_are_split_into_the_maps_they_compute():
    """GPT-2's c_attn (Conv1D, (in, out)) and ModernBERT's Wqkv: each role's matrix times x equals its block of
    the fused module's output."""
    x = torch.randn(HIDDEN)
    for architecture, path in (("gpt2", "h.0.attn.c_attn"), ("modernbert", "layers.0.attn.Wqkv")):
        model = _tiny(architecture)
        module = model.get_submodule(path)
        fused = module(x[None])[0] - (module.bias if module.bias is not None else 0)
        matrices = layer_matrices(model, ("query", "key", "value"))
        computed = torch.cat([matrices[(0, role)] @ x for role in ("query", "key", "value")])
        torch.testing.assert_close(computed, fused.detach())


def test_a_scaled_model_has_no_intruders_and_an_edited_matrix_shows_where():
    model = _tiny("bert")
    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.encoder.layer[1].attention.self.value.weight.add_(
            10 * torch.outer(torch.randn(HIDDEN), torch.randn(HIDDEN)))
    changes = weight_changes(model, edited, k=10, threshold=0.5)
    ranks = {key: change.update_rank for key, change in changes.items()}
    assert ranks.pop((1, "value")) == 1 and set(ranks.values()) == {0}
    assert changes[(1, "value")].intruders >= 1


def test_adapter_targets_name_the_query_and_value_modules_from_the_model_root():
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_config(tiny_config("distilbert", 1000, 0))
    targets = adapter_targets(model, ("query", "value"))
    assert targets[:2] == ["distilbert.transformer.layer.0.attention.q_lin",
                           "distilbert.transformer.layer.0.attention.v_lin"]
    assert len(targets) == 2 * LAYERS and all(isinstance(model.get_submodule(t), torch.nn.Linear) for t in targets)
