"""Freezing the bottom or top k layers during fine-tuning (Wu et al. 2020, Table 1): layersim.models.freezing.frozen_layers."""

from __future__ import annotations

import json

import pytest
import torch

from layersim.data.batching import collate, encode_task
from layersim.models.encoders import describe_architecture
from layersim.models.freezing import embedding_modules, frozen_layers, frozen_range
from layersim.errors import LayersimError
from layersim.models.registry import load_task_model, load_tokenizer
from layersim.data.tasks import generated_table, get_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ("tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra")
L = 3


def _model_and_batch(tiny_model_dir, name: str):
    folder, spec = tiny_model_dir(name), get_task("synth-negation")
    torch.manual_seed(0)
    model = load_task_model(folder, spec).train()
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(generated_table(spec, "train", 8, seed=0), spec, tokenizer, 32)
    return model, collate(encoded, range(len(encoded)), tokenizer)


def _grads(model, batch, side=None, k=0) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks in every call
    if side is None:
        model(**batch).loss.backward()
    else:
        with frozen_layers(model, side, k):
            model(**batch).loss.backward()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


def _layer_prefix(model, index: int) -> str:
    stack = describe_architecture(model)
    return next(name for name, module in model.named_modules() if module is stack.module_for(index)) + "."


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-roberta", "tiny-electra"])
@pytest.mark.parametrize("side, k", [("bottom", 1), ("bottom", 2), ("top", 1), ("top", 2)])
def test_frozen_layers_get_no_gradient_and_the_others_the_full_one(tiny_model_dir, name, side, k):
    model, batch = _model_and_batch(tiny_model_dir, name)
    full = _grads(model, batch)
    frozen = _grads(model, batch, side, k)
    frozen_prefixes = tuple(_layer_prefix(model, i) for i in frozen_range(L, side, k))
    embedding_names = {n for module in (embedding_modules(model) if side == "bottom" else [])
                       for n, p in model.named_parameters() if any(p is q for q in module.parameters())}
    for param_name, grad in frozen.items():
        if param_name.startswith(frozen_prefixes) or param_name in embedding_names:
            assert grad is None, param_name
        elif full[param_name] is not None:
            # Nothing below a frozen top layer changes: gradients flow through it as before.
            torch.testing.assert_close(grad, full[param_name], rtol=1e-5, atol=1e-7, msg=param_name)
    assert all(p.requires_grad for p in model.parameters()), "restored on exit"


@pytest.mark.parametrize("k", [1, 2])
def test_albert_shared_group_gradient_splits_over_its_applications(tiny_model_dir, k):
    """ALBERT's one group is applied at every depth: the gradient it gets with the top k applications frozen
    plus the one with the other L − k frozen is its full gradient (each application contributes its part)."""
    model, batch = _model_and_batch(tiny_model_dir, "tiny-albert")
    group = describe_architecture(model).modules[0]
    group_names = {n for n, p in model.named_parameters() if any(p is q for q in group.parameters())}
    full = _grads(model, batch)
    top = _grads(model, batch, "top", k)
    bottom = _grads(model, batch, "bottom", L - k)
    for name in group_names:
        torch.testing.assert_close(top[name] + bottom[name], full[name], rtol=1e-4, atol=1e-6, msg=name)
    # The frozen applications did contribute: without them the group's gradient is another one.
    missing = sum(float((full[name] - top[name]).norm()) for name in group_names)
    assert missing > 0.05 * sum(float(full[name].norm()) for name in group_names)
    everything = _grads(model, batch, "top", L)
    assert all(everything[name] is None or not everything[name].any() for name in group_names)
    assert describe_architecture(model).modules is model.base_model.encoder.albert_layer_groups, "restored"


@pytest.mark.parametrize("name", TINY)
def test_a_training_step_leaves_frozen_weights_unchanged(tiny_model_dir, name):
    model, batch = _model_and_batch(tiny_model_dir, name)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with frozen_layers(model, "bottom", 1):
        model(**batch).loss.backward()
        optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    embeddings = {n for module in embedding_modules(model) for n, p in model.named_parameters()
                  if any(p is q for q in module.parameters())}
    assert changed and not changed & embeddings
    if name != "tiny-albert":
        assert not any(n.startswith(_layer_prefix(model, 0)) for n in changed)


def test_bad_freeze_arguments():
    assert frozen_range(12, "bottom", 4) == [0, 1, 2, 3] and frozen_range(12, "top", 2) == [10, 11]
    assert frozen_range(6, "top", 0) == []
    with pytest.raises(LayersimError, match=r"freeze side 'middle' is invalid; valid sides are: bottom, top\."):
        frozen_range(6, "middle", 2)
    with pytest.raises(LayersimError, match=r"cannot freeze 7 layers of this 6-layer model; valid values are 0\.\.6\."):
        frozen_range(6, "top", 7)


def test_layers_out_of_twelve_are_scaled_to_the_depth():
    from layersim.experiments.freeze import freeze_configs, scaled_layers

    assert [scaled_layers(k, 12) for k in (4, 6)] == [4, 6]
    assert [scaled_layers(k, 6) for k in (4, 6)] == [2, 3]       # MiniLM: bottom/top 2 and 3 of 6
    assert [scaled_layers(k, 24) for k in (4, 6)] == [8, 12]     # albert-large
    assert [scaled_layers(k, 3) for k in (1, 4, 6, 12)] == [1, 1, 2, 3]  # at least 1, at most L
    assert [c.label for c in freeze_configs((4, 6), 6)] == ["bottom2", "bottom3", "top2", "top3"]
    assert [c.label for c in freeze_configs((1, 2), 3)] == ["bottom1", "top1"]  # no repeats after scaling


def test_freeze_report_scores_and_time_saved():
    from layersim.experiments.freeze import FreezeConfig, FreezeRun, freeze_headline, freeze_report, freeze_timings

    spec = get_task("synth-negation")
    bottom, top = FreezeConfig("bottom", 2, 4), FreezeConfig("top", 2, 4)
    runs = [FreezeRun(None, 1, 0.80, 10.0), FreezeRun(None, 2, 0.90, 20.0),
            FreezeRun(bottom, 1, 0.70, 6.0), FreezeRun(bottom, 2, 0.90, 10.0),
            FreezeRun(top, 1, 0.85, 9.0), FreezeRun(top, 2, 0.85, None)]
    full, rows, figure = freeze_report(spec, 6, runs)
    assert full["unfrozen"] == {"score": 0.85, "not_converged": 0}
    assert full["bottom2"]["score"] == pytest.approx(0.8) and full["bottom2"]["score_change"] == pytest.approx(-0.05)
    # Wall-clock times stay out of the hashed results (and their rows and figure), in the timings alone.
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert "time" not in json.dumps([full, rows]) and labels == ["bottom 2 (not converged: 1 of 2)", "top 2"]
    timings = freeze_timings(runs)
    assert timings["unfrozen"] == {"train_seconds": {"1": 10.0, "2": 20.0}}
    assert timings["bottom2"]["time_saved"] == pytest.approx((0.4 + 0.5) / 2)
    assert timings["top2"]["time_saved"] == pytest.approx(0.1)  # a run without a time is left out of the mean
    assert full["top2"]["seeds"] == {"1": 0.85, "2": 0.85}
    # bottom2's seed 1 (0.70) is 0.2 below its sibling (0.90): more than seed noise, so flagged
    assert freeze_headline(full) == pytest.approx({"bottom2": -0.05, "top2": 0.0, "not_converged": 1})
    assert [row["converged"] for row in rows] == [True, True, False, True, True, True]
    assert [row["config"] for row in rows] == ["unfrozen", "unfrozen", "bottom2", "bottom2", "top2", "top2"]
    assert figure.axes[0].get_ylabel() == "accuracy"


def test_freeze_report_flags_runs_that_did_not_converge():
    """The quickstart's artefact: an unfrozen seed stuck at the trivial predictor makes freezing look like a
    gain. The stuck unfrozen run and a frozen run far below its seed sibling are flagged in the rows, the
    counts and the bar chart's labels."""
    from layersim.training.convergence import check_run
    from layersim.experiments.freeze import FreezeConfig, FreezeRun, freeze_headline, freeze_report

    spec = get_task("synth-similarity")
    bottom, top = FreezeConfig("bottom", 2, 4), FreezeConfig("top", 2, 4)
    stuck = check_run("pearson", 0.369, 0.0, 3.1, 3.125).record()
    runs = [FreezeRun(None, 1, 0.369, 10.0, stuck), FreezeRun(None, 2, 0.768, 10.0),
            FreezeRun(bottom, 1, 0.767, 8.0), FreezeRun(bottom, 2, 0.770, 8.0),
            FreezeRun(top, 1, 0.30, 8.0), FreezeRun(top, 2, 0.75, 8.0)]
    full, rows, figure = freeze_report(spec, 6, runs)
    assert [(row["config"], row["seed"]) for row in rows if not row["converged"]] == [("unfrozen", 1), ("top2", 1)]
    assert "training loss" in rows[0]["reason"] and "below the median 0.750" in rows[4]["reason"]
    assert freeze_headline(full)["not_converged"] == 2
    assert full["unfrozen"]["not_converged"] == 1 and full["bottom2"]["not_converged"] == 0
    labels = [tick.get_text() for tick in figure.axes[0].get_xticklabels()]
    assert labels == ["bottom 2", "top 2 (not converged: 1 of 2)"]  # no wall-clock note: the figure is hashed
    assert figure.axes[0].get_legend().get_texts()[0].get_text().startswith("unfrozen (not converged: 1 of 2)")
