"""The weight matrices of each transformer layer by role (query, key, value, attention output, intermediate, output):
the one table of the library that knows each architecture's names for them (read from transformers 5's modeling
code; the layers themselves come from :mod:`layersim.models.layer_stacks`; the roles' names from
:mod:`layersim.models.matrix_roles`).

Every matrix is returned as torch's Linear stores it, (out, in). Fused matrices are split: ModernBERT's ``Wqkv``
and GPT-2's ``c_attn`` hold query, key and value stacked along the output; ModernBERT's ``Wi`` and the gated
decoders keep the GLU's input projection as ``intermediate`` (Llama's ``up_proj``; ModernBERT's first half of
``Wi``) and leave the gate out. GPT-2's Conv1D stores (in, out) and is transposed; XLNet keeps its attention as
(hidden, heads, head width) tensors, reshaped to the maps they compute. ALBERT's single shared group is one
"layer" (index 0), since every depth runs the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

from layersim.errors import LayersimError
from layersim.models.matrix_roles import MATRIX_TYPES

if TYPE_CHECKING:
    import torch
    from torch import nn



@dataclass(frozen=True)
class Place:
    """Where one role's matrix lives inside a layer module."""

    path: str                 # the parameter's module path inside the layer (XLNet: the parameter's own path)
    part: int = 0             # which block of a fused matrix, along its output
    parts: int = 1
    layout: str = "linear"    # linear: (out, in); conv1d: (in, out); heads_in / heads_out: XLNet's (h, n, d)

    @property
    def adaptable(self) -> bool:
        """Whether an adapter (peft's LoRA) can wrap the module: XLNet's bare parameters are not modules."""
        return self.layout in ("linear", "conv1d")


def _roles(*paths: str, **special: Place) -> dict[str, Place]:
    return {role: special.get(role, Place(path)) for role, path in zip(MATRIX_TYPES, paths)}


_BERT = _roles("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
               "intermediate.dense", "output.dense")
_LLAMA = _roles("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj",
                "mlp.down_proj")
_GPT2_QKV = {role: Place("attn.c_attn", i, 3, "conv1d") for i, role in enumerate(MATRIX_TYPES[:3])}
_MODERNBERT_QKV = {role: Place("attn.Wqkv", i, 3) for i, role in enumerate(MATRIX_TYPES[:3])}
PLACES: dict[str, dict[str, Place]] = {
    "bert": _BERT, "roberta": _BERT, "xlm-roberta": _BERT, "electra": _BERT,
    "albert": _roles(*(f"albert_layers.0.{p}" for p in ("attention.query", "attention.key", "attention.value",
                                                        "attention.dense", "ffn", "ffn_output"))),
    "distilbert": _roles("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "ffn.lin1",
                         "ffn.lin2"),
    "deberta-v2": _roles("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
                         "attention.output.dense", "intermediate.dense", "output.dense"),
    "mpnet": _roles("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                    "intermediate.dense", "output.dense"),
    "modernbert": {**_MODERNBERT_QKV, "attention_output": Place("attn.Wo"), "intermediate": Place("mlp.Wi", 0, 2),
                   "output": Place("mlp.Wo")},
    "xlnet": {**{role: Place(f"rel_attn.{role[0]}", layout="heads_in") for role in MATRIX_TYPES[:3]},
              "attention_output": Place("rel_attn.o", layout="heads_out"), "intermediate": Place("ff.layer_1"),
              "output": Place("ff.layer_2")},
    "gpt2": {**_GPT2_QKV, "attention_output": Place("attn.c_proj", layout="conv1d"),
             "intermediate": Place("mlp.c_fc", layout="conv1d"), "output": Place("mlp.c_proj", layout="conv1d")},
    "llama": _LLAMA, "qwen2": _LLAMA, "mistral": _LLAMA,
}


def places(model: nn.Module) -> dict[str, Place]:
    """The role → Place table of `model`'s architecture, or a one-sentence error for one not in it."""
    from layersim.models.layer_stacks import describe_architecture

    architecture = describe_architecture(model).architecture
    if architecture not in PLACES:
        raise LayersimError(f"layersim does not know the weight matrices of architecture {architecture!r}; the weight "
                            f"analysis and adapters support: {', '.join(sorted(PLACES))}.")
    return PLACES[architecture]


def _matrix(layer: nn.Module, place: Place) -> torch.Tensor:
    """The (out, in) matrix at `place` in `layer`, detached, in its stored dtype."""
    if place.layout in ("heads_in", "heads_out"):
        tensor = layer.get_parameter(place.path).detach()
        flat = tensor.reshape(tensor.shape[0], -1)  # (hidden, heads · head width)
        # XLNet computes q = einsum("ibh,hnd->ibnd", h, W): a map hidden → heads·width, so (out, in) is flat.T;
        # the output projection einsum("ibnd,hnd->ibh") maps heads·width → hidden: flat is already (out, in).
        return flat.T if place.layout == "heads_in" else flat
    weight = layer.get_submodule(place.path).weight.detach()
    weight = weight.T if place.layout == "conv1d" else weight
    rows = weight.shape[0] // place.parts
    return weight[place.part * rows:(place.part + 1) * rows]


def layer_matrices(model: nn.Module, roles: tuple[str, ...] = MATRIX_TYPES) -> dict[tuple[int, str], torch.Tensor]:
    """Every layer's matrices of `roles`: (layer index, role) → its (out, in) weight (layer_stacks's layer order;
    ALBERT: its shared groups)."""
    from layersim.models.layer_stacks import describe_architecture

    table, stack = places(model), describe_architecture(model)
    return {(index, role): _matrix(layer, table[role]) for index, layer in enumerate(stack.modules) for role in roles}


def adapter_targets(model: nn.Module, roles: tuple[str, ...]) -> list[str]:
    """The full module names (from `model`'s root) of every layer's modules of `roles`, as peft's target_modules
    take them. A fused module (GPT-2's c_attn, ModernBERT's Wqkv) is named once and adapts its roles together."""
    from layersim.models.layer_stacks import describe_architecture

    table, stack = places(model), describe_architecture(model)
    fixed = [role for role in roles if not table[role].adaptable]
    if fixed:
        raise LayersimError(f"cannot adapt the {', '.join(fixed)} weights of a {stack.architecture} model: they are "
                            "bare parameters, not modules an adapter can wrap; use finetune.method: full.")
    names = {id(module): name for name, module in model.named_modules()}
    paths = dict.fromkeys(f"{names[id(layer)]}.{table[role].path}" for layer in stack.modules for role in roles)
    return list(paths)

