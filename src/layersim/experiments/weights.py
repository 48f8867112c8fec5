"""The weights stage's computation: what fine-tuning did to each layer's weight matrices, in weight space
(Shuttleworth et al.'s intruder dimensions, the spectrum, the update's norm and rank; layersim.similarity.weight_space),
per layer and matrix role (layersim.models.weight_matrices)."""

from __future__ import annotations

from layersim.errors import LayersimError
from layersim.models.weight_matrices import MATRIX_TYPES, layer_matrices
from layersim.similarity.weight_space import MatrixChange, matrix_change


def weight_changes(pretrained, finetuned, k: int, threshold: float,
                   roles: tuple[str, ...] = MATRIX_TYPES) -> dict[tuple[int, str], MatrixChange]:
    """What fine-tuning did to each layer's matrices of `roles` of two models of one architecture (base or task
    models): (layer index, role) → its :class:`MatrixChange`. The update's rank is read against the fine-tuned
    weights' stored dtype (bf16 weights have a coarser rounding floor than fp32 ones)."""
    import torch

    before, after = layer_matrices(pretrained, roles), layer_matrices(finetuned, roles)
    if before.keys() != after.keys() or any(before[key].shape != after[key].shape for key in before):
        raise LayersimError("the fine-tuned model's layers do not match the pretrained model's (another depth or "
                            "width); compare a checkpoint only with the model it was fine-tuned from.")
    return {key: matrix_change(before[key].float().cpu().numpy(), after[key].float().cpu().numpy(), k, threshold,
                               eps=torch.finfo(after[key].dtype).eps) for key in before}
