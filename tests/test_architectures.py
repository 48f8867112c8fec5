"""Every architecture's layer stack (layersim.models.layer_stacks): exit, skip, continue, smaller copies that
reload in plain transformers, freezing, KV caches inside a selection, and the generic finder — on tiny random
configs of all families, with their own sequence-classification heads (first token for encoders, last non-pad
token for decoders and XLNet). Exact identities are torch.equal in fp32."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from layersim.errors import LayersimError
from layersim.models.encoders import (all_spans, continue_from, describe_architecture, exit_at, inject_first_token,
                                      num_layers, run_layers, skip_span, smaller_copy)
from layersim.models.freezing import embedding_modules, frozen_layers
from layersim.models.layer_stacks import FAMILIES
from layersim.models.registry import ARCHITECTURES, MODELS, packaged_minilm_dir, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L = 3
TEXTS = ["the soup was not good .", "a man plays a guitar on the old stage tonight", "it rained"]
DECODERS = ("gpt2", "llama", "mistral", "qwen2")
FINAL_NORM = {"gpt2", "llama", "mistral", "qwen2", "modernbert"}
# A layer list with a gap (renumbered layer_idx, layer_types restricted: qwen2 keeps [sliding, sliding], not
# the positional [full, sliding]); ModernBERT copies must keep layer 0 (types [full, full], not [full, sliding]).
COPIED = {name: [0, 2] if name == "modernbert" else [1, 2] for name in ARCHITECTURES}


@pytest.fixture(scope="module")
def batch():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_dir())
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")  # padded on the right: masks matter
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}, tokenizer


@pytest.fixture(scope="module")
def model_of(batch):
    """``model_of("gpt2")``: the tiny sequence classifier of that family in eval mode, made once per module."""
    tokenizer = batch[1]
    cache: dict[str, nn.Module] = {}

    def get(name: str) -> nn.Module:
        if name not in cache:
            torch.manual_seed(0)
            config = tiny_config(name, len(tokenizer), tokenizer.pad_token_id)
            config.num_labels = 3
            cache[name] = AutoModelForSequenceClassification.from_config(config).eval()
        return cache[name]

    return get


def _run(model, inputs, **kw):
    with torch.no_grad():
        return model(**inputs, **kw)


def test_every_registered_architecture_has_a_stack_a_tiny_model_and_hub_entries_in_the_table():
    assert set(ARCHITECTURES) == set(FAMILIES)
    assert {f"tiny-{name}" for name in ARCHITECTURES} <= set(MODELS)
    hub = {spec.architecture for spec in MODELS.values() if spec.source == "hub"}
    assert hub == set(FAMILIES) and all(spec.revision is None for spec in MODELS.values())  # the lock pins commits


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_exit_at_L_is_the_full_model_bit_for_bit(model_of, batch, name):
    model, inputs = model_of(name), batch[0]
    assert num_layers(model) == L and describe_architecture(model).how == "table"
    full = _run(model, inputs, output_hidden_states=True)
    assert len(full.hidden_states) == L + 1
    for context in (lambda: exit_at(model, L), lambda: run_layers(model, range(L))):
        with context():
            inside = _run(model, inputs, output_hidden_states=True)
        assert torch.equal(inside.logits, full.logits)
        assert all(torch.equal(a, b) for a, b in zip(inside.hidden_states, full.hidden_states, strict=True))
    if name in DECODERS:  # the head reads the last non-pad token, and padding is on the right
        assert model.config.pad_token_id == batch[1].pad_token_id


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_exit_at_k_is_layer_k_into_the_head_and_every_skip_changes_the_output(model_of, batch, name):
    model, inputs = model_of(name), batch[0]
    base = model.base_model
    full = _run(model, inputs).logits
    hidden = _run(base, inputs, output_hidden_states=True).hidden_states
    norm = describe_architecture(model).final_state_module() if name in FINAL_NORM else nn.Identity()
    for k in range(L):
        with exit_at(model, k):
            logits = _run(model, inputs).logits
            out = _run(base, inputs, output_hidden_states=True)
        assert len(out.hidden_states) == k + 1 and not torch.allclose(logits, full)
        # Layer k's state, through the final norm where the model has one (transformers: hidden_states[-1]).
        with torch.no_grad():
            torch.testing.assert_close(out.last_hidden_state, norm(hidden[k]), atol=1e-5, rtol=0)
        torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, atol=0, rtol=0)
    for i, j in all_spans(L):
        if (i, j) == (1, L):
            continue  # the same as exit_at(0)
        with skip_span(model, i, j):
            skipped = _run(model, inputs).logits
        assert torch.isfinite(skipped).all() and not torch.allclose(skipped, full), (i, j)
    assert torch.equal(_run(model, inputs).logits, full)  # restored


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_continue_from_a_cached_state_is_skipping(model_of, batch, name):
    model, inputs = model_of(name), batch[0]
    hidden = _run(model.base_model, inputs, output_hidden_states=True).hidden_states
    for i, j in [(1, 1), (2, 2), (2, 3)]:
        with skip_span(model, i, j):
            skipped = _run(model, inputs).logits
        if j < L:
            with continue_from(model, j, hidden[i - 1]):
                continued = _run(model, inputs).logits
            torch.testing.assert_close(continued, skipped, atol=1e-6, rtol=0)
    with continue_from(model, 0, hidden[0]):  # from the embeddings' output: the full model
        torch.testing.assert_close(_run(model, inputs).logits, _run(model, inputs).logits, atol=0, rtol=0)
    with continue_from(model, 0, hidden[0]):
        continued = _run(model, inputs).logits
    torch.testing.assert_close(continued, _run(model, inputs).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_smaller_copy_reloads_in_plain_transformers_bit_for_bit(model_of, batch, tmp_path, name):
    model, inputs = model_of(name), batch[0]
    layers = COPIED[name]
    with run_layers(model, layers):
        expected = _run(model, inputs).logits
    small = smaller_copy(model, layers)
    assert torch.equal(_run(small, inputs).logits, expected)
    small.save_pretrained(tmp_path)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert reloaded.config.num_hidden_layers == len(layers) == num_layers(reloaded)
    types = getattr(model.config, "layer_types", None)
    if types is not None:
        assert reloaded.config.layer_types == [types[i] for i in layers]
    assert torch.equal(_run(reloaded, inputs).logits, expected)
    assert num_layers(model) == L  # the original is untouched


@pytest.mark.parametrize("name", [n for n in ARCHITECTURES if n != "albert"])  # ALBERT: tests/test_freezing.py
def test_freezing_all_layers_and_the_embeddings_leaves_only_the_head_trainable(model_of, batch, name):
    model, inputs = model_of(name), batch[0]
    labels = torch.tensor([0, 1, 2])
    stack = describe_architecture(model)
    for side, k in (("bottom", L), ("bottom", 1), ("top", 1)):
        model.zero_grad(set_to_none=True)
        with frozen_layers(model, side, k):
            model(**inputs, labels=labels).loss.backward()
        trained = {n for n, p in model.base_model.named_parameters() if p.grad is not None}
        layer_names = [{f"{n}" for n, _ in stack.module_for(i).named_parameters()} for i in range(L)]
        for i in range(L):
            frozen = (i < k) if side == "bottom" else (i >= L - k)
            got = {n for n, p in stack.module_for(i).named_parameters() if p.grad is not None}
            assert got == (set() if frozen else layer_names[i] - _unused(name, i)), (side, k, i)
        if side == "bottom" and k == L:
            # What still trains in the base model: only what comes after the layers (final norm, pooler).
            assert all(n.split(".")[0] in {"norm", "ln_f", "final_norm", "pooler"} for n in trained), trained
    model.zero_grad(set_to_none=True)
    assert all(p.requires_grad for p in model.parameters())
    assert embedding_modules(model)


def _unused(name: str, index: int) -> set[str]:
    """Parameters of a layer that a classification forward never uses (so they get no gradient anyway)."""
    return {"rel_attn.r_s_bias", "rel_attn.seg_embed"} if name == "xlnet" else set()  # segment terms: no segments


@pytest.mark.parametrize("name", DECODERS)
def test_a_kv_cache_built_inside_a_skip_is_the_smaller_models(model_of, batch, name):
    """Layers renumbered and layer_types restricted: decoding with a cache inside skip_span gives what one
    uncached forward of the same selection gives (Qwen2 mixes full and sliding-window layers)."""
    base = model_of(name).base_model
    ids = batch[0]["input_ids"][1:2]  # the longest text, unpadded
    with skip_span(base, 1, 1):
        whole = _run(base, {"input_ids": ids}, use_cache=False).last_hidden_state
        first = _run(base, {"input_ids": ids[:, :6]}, use_cache=True)
        cache = first.cache if hasattr(first, "cache") else first.past_key_values
        assert len(cache.layers) == L - 1
        rest = _run(base, {"input_ids": ids[:, 6:]}, use_cache=True, cache=cache)
    torch.testing.assert_close(rest.last_hidden_state, whole[:, 6:], atol=1e-5, rtol=0)


def test_copies_that_would_not_reload_exactly_are_refused(model_of):
    with pytest.raises(LayersimError, match=r"modernbert.*layer 0 .*valid layer lists keep layer 0"):
        smaller_copy(model_of("modernbert"), [1, 2])
    torch.manual_seed(0)
    config = tiny_config("deberta-v2", 100, 0)
    config.conv_kernel_size = 3
    deberta = AutoModelForSequenceClassification.from_config(config).eval()
    with pytest.raises(LayersimError, match=r"'conv' module to layer 0's output"):
        smaller_copy(deberta, [1, 2])
    smaller_copy(deberta, [0, 2])
    config = tiny_config("gpt2", 100, 0)
    config.scale_attn_by_inverse_layer_idx = True
    gpt2 = AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(LayersimError, match=r"1/\(layer index \+ 1\).*\[1, 2\]"):
        smaller_copy(gpt2, [1, 2])
    assert num_layers(smaller_copy(gpt2, [0, 1])) == 2


def test_deberta_conv_belongs_to_layer_0(batch):
    """DeBERTa-v2's conv is added to layer 0's output: a selection without layer 0 does not apply it."""
    torch.manual_seed(0)
    config = tiny_config("deberta-v2", len(batch[1]), 0)
    config.conv_kernel_size = 3
    model = AutoModelForSequenceClassification.from_config(config).eval()
    inputs = batch[0]
    full = _run(model, inputs).logits
    with run_layers(model, [1, 2]):
        without_0 = _run(model, inputs).logits
    with torch.no_grad():
        for p in model.base_model.encoder.conv.parameters():
            p.add_(1.0)
    assert not torch.allclose(_run(model, inputs).logits, full)
    with run_layers(model, [1, 2]):
        assert torch.equal(_run(model, inputs).logits, without_0)
    assert model.base_model.encoder.conv is not None


@pytest.mark.parametrize("name", ["distilbert", "deberta-v2", "mpnet", "modernbert", "xlm-roberta"])
def test_injection_feeds_the_first_token_to_heads_that_read_it(model_of, batch, name):
    model, inputs = model_of(name), batch[0]
    last = _run(model.base_model, inputs).last_hidden_state
    plain = _run(model, inputs).logits
    with inject_first_token(model, last[:, 0]):
        torch.testing.assert_close(_run(model, inputs).logits, plain, atol=1e-6, rtol=0)
    with inject_first_token(model, torch.zeros(len(TEXTS), 32)):
        assert not torch.allclose(_run(model, inputs).logits, plain)


@pytest.mark.parametrize("name", ["gpt2", "xlnet"])
def test_injection_refuses_heads_that_read_the_last_token(model_of, name):
    with pytest.raises(LayersimError, match=rf"{name!r} model reads the last token.*valid architectures are: albert"):
        with inject_first_token(model_of(name), torch.zeros(3, 32)):
            pass


def test_the_generic_finder_runs_a_family_not_in_the_table(batch, tmp_path):
    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt_neox", vocab_size=len(batch[1]), hidden_size=32, num_hidden_layers=L,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                                  pad_token_id=0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    stack = describe_architecture(model)
    assert "gpt_neox" not in FAMILIES and stack.how == "generic" and stack.attribute == "layers"
    assert stack.final_state_module() is model.base_model.final_layer_norm
    inputs = batch[0]
    full = _run(model, inputs, output_hidden_states=True)
    with exit_at(model, L):
        assert torch.equal(_run(model, inputs).logits, full.logits)
    with skip_span(model, 2, 2):
        assert not torch.allclose(_run(model, inputs).logits, full.logits)
    with exit_at(model, 0):
        assert len(_run(model, inputs, output_hidden_states=True).hidden_states) == 1
    smaller_copy(model, [1, 2]).save_pretrained(tmp_path)
    with run_layers(model, [1, 2]):
        expected = _run(model, inputs).logits
    assert torch.equal(_run(AutoModelForSequenceClassification.from_pretrained(tmp_path).eval(), inputs).logits,
                       expected)


def test_the_generic_finder_refuses_ambiguous_and_foreign_models():
    # XLM keeps four lists of one module per layer (attentions, ffns, layer_norm1, layer_norm2).
    from transformers import XLMConfig, XLMModel

    xlm = XLMModel(XLMConfig(vocab_size=50, emb_dim=32, n_layers=2, n_heads=2))
    with pytest.raises(LayersimError, match=r"architecture 'xlm': its base model has 4 layer lists of length 2 "
                                            r"\(attentions, ffns, layer_norm1, layer_norm2\); supported .*gpt2"):
        exit_at(xlm, 1)
    with pytest.raises(LayersimError, match=r"Linear, which is not a transformers model"):
        num_layers(nn.Linear(2, 2))
