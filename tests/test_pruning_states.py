"""The rows and states of the layer-pruning measures as the extract stage writes them
(layersim.experiments.pruning_states): Block Influence over every non-pad token, special tokens included, and
angular distance on the token the head reads, every layer at its block's output (before any final norm)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from layersim.data.batching import collate, encode_task
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.extract import extract_activations
from layersim.experiments.pruning_states import PruningStates
from layersim.models.layer_stacks import describe_architecture
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.similarity.pruning import measures_from_record, pruning_measures

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


def test_block_influence_over_every_token_by_hand():
    """Two sequences, 3 positions, the second padded after 2 tokens; layers 0 … 2 in the plane. BI_k averages
    1 − cos over the 5 non-pad tokens; the angles read one token per sequence (here the first)."""
    angles = torch.tensor([[[0.0, 0.1, 0.2], [0.3, 0.4, 9.9]],  # layer 0: angle of each token's vector
                           [[0.5, 0.1, 0.2], [0.3, 1.4, 9.9]],  # layer 1
                           [[0.5, 0.1, 1.2], [0.3, 1.4, 9.9]]], dtype=torch.float64)  # layer 2
    radius = torch.tensor([[1.0, 2.0, 3.0], [0.5, 4.0, 1.0]], dtype=torch.float64)
    states = [torch.stack([radius * torch.cos(a), radius * torch.sin(a)], -1) for a in angles]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    pruning = PruningStates(2, "first")
    pruning.update(states, mask, torch.zeros(2, dtype=torch.long))
    record = json.loads(json.dumps(pruning.record()))
    # Layer 1 turns token (0, 0) by 0.5 and token (1, 1) by 1.0; layer 2 turns token (0, 2) by 1.0.
    want = [(2 - np.cos(0.5) - np.cos(1.0)) / 5, (1 - np.cos(1.0)) / 5]
    np.testing.assert_allclose(record["block_influence"]["values"], want, rtol=1e-6)
    assert record["block_influence"]["tokens"] == [5, 5]
    measures = measures_from_record(record)
    np.testing.assert_allclose(measures.block_influence(), want, rtol=1e-6)
    first = pruning_measures([s[:, 0].numpy() for s in states])  # one row per sequence: its first token
    np.testing.assert_allclose(measures.angular, first.angular, rtol=1e-6, atol=1e-7)
    assert measures.angular[0, 2] == pytest.approx(0.5 / 2 / np.pi, rel=1e-6)  # turned 0.5, then back: mean


def _hooked_block_outputs(encoder, batch) -> list[torch.Tensor]:
    """Layer 0 (the embeddings) from transformers, and every layer's own output from a forward hook on it."""
    stack = describe_architecture(encoder)
    outputs: list[torch.Tensor] = []
    handles = [stack.module_for(k).register_forward_hook(
        lambda module, args, out: outputs.append(out[0] if isinstance(out, tuple) else out))
        for k in range(stack.num_layers)]
    try:
        with torch.no_grad():
            out = encoder(**batch, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    return [out.hidden_states[0], *outputs], out.hidden_states


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-bert"])
def test_extract_writes_block_influence_of_block_outputs_over_every_token(name, tiny_model_dir, tmp_path):
    """BI_k of the record equals 1 − mean cos over every non-pad token (special tokens included) of states taken
    by forward hooks on the blocks, layer L too; for a decoder, hidden_states[-1] (after the final norm, here with
    a gain that differs per channel, as a trained one does) gives another BI_L. The angles read the last non-pad
    token (decoders) or the first (encoders)."""
    folder = tiny_model_dir(name)
    spec, tokenizer = get_task("synth-negation"), load_tokenizer(folder)
    encoded = encode_task(generated_table(spec, "validation", 7, seed=2), spec, tokenizer, max_length=64)
    path = tmp_path / "orig.pruning.json"
    encoder = load_encoder(folder).eval()
    norm = describe_architecture(encoder).final_state_module()
    if isinstance(getattr(norm, "weight", None), torch.Tensor):  # a trained norm's gain differs per channel
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.2, 3.0, norm.weight.numel()))
    extract_activations(encoder, tokenizer, spec, encoded, {}, {"run": "orig"}, batch_size=7, device=CPU,
                        pruning_path=path)
    record = json.loads(path.read_text())
    batch = collate(encoded, range(7), tokenizer, with_labels=False)
    hooked, hidden = _hooked_block_outputs(encoder, batch)
    mask = batch["attention_mask"].bool()
    assert (~mask).any() and int(mask.sum()) == record["block_influence"]["tokens"][0]  # padded; every token
    special = torch.isin(batch["input_ids"], torch.tensor(tokenizer.all_special_ids)) & mask
    assert special.any() or name == "tiny-gpt2"  # [CLS]/[SEP], BOS are rows; GPT-2's tokenizer adds none

    def influence(states):
        return [1 - torch.nn.functional.cosine_similarity(a[mask].double(), b[mask].double(), dim=-1).mean().item()
                for a, b in zip(states[:-1], states[1:])]

    np.testing.assert_allclose(record["block_influence"]["values"], influence(hooked), rtol=1e-5)
    normed = influence(hidden)[-1]
    if name == "tiny-bert":
        assert normed == pytest.approx(record["block_influence"]["values"][-1], rel=1e-5)  # no final norm
    else:
        assert abs(normed - record["block_influence"]["values"][-1]) > 1e-3  # the final norm changes BI_L
    positions = (mask.sum(1) - 1 if name != "tiny-bert" else torch.zeros(7, dtype=torch.long))  # right-padded
    rows = [s[torch.arange(7), positions].double().numpy() for s in hooked]
    np.testing.assert_allclose(measures_from_record(record).angular, pruning_measures(rows).angular,
                               rtol=1e-5, atol=1e-6)
    assert record["angular_distance"]["rows"].startswith("the last" if name != "tiny-bert" else "the first")


TINY = ["tiny-bert", "tiny-roberta", "tiny-xlm-roberta", "tiny-albert", "tiny-electra", "tiny-distilbert",
        "tiny-deberta-v2", "tiny-modernbert", "tiny-mpnet", "tiny-xlnet", "tiny-gpt2", "tiny-llama", "tiny-qwen2",
        "tiny-mistral"]


@pytest.mark.parametrize("name", TINY)
def test_every_architecture_gives_its_last_block_output(name, tiny_model_dir, tmp_path):
    """The extract stage runs the hook on every family (ALBERT's shared group, XLNet's sequence-first layers
    included): where no final norm follows the last block, its BI_L is the one hidden_states[-1] gives."""
    folder = tiny_model_dir(name)
    spec, tokenizer = get_task("synth-choice"), load_tokenizer(folder)  # 4 sequences per example
    encoded = encode_task(generated_table(spec, "validation", 3, seed=1), spec, tokenizer, max_length=64)
    encoder = load_encoder(folder).eval()
    path = tmp_path / "orig.pruning.json"
    extract_activations(encoder, tokenizer, spec, encoded, {}, {"run": "orig"}, batch_size=3, device=CPU,
                        pruning_path=path)
    record = json.loads(path.read_text())
    influence = record["block_influence"]["values"]
    assert len(influence) == 3 and all(v is not None and 0 <= v <= 2 for v in influence)
    if describe_architecture(encoder).family.final_norm is None:
        batch = {k: v.reshape(-1, v.shape[-1]) for k, v in collate(encoded, range(3), tokenizer,
                                                                     with_labels=False).items()}
        with torch.no_grad():
            states = encoder(**batch, output_hidden_states=True).hidden_states
        mask = batch["attention_mask"].bool()
        last = 1 - torch.nn.functional.cosine_similarity(states[-2][mask].double(), states[-1][mask].double(),
                                                         dim=-1).mean().item()
        assert influence[-1] == pytest.approx(last, rel=1e-4, abs=1e-7)
