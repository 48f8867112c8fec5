"""The roles of a transformer layer's weight matrices, by name: what params.yaml may list (finetune.lora's
target_modules) and what the weight analysis reports per layer. A module of its own, importing nothing, so that
the params gate reads the names without torch or the architecture tables (layersim.models.weight_matrices)."""

MATRIX_TYPES = ("query", "key", "value", "attention_output", "intermediate", "output")
# What LoRA adapts when finetune.lora.target_modules is auto: Hu et al. (2021) adapt W_q and W_v (their §4.2, §7.1).
ADAPTER_ROLES_AUTO = ("query", "value")


def adapter_roles(target_modules) -> tuple[str, ...]:
    """The matrix roles finetune.lora.target_modules names ("auto": query and value, as Hu et al.)."""
    return ADAPTER_ROLES_AUTO if target_modules == "auto" else tuple(target_modules)
