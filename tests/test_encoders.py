"""Tests for layersim.models.encoders: untuned truncation (exit at layer k) and layer skipping, on the tiny
random-init configs of all four architectures and their own task heads.

The references are independent of the context managers: the plain forward's hidden states, the
layers run by hand, and the task head fed a given representation through a hook on the encoder.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask

from layersim.data.batching import collate, encode_task
from layersim.models.encoders import (all_spans, describe_architecture, exit_at, inject_first_token, num_layers,
                                      run_layers, skip_span)
from layersim.errors import LayersimError
from layersim.models.registry import load_task_model, load_tokenizer
from layersim.data.tasks import generated_table, get_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ("tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra")
SINGLE, CHOICE, REGRESSION, PAIR = "synth-negation", "synth-choice", "synth-similarity", "synth-roles"
L = 3  # the tiny configs have 3 layers




@pytest.fixture(scope="module")
def task_model(tiny_model_dir):
    """A factory: ``task_model("tiny-bert", "synth-choice")`` gives (model in eval mode, padded batch
    without labels), loaded once per module. The batch has padding, so masks matter."""
    cache: dict[tuple[str, str], tuple[nn.Module, dict]] = {}

    def get(name: str, task: str, fresh: bool = False):
        key = (name, task)
        if fresh or key not in cache:
            folder = tiny_model_dir(name)
            spec = get_task(task)
            torch.manual_seed(0)  # fresh heads are random: make them the same on every run
            model = load_task_model(folder, spec).eval()
            tokenizer = load_tokenizer(folder)
            encoded = encode_task(generated_table(spec, "validation", 6, seed=0), spec, tokenizer, 40)
            batch = collate(encoded, range(len(encoded)), tokenizer, with_labels=False)
            if fresh:
                return model, batch
            cache[key] = (model, batch)
        return cache[key]

    return get


def _flat(batch: dict) -> dict:
    """Multiple-choice batches are (batch, choices, length); the base model takes (rows, length)."""
    return {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items()}


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _base(model, batch, **kw):
    with torch.no_grad():
        return model.base_model(**_flat(batch), **kw)


def _by_hand(model, batch, kept: list[int]) -> torch.Tensor:
    """Embeddings, then the kept 0-based layers called one by one: the reference for skipping."""
    base = model.base_model
    inputs = _flat(batch)
    arch = describe_architecture(model).architecture
    with torch.no_grad():
        h = base.embeddings(input_ids=inputs["input_ids"], token_type_ids=inputs.get("token_type_ids"))
        if arch == "electra" and hasattr(base, "embeddings_project"):
            h = base.embeddings_project(h)
        if arch == "albert":
            h = base.encoder.embedding_hidden_mapping_in(h)
        mask = create_bidirectional_mask(config=base.config, inputs_embeds=h,
                                         attention_mask=inputs["attention_mask"])
        for n in kept:
            if arch == "albert":
                # One shared group (num_hidden_groups=1): every layer applies group 0.
                h = base.encoder.albert_layer_groups[0](h, mask)
            else:
                h = base.encoder.layer[n](h, mask)
    return h


def _head_on(model, batch, state: torch.Tensor) -> torch.Tensor:
    """The task head (with its own pooling) applied to `state` instead of the last layer's output:
    a hook makes the full encoder return `state`."""

    def replace(module, args, output):
        output.last_hidden_state = state  # keeps the architecture's own output type and other fields
        return output

    handle = model.base_model.encoder.register_forward_hook(replace)
    try:
        return _logits(model, batch)
    finally:
        handle.remove()


# --- exit at L and the empty skip are the full model ----------------------------------------------

@pytest.mark.parametrize("task", [SINGLE, CHOICE])
@pytest.mark.parametrize("name", TINY)
def test_exit_at_L_and_empty_skip_are_bit_identical_to_the_full_model(task_model, name, task):
    model, batch = task_model(name, task)
    assert num_layers(model) == L
    full = _logits(model, batch)
    with exit_at(model, L):
        assert torch.equal(_logits(model, batch), full)
    with run_layers(model, range(L)):
        assert torch.equal(_logits(model, batch), full)


@pytest.mark.parametrize("task", [REGRESSION, PAIR])
def test_full_depth_is_exact_for_regression_and_pairs(task_model, task):
    model, batch = task_model("tiny-roberta", task)
    full = _logits(model, batch)
    with exit_at(model, L):
        assert torch.equal(_logits(model, batch), full)


# --- exit at k is the k-th hidden state, and the head reads it ------------------------------------

@pytest.mark.parametrize("task", [SINGLE, CHOICE])
@pytest.mark.parametrize("name", TINY)
def test_exit_at_k_equals_the_kth_hidden_state_and_feeds_the_head(task_model, name, task):
    model, batch = task_model(name, task)
    hidden = _base(model, batch, output_hidden_states=True).hidden_states
    assert len(hidden) == L + 1
    for k in range(L + 1):
        with exit_at(model, k):
            out = _base(model, batch, output_hidden_states=True)
            logits = _logits(model, batch)
        torch.testing.assert_close(out.last_hidden_state, hidden[k], atol=1e-6, rtol=0)
        # k layers run: the initial state plus one per layer (also for k = 0, embeddings only).
        assert len(out.hidden_states) == k + 1
        for a, b in zip(out.hidden_states, hidden):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        # Untuned truncation: layer k's representation goes into the fine-tuned head unchanged.
        torch.testing.assert_close(logits, _head_on(model, batch, hidden[k]), atol=1e-6, rtol=0)


def test_exit_at_k_for_regression(task_model):
    model, batch = task_model("tiny-electra", REGRESSION)
    hidden = _base(model, batch, output_hidden_states=True).hidden_states
    for k in range(L + 1):
        with exit_at(model, k):
            logits = _logits(model, batch)
        assert logits.shape == (batch["input_ids"].shape[0], 1)
        torch.testing.assert_close(logits, _head_on(model, batch, hidden[k]), atol=1e-6, rtol=0)


# --- skipping -------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", [SINGLE, CHOICE])
@pytest.mark.parametrize("name", TINY)
def test_skip_span_equals_the_kept_layers_run_by_hand(task_model, name, task):
    model, batch = task_model(name, task)
    for i, j in all_spans(L):
        kept = [n for n in range(L) if not i - 1 <= n <= j - 1]
        reference = _by_hand(model, batch, kept)
        with skip_span(model, i, j):
            state = _base(model, batch).last_hidden_state
            logits = _logits(model, batch)
        torch.testing.assert_close(state, reference, atol=1e-6, rtol=0)
        torch.testing.assert_close(logits, _head_on(model, batch, reference), atol=1e-6, rtol=0)


@pytest.mark.parametrize("task", [SINGLE, CHOICE])
def test_albert_with_one_group_skipping_s_layers_is_exiting_at_L_minus_s(task_model, task):
    # One shared layer: which s applications are left out cannot matter, only how many.
    model, batch = task_model("tiny-albert", task)
    assert model.config.num_hidden_groups == 1
    for i, j in all_spans(L):
        with exit_at(model, L - (j - i + 1)):
            expected = _logits(model, batch)
        with skip_span(model, i, j):
            assert torch.equal(_logits(model, batch), expected)


def test_albert_with_several_groups_runs_each_layers_own_group():
    # 4 layers over 2 groups: layers 0, 1 use group 0 and layers 2, 3 group 1 (AlbertTransformer's rule).
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=4,
                          num_hidden_groups=2, num_attention_heads=2, intermediate_size=32,
                          max_position_embeddings=20)
    model = AlbertModel(config).eval()
    inputs = {"input_ids": torch.randint(1, 50, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    with torch.no_grad():
        hidden = model(**inputs, output_hidden_states=True).hidden_states
        groups = model.encoder.albert_layer_groups
        stack = describe_architecture(model)
        assert [stack.module_for(n) for n in range(4)] == [groups[0], groups[0], groups[1], groups[1]]
        for k in range(5):
            with exit_at(model, k):
                torch.testing.assert_close(model(**inputs).last_hidden_state, hidden[k], atol=1e-6, rtol=0)
        with skip_span(model, 2, 3):  # keep layers 0 and 3: group 0, then group 1
            skipped = model(**inputs).last_hidden_state
        h = model.encoder.embedding_hidden_mapping_in(model.embeddings(inputs["input_ids"]))
        reference = groups[1](groups[0](h, None), None)
    torch.testing.assert_close(skipped, reference, atol=1e-6, rtol=0)


# --- restoration and no copies ---------------------------------------------------------------------

def _snapshot(model):
    encoder = model.base_model.encoder
    stack = describe_architecture(model)
    return {"list": encoder._modules[stack.attribute], "config": encoder.config,
            "values": (model.config.num_hidden_layers, getattr(model.config, "num_hidden_groups", None)),
            "keys": list(model.state_dict()), "n_modules": len(list(model.modules()))}


@pytest.mark.parametrize("name", TINY)
def test_the_model_is_restored_after_exit_and_after_an_exception(task_model, name):
    model, batch = task_model(name, CHOICE)
    before, full = _snapshot(model), _logits(model, batch)
    with skip_span(model, 2, 2):
        assert num_layers(model) == L  # the depth of the model, not of the selection
        assert _snapshot(model)["values"] == before["values"]  # the shared config is never touched
    with pytest.raises(RuntimeError, match="boom"):
        with exit_at(model, 1):
            raise RuntimeError("boom")
    after = _snapshot(model)
    assert after["list"] is before["list"] and after["config"] is before["config"]
    assert after == before
    assert model.base_model.encoder.config is model.config
    assert torch.equal(_logits(model, batch), full)
    assert len(_base(model, batch, output_hidden_states=True).hidden_states) == L + 1


@pytest.mark.parametrize("name", TINY)
def test_weights_are_never_copied(task_model, name):
    model, batch = task_model(name, SINGLE)
    pointers = {p.data_ptr() for p in model.parameters()}
    modules = {id(m) for m in model.modules()}
    for layers in ([], [0], [0, 2], [1, 2]):
        with run_layers(model, layers):
            inside = {p.data_ptr() for p in model.parameters()}
            assert inside <= pointers
            swapped = model.base_model.encoder._modules[describe_architecture(model).attribute]
            # The only new module is the list container that holds the existing layers.
            assert {id(m) for m in model.modules()} - {id(swapped)} <= modules


def test_hidden_states_of_the_full_model_survive_a_first_request_inside_a_context(task_model):
    # transformers v5 installs its hidden-state hooks once, lazily, on the modules present at the first
    # request; a first request inside exit_at(1) must not leave layers 2..L without hooks.
    model, batch = task_model("tiny-bert", SINGLE, fresh=True)
    with exit_at(model, 1):
        assert len(_base(model, batch, output_hidden_states=True).hidden_states) == 2
    assert len(_base(model, batch, output_hidden_states=True).hidden_states) == L + 1


def test_contexts_do_not_nest(task_model):
    model, _ = task_model("tiny-albert", SINGLE)
    with exit_at(model, 2):
        with pytest.raises(LayersimError, match="do not nest"):
            with exit_at(model, 1):
                pass
        assert len(model.base_model.encoder.albert_layer_groups) == 2  # the outer context is intact
    assert len(model.base_model.encoder.albert_layer_groups) == 1


# --- spans and errors ------------------------------------------------------------------------------

def test_all_spans():
    assert all_spans(3) == [(1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3)]
    assert len(all_spans(24)) == 24 * 25 // 2
    assert all_spans(0) == []


@pytest.mark.parametrize("k", [-1, L + 1])
def test_exit_layer_out_of_range(task_model, k):
    model, _ = task_model("tiny-bert", SINGLE)
    with pytest.raises(LayersimError, match=rf"exit layer {k} .*0\.\.{L}"):
        exit_at(model, k)


@pytest.mark.parametrize("span", [(0, 1), (2, 1), (1, L + 1)])
def test_skip_span_out_of_range(task_model, span):
    model, _ = task_model("tiny-albert", SINGLE)
    with pytest.raises(LayersimError, match=rf"\({span[0]}, {span[1]}\).*1 <= i <= j <= {L}"):
        skip_span(model, *span)


@pytest.mark.parametrize("layers", [[3], [-1], [1, 0], [1, 1]])
def test_run_layers_rejects_bad_indices(task_model, layers):
    model, _ = task_model("tiny-electra", SINGLE)
    before = model.base_model.encoder.layer
    with pytest.raises(LayersimError, match=rf"0\.\.{L - 1}"):
        with run_layers(model, layers):
            pass
    assert model.base_model.encoder.layer is before


def test_non_integer_exit_layer(task_model):
    model, _ = task_model("tiny-bert", SINGLE)
    with pytest.raises(LayersimError, match=r"exit layer 1\.5 .*0\.\.3"):
        exit_at(model, 1.5)


def test_unsupported_models():
    # GPT-2 is supported since every family has a layer stack (tests/test_architectures.py); XLM keeps four
    # lists of one module per layer, so its layer stack is ambiguous.
    from transformers import XLMConfig, XLMModel

    xlm = XLMModel(XLMConfig(vocab_size=50, emb_dim=16, n_layers=2, n_heads=2))
    for model, shown in ((xlm, "'xlm'"), (nn.Linear(2, 2), "Linear")):
        with pytest.raises(LayersimError, match=rf"{shown}.*albert, bert, deberta-v2, distilbert, electra, gpt2"):
            exit_at(model, 1)
        with pytest.raises(LayersimError, match=shown):
            num_layers(model)


# --- layer injection (Ren et al. §4.5) ---------------------------------------------------------------

@pytest.mark.parametrize("task", [SINGLE, CHOICE, REGRESSION])
@pytest.mark.parametrize("name", TINY)
def test_injecting_a_first_token_state_feeds_it_to_the_head(task_model, name, task):
    model, batch = task_model(name, task)
    last = _base(model, batch).last_hidden_state
    # Injecting the model's own CLS state changes nothing; any other vector gives the head's output on it.
    plain = _logits(model, batch)
    with inject_first_token(model, last[:, 0]):
        torch.testing.assert_close(_logits(model, batch), plain, atol=1e-6, rtol=0)
    other = torch.randn(last.shape[0], last.shape[2], generator=torch.Generator().manual_seed(0))
    state = last.clone()
    state[:, 0] = other
    with inject_first_token(model, other):
        injected = _logits(model, batch)
    torch.testing.assert_close(injected, _head_on(model, batch, state), atol=1e-6, rtol=0)
    assert not torch.allclose(injected, _logits(model, batch))


def test_injection_refuses_misaligned_vectors(task_model):
    model, batch = task_model("tiny-bert", SINGLE)
    rows, hidden = _flat(batch)["input_ids"].shape[0], model.config.hidden_size
    with pytest.raises(LayersimError, match=r"valid shape is \(rows, 32\)"):
        with inject_first_token(model, torch.zeros(rows, hidden + 1)):
            pass
    with pytest.raises(LayersimError, match=f"only {rows - 1} vectors"):
        with inject_first_token(model, torch.zeros(rows - 1, hidden)):
            _logits(model, batch)
    with pytest.raises(LayersimError, match=f"{rows + 1} vectors were given"):
        with inject_first_token(model, torch.zeros(rows + 1, hidden)):
            _logits(model, batch)
