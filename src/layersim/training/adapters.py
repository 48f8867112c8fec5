"""LoRA fine-tuning (finetune.method: lora; Hu et al. 2021) on peft, ending in a plain checkpoint.

The task model's matrices of finetune.lora.target_modules (roles named per architecture by
:mod:`layersim.models.weight_matrices`) get trainable low-rank updates, scaled by alpha / rank; every other weight of
the encoder is frozen, the task head (everything outside the base model: BERT's classifier, a decoder's score)
trains as in full fine-tuning, since a random head cannot be left as it is. When training ends the updates are
merged into the weights (``merge_and_unload``), so the model is the same class as a fully fine-tuned one, saved the
same way, and every later stage reads it unchanged. peft is imported only here, only for a LoRA run.
"""

from __future__ import annotations

from torch import nn

from layersim.errors import LayersimError
from layersim.models.matrix_roles import adapter_roles
from layersim.models.weight_matrices import adapter_targets


def with_adapters(model: nn.Module, settings) -> nn.Module:
    """`model` (a task model) wrapped by peft with LoRA adapters of `settings` (LoraParams): only the adapters and
    the task head train, the head being everything the encoder's layers feed: the classifier and, where the family
    has one (BERT, ALBERT), the pooler, which only the classification head reads (frozen, it held MiniLM-L6 on
    synth-similarity at the trivial predictor for 600 steps; trained, LoRA reached Pearson 0.76 in 200).
    Deterministic given torch's RNG state (the adapters' A matrices are drawn from it)."""
    from peft import LoraConfig, get_peft_model

    pooler = getattr(model.base_model, "pooler", None)
    head = [p for p in model.parameters() if not any(p is q for q in model.base_model.parameters())]
    head += list(pooler.parameters()) if isinstance(pooler, nn.Module) else []
    targets = adapter_targets(model, adapter_roles(settings.target_modules))
    check_rank(model, targets, settings.rank)
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                        target_modules=targets)
    adapted = get_peft_model(model, config)  # freezes every weight but the adapters'
    for param in head:
        param.requires_grad_(True)
    return adapted


def check_rank(model: nn.Module, targets: list[str], rank: int) -> None:
    """finetune.lora.rank within the narrowest adapted matrix (params.yaml checks the hidden size of the models it
    knows; a key or value matrix of grouped-query attention, or a local model's, can be narrower): a wider update
    has no more rank, only more parameters."""
    modules = dict(model.named_modules())
    widths = {name: min(modules[name].weight.shape) for name in targets if hasattr(modules[name], "weight")}
    if widths and rank > min(widths.values()):
        name = min(widths, key=widths.get)
        raise LayersimError(f"finetune.lora.rank = {rank} is larger than the narrowest adapted matrix ({name}, "
                            f"{widths[name]} wide): an update B·A of it has rank at most {widths[name]}; use a rank "
                            f"from 1 to {widths[name]}.")


def is_adapted(model: nn.Module) -> bool:
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def merged(model: nn.Module) -> nn.Module:
    """The plain task model with the adapters' updates added to its weights (W + alpha / rank · B·A), every weight
    trainable again as in a freshly loaded model."""
    plain = model.merge_and_unload()
    for param in plain.parameters():
        param.requires_grad_(True)
    return plain
