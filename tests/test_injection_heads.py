"""Layer injection (Ren et al. §4.5) for every registered family: the target's head fed the last-layer state of the
token it reads, as extract pools it (CLS for encoders, the last non-pad token for decoders and XLNet), gives the
model's own logits — through a copy of the head where it can be copied (BERT family, the decoders' score, XLNet's
summary) or run inside the model with the state replaced (DeBERTa-v2, DistilBERT, MPNet, XLM-R, ModernBERT) —
and other states give other logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from layersim.data.batching import encode_task
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.extract import pooled_layers
from layersim.experiments.injection import injected_logits
from layersim.models.registry import ARCHITECTURES, load_tokenizer, tiny_config
from layersim.models.task_heads import injection_head
from layersim.params.model_kind import LAST_TOKEN_HEADS
from layersim.training.evaluate import predict

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_injecting_the_pooled_head_token_state_gives_the_models_logits(tiny_model_dir, name):
    tokenizer = load_tokenizer(tiny_model_dir(f"tiny-{name}"))  # its own padding side: XLNet pads on the left
    spec = get_task("synth-negation")
    encoded = encode_task(generated_table(spec, "validation", 14, seed=4), spec, tokenizer, 32)
    torch.manual_seed(0)
    config = tiny_config(name, len(tokenizer), tokenizer.pad_token_id)
    config.num_labels = spec.num_labels
    config.initializer_range = 0.3  # logits that differ between examples well above float error
    model = AutoModelForSequenceClassification.from_config(config).eval()
    pooling = "last" if name in LAST_TOKEN_HEADS else "cls"
    states = pooled_layers(model.base_model, tokenizer, encoded, [pooling], 5, CPU).layers[pooling][-1]
    plain = predict(model, encoded, tokenizer, 5, CPU)
    injected = injected_logits(model, states, 1, 5, CPU, encoded, tokenizer)
    np.testing.assert_allclose(injected, plain, atol=2e-5, rtol=0)
    assert np.ptp(plain, axis=0).max() > 1e-2
    # The logits follow the injected vectors, not the example the model ran: reversed states, reversed logits.
    reversed_ = injected_logits(model, states[::-1].copy(), 1, 5, CPU, encoded, tokenizer)
    np.testing.assert_allclose(reversed_, plain[::-1], atol=2e-5, rtol=0)
    # Copied where a copy is exact: the four BERT-family heads, the decoders' score and XLNet's summary.
    copied = name in ("albert", "bert", "electra", "roberta", "gpt2", "llama", "mistral", "qwen2", "xlnet")
    assert (injection_head(model) is not None) == copied
