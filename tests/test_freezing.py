"""Freezing the bottom or top k layers during fine-tuning (Wu et al. 2020, Table 1): layersim.models.freezing.frozen_layers."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from layersim.data.batching import collate, encode_task
from layersim.models.encoders import describe_architecture
from layersim.compute.flops import frozen_range
from layersim.models.freezing import embedding_modules, frozen_layers
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


def _report(spec, runs, flops=None, recipe="finetune"):
    from layersim.experiments.freeze import freeze_report

    return freeze_report(spec, 6, runs, {"name": recipe, "batch_size": 4}, flops or {})


def test_freeze_report_scores_each_run_beside_its_unfrozen_run():
    from layersim.experiments.freeze import FreezeConfig, FreezeRun, freeze_headline

    spec = get_task("synth-negation")
    bottom, top = FreezeConfig("bottom", 2, 4), FreezeConfig("top", 2, 4)
    runs = [FreezeRun(None, 1, 0.80), FreezeRun(None, 2, 0.90),
            FreezeRun(bottom, 1, 0.70), FreezeRun(bottom, 2, 0.90),
            FreezeRun(top, 1, 0.85), FreezeRun(top, 2, 0.85)]
    flops = {"bottom2": {"backward_flops_saved": 0.5, "training_flops_saved": 0.25}}
    full, rows, figure = _report(spec, runs, flops)
    assert full["unfrozen"] == {"score": 0.85, "score_converged": 0.85, "not_converged": 0,
                                "baseline": "the finetune stage's run of the same recipe and seed"}
    assert full["recipe"] == {"name": "finetune", "batch_size": 4}
    assert full["bottom2"]["score"] == pytest.approx(0.8) and full["bottom2"]["score_change"] == pytest.approx(-0.05)
    assert full["bottom2"]["unfrozen_score"] == 0.85 and full["bottom2"]["unfrozen_not_converged"] == 0
    assert full["bottom2"]["backward_flops_saved"] == 0.5 and "backward_flops_saved" not in full["top2"]
    assert full["top2"]["seeds"] == {"1": 0.85, "2": 0.85}
    # Wall-clock times stay out of the hashed results (and their rows and figure), in the timings alone.
    assert "time" not in json.dumps([full, rows])
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert labels == ["bottom 2 (not converged: 1 of 2)\n\u221250 % backward FLOPs", "top 2\n? backward FLOPs"]
    # bottom2's seed 1 (0.70) is 0.2 below its sibling (0.90): more than seed noise, so flagged
    assert freeze_headline(full) == {"bottom2": {"score_change": pytest.approx(-0.05), "backward_flops_saved": 0.5},
                                     "top2": {"score_change": pytest.approx(0.0)}, "not_converged": 1}
    assert [row["converged"] for row in rows] == [True, True, False, True, True, True]
    assert [row["config"] for row in rows] == ["unfrozen", "unfrozen", "bottom2", "bottom2", "top2", "top2"]
    assert [row.get("unfrozen_score") for row in rows] == [None, None, 0.8, 0.9, 0.8, 0.9]
    assert figure.axes[0].get_ylabel() == "accuracy"


def test_freeze_report_flags_runs_that_did_not_converge():
    """The quickstart's artefact: an unfrozen seed stuck at the trivial predictor makes freezing look like a
    gain. The stuck unfrozen run and a frozen run far below its seed sibling are flagged in the rows, the
    counts and the bar chart's labels; each frozen run carries its unfrozen run's verdict."""
    from layersim.training.convergence import check_run
    from layersim.experiments.freeze import FreezeConfig, FreezeRun, freeze_headline

    spec = get_task("synth-similarity")
    bottom, top = FreezeConfig("bottom", 2, 4), FreezeConfig("top", 2, 4)
    stuck = check_run("pearson", 0.369, 0.0, 3.1, 3.125).record()
    runs = [FreezeRun(None, 1, 0.369, stuck), FreezeRun(None, 2, 0.768),
            FreezeRun(bottom, 1, 0.767), FreezeRun(bottom, 2, 0.770),
            FreezeRun(top, 1, 0.30), FreezeRun(top, 2, 0.75)]
    full, rows, figure = _report(spec, runs, recipe="wu")
    assert full["unfrozen"]["baseline"] == "trained in the freeze stage with the same recipe"
    assert [(row["config"], row["seed"]) for row in rows if not row["converged"]] == [("unfrozen", 1), ("top2", 1)]
    assert "training loss" in rows[0]["reason"] and "below the median 0.750" in rows[4]["reason"]
    assert [row.get("unfrozen_converged") for row in rows] == [None, None, False, True, False, True]
    assert freeze_headline(full)["not_converged"] == 2
    assert full["unfrozen"]["not_converged"] == 1 and full["bottom2"]["not_converged"] == 0
    assert full["bottom2"]["unfrozen_not_converged"] == 1
    # the converged-only means leave the flagged runs out; the all-runs means keep them
    assert full["unfrozen"]["score"] == pytest.approx(0.5685) and full["unfrozen"]["score_converged"] == 0.768
    assert full["top2"]["score"] == pytest.approx(0.525) and full["top2"]["score_converged"] == 0.75
    assert full["bottom2"]["score_converged"] == pytest.approx(0.7685)
    labels = [tick.get_text().split("\n")[0] for tick in figure.axes[0].get_xticklabels()]
    assert labels == ["bottom 2", "top 2 (not converged: 1 of 2)"]
    assert figure.axes[0].get_legend().get_texts()[0].get_text().startswith("unfrozen (not converged: 1 of 2)")


# --- the cost of freezing: FLOPs counted, time measured interleaved ---

def test_training_flops_on_a_hand_computed_case():
    """h = 2, f = 4, s = 3, L = 3: W = 8·3·4 + 4·3·2·4 = 192, A = 4·9·2 = 72, QKV input gradient 6·3·4 = 72.
    A trainable layer's backward is 2W + 2A = 528; a frozen one above a trainable one W + 2A = 336."""
    from layersim.compute.flops import LayerShape, training_flops

    shape = LayerShape(num_layers=3, hidden=2, intermediate=4)
    assert training_flops(shape, None, 0, 3) == {"forward": 3 * (192 + 72), "backward": 3 * 528}
    assert training_flops(shape, "top", 1, 3)["backward"] == 2 * 528 + 336
    assert training_flops(shape, "top", 3, 3)["backward"] == 3 * 336  # the embeddings still train
    # bottom: no backward below the lowest trainable layer, which needs no gradient to its input
    assert training_flops(shape, "bottom", 1, 3)["backward"] == 0 + (528 - 72) + 528
    assert training_flops(shape, "bottom", 2, 3)["backward"] == 528 - 72
    assert training_flops(shape, "bottom", 3, 3)["backward"] == 0
    assert training_flops(shape, "bottom", 0, 3) == training_flops(shape, None, 0, 3)


def test_flops_saved_is_a_share_of_the_sum_over_sequences():
    """s = 1: W = 32 + 32 = 64, A = 8, full backward 3 × 144 = 432; s = 3: 1584 (above). Freezing the top layer
    saves its weight gradients, W: 64 and 192."""
    from layersim.compute.flops import LayerShape, flops_saved

    shape = LayerShape(num_layers=3, hidden=2, intermediate=4)
    saved = flops_saved(shape, "top", 1, [1, 3])
    assert saved == {"backward_flops_saved": 256 / 2016, "training_flops_saved": 256 / (2016 + 3 * 72 + 792)}
    assert flops_saved(shape, "bottom", 1, [3])["backward_flops_saved"] == 600 / 1584


@pytest.mark.parametrize("side, k", [("bottom", 1), ("bottom", 2), ("top", 1), ("top", 2)])
def test_flops_saved_match_what_torch_computes(tiny_model_dir, side, k):
    """The counted saving equals the difference in matmul FLOPs torch's FlopCounterMode sees in a training
    step of tiny-bert (forward and head identical, so the difference is the backward the formula counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    from layersim.compute.flops import layer_shape, training_flops

    model, batch = _model_and_batch(tiny_model_dir, "tiny-bert")
    shape = layer_shape(json.loads((tiny_model_dir("tiny-bert") / "config.json").read_text()))

    def counted(freeze):
        model.zero_grad(set_to_none=True)
        with frozen_layers(model, *freeze) if freeze else contextlib.nullcontext(), FlopCounterMode(display=False) as fc:
            model(**batch).loss.backward()
        return fc.get_total_flops()

    rows, length = batch["input_ids"].shape
    expected = rows * (training_flops(shape, None, 0, length)["backward"]
                       - training_flops(shape, side, k, length)["backward"])
    assert counted(None) - counted((side, k)) == expected > 0


def test_layer_shape_reads_each_family_and_refuses_a_config_without_sizes():
    from layersim.compute.flops import LayerShape, layer_shape

    assert layer_shape({"hidden_size": 32, "num_hidden_layers": 3, "intermediate_size": 64}) == LayerShape(3, 32, 64)
    assert layer_shape({"model_type": "gpt2", "n_embd": 8, "n_layer": 2, "n_inner": None}) == LayerShape(2, 8, 32)
    assert layer_shape({"dim": 8, "n_layers": 2, "hidden_dim": 16}) == LayerShape(2, 8, 16)
    with pytest.raises(LayersimError, match=r"^cannot count the FLOPs of a t5 model: its config has no hidden size, "
                                            r"depth or feed-forward width under the names hidden_size, .*\.$"):
        layer_shape({"model_type": "t5", "d_model": 8})


def test_interleaved_timing_times_every_configuration_on_the_same_batches():
    """A fake clock that each step advances by its configuration's cost: the blocks alternate (reversed every
    other round), all configurations of a round take the same steps, the warm-up round is not counted."""
    from layersim.training.step_timing import interleaved_timing, time_ratios

    now, calls = [0.0], []
    cost = {"unfrozen": 1.0, "bottom1": 0.75, "top1": 0.5}

    def block(name):
        def run(steps):
            calls.append((name, list(steps)))
            now[0] += cost[name] * len(steps) * (2 if steps.start >= 6 else 1)  # a busy spell: round 2 slows all
        return run

    seconds = interleaved_timing({name: block(name) for name in cost}, block=3, rounds=2, clock=lambda: now[0])
    assert calls == [("unfrozen", [0, 1, 2]), ("bottom1", [0, 1, 2]), ("top1", [0, 1, 2]),
                     ("top1", [3, 4, 5]), ("bottom1", [3, 4, 5]), ("unfrozen", [3, 4, 5]),
                     ("unfrozen", [6, 7, 8]), ("bottom1", [6, 7, 8]), ("top1", [6, 7, 8])]
    assert seconds == {"unfrozen": [3.0, 6.0], "bottom1": [2.25, 4.5], "top1": [1.5, 3.0]}
    # The busy round doubles every time but no ratio.
    assert time_ratios(seconds) == {"bottom1": {"time_ratio": 0.75, "steps_per_second_ratio": 1.3333},
                                    "top1": {"time_ratio": 0.5, "steps_per_second_ratio": 2.0}}


def test_time_ratio_is_the_median_over_rounds():
    from layersim.training.step_timing import time_ratios

    seconds = {"unfrozen": [1.0, 1.0, 2.0], "top1": [0.5, 0.9, 1.2]}  # ratios 0.5, 0.9, 0.6
    assert time_ratios(seconds) == {"top1": {"time_ratio": 0.6, "steps_per_second_ratio": 1.6667}}


def test_time_frozen_steps_runs_every_configuration_on_tiny_bert(tiny_model_dir):
    """The real runner: each configuration gets one block per round, and the lengths are those of every
    sequence of the counted batches (the warm-up round's left out). No time is asserted."""
    from layersim.params import FinetuneParams
    from layersim.training.step_timing import time_frozen_steps

    folder, spec = tiny_model_dir("tiny-bert"), get_task("synth-negation")
    encoded = encode_task(generated_table(spec, "train", 12, seed=0), spec, load_tokenizer(folder), 32)
    params = FinetuneParams(batch_size=4, max_steps=6, warmup_steps=0, precision="fp32")
    seconds, lengths = time_frozen_steps(folder, spec, encoded, params, 1, {"bottom1": ("bottom", 1)},
                                         block=2, rounds=2, device=torch.device("cpu"))
    assert set(seconds) == {"unfrozen", "bottom1"} and all(len(s) == 2 and min(s) > 0 for s in seconds.values())
    assert len(lengths) == 4 * 2 * 2 and 4 <= min(lengths) <= max(lengths) <= 32


def test_freeze_timings_name_what_they_measure_and_read_as_less_time():
    from layersim.experiments.freeze import freeze_timings

    seconds = {"unfrozen": [1.0, 1.0], "top1": [0.76, 0.76]}
    timings = freeze_timings(seconds, {"top1": {"time_ratio": 0.76, "steps_per_second_ratio": 1.3158}}, 5)
    assert timings == {"block_steps": 5, "unfrozen": {"block_seconds": [1.0, 1.0]},
                       "top1": {"time_ratio": 0.76, "steps_per_second_ratio": 1.3158,
                                "time_per_step": "\u221224 % time", "block_seconds": [0.76, 0.76]}}


def test_change_label_uses_a_real_minus_for_savings():
    from layersim.reporting.freeze_plots import change_label

    assert change_label(-0.24, "time") == "\u221224 % time"  # "−24 % time": 24 % less, never "+24%"
    assert change_label(0.05, "time") == "+5 % time"
    assert change_label(0.004, "time") == "\u00b10 % time"
    assert change_label(None, "backward FLOPs") == "? backward FLOPs"


# --- the recipe ---

def test_wu_recipe_is_hugging_faces_defaults_in_steps():
    from layersim.params import FinetuneParams
    from layersim.training.recipes import freeze_recipe, recipe_record, wu_steps
    from layersim.training.train import make_optimizer

    finetune = FinetuneParams(batch_size=4, learning_rate=1e-5, warmup_steps=1000, max_steps=10000, weight_decay=0.1,
                              eval_every=1000, max_length=64)
    wu = freeze_recipe("wu", finetune, 2490)
    assert wu_steps(2490) == 3 * 312 and wu_steps(8) == 3
    assert (wu.batch_size, wu.learning_rate, wu.warmup_steps, wu.max_steps, wu.weight_decay, wu.max_grad_norm) == \
           (8, 5e-5, 0, 936, 0.0, 1.0)
    assert (wu.max_length, wu.eval_every, wu.checkpoint_every) == (64, 0, 0)  # tokenization kept; quiet runs
    assert freeze_recipe("finetune", finetune, 2490) == \
           FinetuneParams(batch_size=4, learning_rate=1e-5, warmup_steps=1000, max_steps=10000, weight_decay=0.1,
                          eval_every=0, checkpoint_every=0, max_length=64)
    assert recipe_record("wu", wu)["adam_epsilon"] == 1e-8
    optimizer = make_optimizer(torch.nn.Linear(2, 2), wu)
    assert all(group["eps"] == 1e-8 and group["betas"] == (0.9, 0.999) for group in optimizer.param_groups)
    with pytest.raises(LayersimError, match=r"^unknown freeze recipe 'hf'; valid freeze recipes are: finetune, wu "):
        freeze_recipe("hf", finetune, 10)


def test_train_runs_trains_the_unfrozen_baseline_with_the_same_function_unless_given():
    from layersim.experiments.freeze import FreezeConfig, FreezeRun, train_runs
    from layersim.params import FinetuneParams
    from layersim.training.convergence import check_run
    import logging

    calls = []

    def train_one(config, seed):
        calls.append((None if config is None else config.label, seed))
        return 0.9, check_run("accuracy", 0.9, 0.5, 0.1, 0.69)

    configs = [FreezeConfig("bottom", 1, 4), FreezeConfig("top", 1, 4)]
    log = logging.getLogger("test")
    runs = train_runs(train_one, [1, 2], configs, baselines=None, what="t", finetune=FinetuneParams(), log=log)
    assert calls == [(None, 1), ("bottom1", 1), ("top1", 1), (None, 2), ("bottom1", 2), ("top1", 2)]
    assert [(r.config, r.seed) for r in runs][:1] == [(None, 1)] and len(runs) == 6
    calls.clear()
    given = {1: FreezeRun(None, 1, 0.8), 2: FreezeRun(None, 2, 0.7)}
    runs = train_runs(train_one, [1, 2], configs, baselines=given, what="t", finetune=FinetuneParams(), log=log)
    assert calls == [("bottom1", 1), ("top1", 1), ("bottom1", 2), ("top1", 2)]
    assert runs[:2] == [given[1], given[2]]

    def stuck(config, seed):
        return 0.5, check_run("accuracy", 0.5, 0.5, 0.69, 0.69)

    with pytest.raises(LayersimError, match=r"fine-tuning t seed 1 with nothing frozen did not converge"):
        train_runs(stuck, [1], configs, baselines=None, what="t", finetune=FinetuneParams(require_convergence=True),
                   log=log)


@pytest.mark.parametrize("key, value, message", [
    ("recipe", "hf", "params.yaml: freeze.recipe = 'hf' is invalid; it must be one of wu, finetune."),
    ("timing_steps", 0, "params.yaml: freeze.timing_steps = 0 is invalid; it must be a positive integer."),
])
def test_bad_freeze_params_are_one_sentence(tmp_path, key, value, message):
    import re

    import yaml

    from dvc_project import repository_params
    from layersim.params import load_params

    params = repository_params()
    params["freeze"][key] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(LayersimError, match=f"^{re.escape(message)}$"):
        load_params(tmp_path / "params.yaml")
