"""Where each architecture keeps its transformer layers: the one table of the library that knows it.

Every family runs its layers as a loop over one ``nn.ModuleList`` (read from transformers 5's modeling code):

| family | list (from the base model) | also on the owner / base model | after the last layer |
|---|---|---|---|
| bert, roberta, xlm-roberta, electra | ``encoder.layer`` | | |
| albert | ``encoder.albert_layer_groups`` (groups shared across depth) | | |
| distilbert | ``transformer.layer`` | | |
| deberta-v2 (v2, v3) | ``encoder.layer`` | ``rel_embeddings`` (+ ``LayerNorm``) read by every layer; ``conv`` added to layer 0's output | |
| mpnet | ``encoder.layer`` | ``relative_attention_bias`` read by every layer | |
| modernbert | ``layers`` (each keeps its ``attention_type`` from ``config.layer_types``) | rotary embeddings per type | ``final_norm`` |
| xlnet | ``layer`` (``mems`` are a list with one entry per layer run) | | |
| gpt2 | ``h`` | | ``ln_f`` |
| llama, qwen2, mistral | ``layers`` | rotary embeddings; masks per ``config.layer_types`` | ``norm`` |

A model of another family is accepted when its base model holds exactly one ``nn.ModuleList`` (not inside
another) whose length is the config's depth (``num_hidden_layers``, ``n_layer``, ``n_layers``).

Depth-dependent state is kept consistent while a context runs a selection of layers: the base model (and the
owner of the list) see a private copy of the config whose ``num_hidden_layers`` is the number of layers run
and whose ``layer_types`` lists the kept layers' own types; the kept layers' ``layer_idx`` (which the KV cache
is indexed by) are renumbered 0..n-1. So a KV cache built inside a context has one slot per layer run, the
sliding-window layers where they are, and mask lookups by position find each kept layer's own mask: a context
is exactly the smaller model of :func:`layersim.models.encoders.smaller_copy`, caching included.

Decoders (gpt2, llama, qwen2, mistral) and ModernBERT apply a final norm after the last layer, and
transformers' ``hidden_states[-1]`` is that normed state (``last_hidden_state``); the other states are
not normed. Inside ``exit_at(k)`` the final norm is applied to layer k's output, as in the full model.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from layersim.errors import LayersimError, as_int


@dataclass(frozen=True)
class Family:
    """Where one architecture keeps its layers and what belongs to them (paths are from the base model)."""

    owner: str                       # the module that holds the layer list and loops over it ("" = base model)
    attribute: str                   # the nn.ModuleList attribute of the owner
    embeddings: tuple[str, ...] = ("embeddings",)  # what turns tokens into the first layer's input (absent ones skipped)
    shared_tables: tuple[str, ...] = ()  # position tables every layer reads (frozen with the embeddings)
    final_norm: str | None = None    # applied by the base model after the last layer
    head_token: str = "first"        # the token the classification head reads: "first" or "last" (non-pad)
    after_first: str | None = None   # an owner module applied to layer 0's output only (DeBERTa-v2 conv)
    first_layer_differs: bool = False  # layer 0 is built differently (ModernBERT: no attention norm)
    runs_empty: bool = True          # the owner's loop works with no layer (DeBERTa-v2's does not)
    sequence_first: bool = False     # layers take (length, batch, hidden) states (XLNet); outputs are batch-first


_BERT_LIKE = Family("encoder", "layer")
_LLAMA_LIKE = Family("", "layers", embeddings=("embed_tokens",), final_norm="norm", head_token="last")
FAMILIES: dict[str, Family] = {
    "albert": Family("encoder", "albert_layer_groups", embeddings=("embeddings", "encoder.embedding_hidden_mapping_in")),
    "bert": _BERT_LIKE,
    "roberta": _BERT_LIKE,
    "xlm-roberta": _BERT_LIKE,
    "electra": Family("encoder", "layer", embeddings=("embeddings", "embeddings_project")),
    "distilbert": Family("transformer", "layer"),
    "deberta-v2": Family("encoder", "layer", shared_tables=("encoder.rel_embeddings", "encoder.LayerNorm"),
                         after_first="conv", runs_empty=False),
    "mpnet": Family("encoder", "layer", shared_tables=("encoder.relative_attention_bias",)),
    "modernbert": Family("", "layers", final_norm="final_norm", first_layer_differs=True),
    "xlnet": Family("", "layer", embeddings=("word_embedding",), head_token="last", sequence_first=True),
    "gpt2": Family("", "h", embeddings=("wte", "wpe"), final_norm="ln_f", head_token="last"),
    "llama": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
}
SUPPORTED_ARCHITECTURES = tuple(sorted(FAMILIES))
# Config fields with one entry per layer: a selection keeps the kept layers' entries.
PER_LAYER_FIELDS = ("layer_types",)
_DEPTH_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_NORM_NAMES = ("norm", "final_norm", "ln_f", "final_layer_norm")  # a generic family's final norm, if any
GENERIC = "generic"

# While a context is active, the base model's __dict__ keeps the original LayerStack under this name (plain
# attribute, not registered by torch): describe_architecture and num_layers report the full stack inside a
# context, and contexts cannot nest.
SAVED = "_layersim_original_stack"


@dataclass(frozen=True)
class LayerStack:
    """Where one model keeps its transformer layers (always the full, original stack, also while a context
    has swapped it). ``modules`` is the original list, ``config`` the base model's original config and
    ``num_layers`` the depth L in the paper's sense (for ALBERT: applications of a shared group)."""

    architecture: str  # the config's model_type ("generic" rules: see how= below)
    family: Family
    base_model: nn.Module
    owner: nn.Module
    modules: nn.ModuleList
    config: object
    num_layers: int
    how: str = "table"  # "table" or "generic" (found by the single-list rule)

    @property
    def encoder(self) -> nn.Module:
        """The owner of the layer list (the name predates the decoders, whose owner is the base model)."""
        return self.owner

    @property
    def attribute(self) -> str:
        return self.family.attribute

    @property
    def shared(self) -> bool:
        """True when layers share weights (ALBERT): the stack is groups applied repeatedly."""
        return self.architecture == "albert"

    def module_for(self, index: int) -> nn.Module:
        """The module that computes 0-based layer `index` of the full model."""
        if self.shared:
            # The same formula as AlbertTransformer.forward, so that layer i runs the group it always runs.
            return self.modules[int(index / (self.num_layers / self.config.num_hidden_groups))]
        return self.modules[index]

    def find(self, path: str) -> nn.Module | None:
        """The submodule of the base model at `path` ("" = the base model), or None if it has none."""
        module = self.base_model
        for part in filter(None, path.split(".")):
            module = getattr(module, part, None)
        return module if isinstance(module, nn.Module) else None

    def embedding_modules(self) -> list[nn.Module]:
        """What turns tokens into the first layer's input (a generic family: the input embeddings)."""
        if self.how == GENERIC:
            return [self.base_model.get_input_embeddings()]
        return [m for m in map(self.find, self.family.embeddings) if m is not None]

    def shared_tables(self) -> list[nn.Module]:
        return [m for m in map(self.find, self.family.shared_tables) if m is not None]

    def final_state_module(self) -> nn.Module:
        """The module whose output is the state the head reads: the final norm, or else the owner."""
        norm = self.find(self.family.final_norm) if self.family.final_norm else None
        return norm if norm is not None else self.owner


def config_depth(config) -> int | None:
    """The number of layers a config declares, under whichever name its family uses."""
    for key in _DEPTH_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def describe_architecture(model: nn.Module) -> LayerStack:
    """The layer stack of a base or task model: from the table by ``config.model_type``, or found by the
    single-list rule for other models. Raises LayersimError (one sentence) for anything else."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    # `base_model` is the transformers property that finds the base model under any task head.
    base = getattr(model, "base_model", model)
    if SAVED in base.__dict__:  # inside a context: the original stack
        return base.__dict__[SAVED]
    if config is None:
        raise LayersimError(f"cannot run layers of a {type(model).__name__}, which is not a transformers model; "
                            f"supported architectures are: {', '.join(SUPPORTED_ARCHITECTURES)}, or a model with "
                            "exactly one layer list as long as its config's num_hidden_layers.")
    family, how = FAMILIES.get(model_type), "table"
    if family is None:
        family, how = _generic_family(base, config, model_type), GENERIC
    owner = base if not family.owner else getattr(base, family.owner)
    modules = owner._modules[family.attribute]
    # ALBERT's depth is how often the groups are applied, not how many modules there are.
    num = int(config.num_hidden_layers) if model_type == "albert" else len(modules)
    return LayerStack(model_type, family, base, owner, modules, base.config, num, how)


def _generic_family(base: nn.Module, config, model_type) -> Family:
    """The family of a model not in the table: its one top-level nn.ModuleList as long as its depth."""
    depth = config_depth(config)
    lists = [name for name, module in base.named_modules() if isinstance(module, nn.ModuleList)
             and depth is not None and len(module) == depth]
    lists = sorted(n for n in lists if not any(n.startswith(f"{other}.") for other in lists))  # not nested
    if len(lists) != 1:
        found = (f"{len(lists)} layer lists of length {depth} ({', '.join(lists)})" if lists else
                 f"no layer list of length {depth}" if depth is not None else "no num_hidden_layers in its config")
        raise LayersimError(f"cannot run layers of architecture {model_type!r}: its base model has {found}; supported "
                            f"architectures are: {', '.join(SUPPORTED_ARCHITECTURES)}, or a model with exactly one "
                            "layer list as long as its config's num_hidden_layers.")
    owner, _, attribute = lists[0].rpartition(".")
    holder = base if not owner else base.get_submodule(owner)
    norm = next((n for n in _NORM_NAMES if isinstance(getattr(holder, n, None), nn.Module)), None)
    return Family(owner, attribute, embeddings=(), final_norm=f"{owner}.{norm}".lstrip(".") if norm else None,
                  head_token="unknown")


def num_layers(model: nn.Module) -> int:
    """The number L of transformer layers of a base or task model."""
    return describe_architecture(model).num_layers




def check_layers(layers, num: int) -> list[int]:
    """`layers` as a list of strictly increasing 0-based layer indices below `num`, or a one-sentence error."""
    valid = f"strictly increasing 0-based layer indices in 0..{num - 1}"
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise LayersimError(f"layer list {layers!r} is not a sequence; valid values are {valid}.")
    indices = [as_int(i, "layer index", valid) for i in layers]
    for pos, index in enumerate(indices):
        if not 0 <= index < num:
            raise LayersimError(f"layer index {index} is out of range for this {num}-layer model; "
                                f"valid values are {valid}.")
        # Increasing and distinct: that is all truncation and skipping need, and it keeps every run
        # a sub-sequence of the real model (no layer applied twice, none out of order).
        if pos and index <= indices[pos - 1]:
            raise LayersimError(f"layer list {indices} is not strictly increasing at {index}; "
                                f"valid values are {valid}.")
    return indices


def depth_view(stack: LayerStack, config, indices: list[int]) -> None:
    """Make `config` (a copy, or a smaller copy's own) describe the model that runs `indices`: its depth and
    each per-layer field restricted to the kept layers, read from the original `stack`."""
    config.num_hidden_layers = len(indices)
    for field in PER_LAYER_FIELDS:
        values = getattr(stack.config, field, None)
        if isinstance(values, (list, tuple)) and len(values) == stack.num_layers:
            setattr(config, field, [values[i] for i in indices])


def layer_indices(modules: list[nn.Module]) -> list[tuple[nn.Module, int]]:
    """Every (submodule, layer_idx) in `modules`: the index a KV cache slot is looked up by."""
    return [(m, m.layer_idx) for module in modules for m in module.modules()
            if isinstance(getattr(m, "layer_idx", None), int)]


def renumber(modules: list[nn.Module]) -> None:
    """Set the layer_idx of each module's attention (and any submodule that has one) to its position."""
    for position, module in enumerate(modules):
        for m in module.modules():
            if isinstance(getattr(m, "layer_idx", None), int):
                m.layer_idx = position
