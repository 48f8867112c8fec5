"""The plan (python -m layersim.plan, issue 53): its arithmetic on small exact cases, and its bytes per stage against
the outputs the tiny pipeline really writes (within ±30 %)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from dvc_project import repository_params_text, tiny_params
from layersim.data import disk
from layersim.compute.flops import LayerShape
from layersim.data.tasks import get_task
from layersim.params import parse_params
from layersim.plan import __main__ as cli, cache_types, copies, measure_costs, plan, seconds, stages, terms, total
from layersim.plan.sizes import PAPER_TASKS, ModelSize, TaskSize, bert_parameters, model_size, task_size

REPO = Path(__file__).resolve().parents[1]
SMALL = ModelSize(LayerShape(num_layers=2, hidden=4, intermediate=8), heads=2, parameters=1000, tokenizer_bytes=100)


def test_dvc_cache_copies_follow_the_cache_type():
    assert disk.cache_copies(None) == 2                        # DVC's default reflink,copy on ext4: a copy
    assert disk.cache_copies(None, reflinks=True) == 1         # … on XFS or Btrfs: shared blocks
    assert disk.cache_copies("hardlink,symlink") == 1
    assert disk.cache_copies("symlink") == 1
    assert disk.cache_copies("copy") == 2
    assert disk.cache_copies("reflink,copy", reflinks=True) == 1
    # DVC's reflink on a filesystem without reflinks copies without a word (measured on ext4): never a link.
    assert disk.cache_copies("reflink,hardlink,symlink") == 2


def test_the_cache_type_is_read_from_the_dvc_config(tmp_path):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    analytics = false\n")
    assert cache_types(tmp_path) is None
    (tmp_path / ".dvc" / "config.local").write_text("[cache]\n    type = hardlink,symlink\n")
    assert cache_types(tmp_path) == "hardlink,symlink"


def test_word_rows_and_attention_bytes_are_counted_exactly():
    params = parse_params({"model": "tiny-bert", "tasks": ["synth-negation"], "seeds": [1],
                           "finetune": {"max_length": 64}, "similarity": {"random_control": None},
                           "extract": {"max_tokens": 50}})
    spec = get_task("synth-negation")  # poolings cls, mean, tokens; train tables cls and mean
    assert disk.extract_rows(params, spec, {"validation": 10, "train": 20, "words": 30}, 2, "cls") == \
        2 * (10 * 2 + 30) + 2 * 20 * 2  # 30 words, fewer than max_tokens
    assert disk.extract_rows(params, spec, {"validation": 10, "train": 20, "words": 80}, 2, "cls") == \
        2 * (10 * 2 + 50) + 2 * 20 * 2  # capped at max_tokens
    # 3 maps of a mean square of 16 units: 16 rows each, every row 2 layers × 2 heads × 4 bytes and the key column's
    # dictionary index (maps of at most 16 units: 4 bits; the other keys are runs); in float16, 2 bytes a head.
    assert disk.attention_bytes(3, 16, 2, 2, max_units=16) == 3 * 16 * (16 + 0.5)
    assert disk.attention_bytes(3, 16, 2, 2, "float16", max_units=16) == 3 * 16 * (8 + 0.5)
    assert disk.attention_key_bytes(512) == 9 / 8 and disk.attention_key_bytes(1) == 1 / 8


def test_attention_maps_are_counted_by_the_mean_square_of_their_lengths():
    # Counted lengths (the built-in tasks): words kept under max_length, plus the 2 special tokens as units.
    counted = TaskSize(train=1, validation=2, words=3.0, choices=1, text_bytes=0, lengths=(1, 5))
    assert counted.square_units("words", 512) == ((1 + 2) ** 2 + (5 + 2) ** 2) / 2
    assert counted.square_units("tokens", 512) == pytest.approx(((1.3 + 3) ** 2 + (6.5 + 3) ** 2) / 2)
    # Assumed lengths (the paper tasks): exponential about the mean, truncated at max_length; against a sample.
    lengths = np.random.default_rng(0).exponential(40.0, 1_000_000)
    kept = np.minimum(lengths, (128 - 3) / 1.3)
    assumed = TaskSize(train=1, validation=2, words=40.0, choices=1, text_bytes=0)
    assert assumed.square_units("words", 128) == pytest.approx(np.mean((kept + 2) ** 2), rel=5e-3)
    assert assumed.square_units("words", 128) > (40.0 + 2) ** 2  # the square of the mean would count too few


def test_forward_and_training_flops_are_two_and_six_times_params_times_tokens_plus_attention():
    h, f, s = 4, 8, 3
    per_token = 2 * (4 * h * h + 2 * h * f)  # 2 × the layer's weight parameters
    assert stages.forward(SMALL, s) == 2 * (s * per_token + 4 * s * s * h)
    assert stages.forward(SMALL, s, layers=1) == stages.forward(SMALL, s) / 2
    assert stages.train_step(SMALL, s) == 3 * stages.forward(SMALL, s)  # the embeddings train: every gradient
    assert stages.train_step(SMALL, s, "bottom", 2) == stages.forward(SMALL, s)  # all frozen: no backward


def test_skipped_spans_run_only_the_layers_after_the_span_from_one_full_pass():
    for L in (1, 3, 12):
        spans = [(i, j) for i in range(1, L + 1) for j in range(i, L + 1)]  # [i, j] skipped, 1-based
        assert stages.skipped_layers(L) == L + sum(L - j for i, j in spans)
    assert stages.skipped_layers(6) == 6 + 35


def test_finetune_and_extract_costs_on_a_small_exact_case():
    params = parse_params({"model": "tiny-bert", "tasks": ["synth-negation"], "seeds": [1, 2],
                           "finetune": {"max_steps": 6, "warmup_steps": 2, "batch_size": 8, "eval_every": 3, "eval_batch_size": 4,
                                        "max_length": 32},
                           "extract": {"max_train_examples": 10, "attention_examples": 0, "batch_size": 5},
                           "similarity": {"attention_measures": []}})
    task = TaskSize(train=100, validation=7, words=4.0, choices=1, text_bytes=0)
    s = task.tokens(32)
    assert s == 4 * 1.3 + 3
    cost = stages.finetune(params, SMALL, task, runs=2)
    assert cost.rows == 2 * 6 * 8
    assert cost.flops == 2 * (48 * stages.train_step(SMALL, s) + 3 * 7 * stages.forward(SMALL, s))
    assert cost.bytes == 2 * (1000 * 4 + 100)
    assert cost.passes == 2 * 2 * (3 * 6 + 3 * 2)  # 2 layers; 6 steps of 3 passes, 3 evaluations of 2 batches
    extract = stages.extract(params, get_task("synth-negation"), SMALL, task, "cls")
    runs = 4  # orig, two seeds, the random control
    assert extract.flops == (runs * 7 + 3 * 10) * stages.forward(SMALL, s)
    # The default, extract.table_precision auto: example rows float16, the 28 word rows a run 24-bit integers.
    assert extract.bytes == disk.table_bytes(runs * 7 * 2 + 3 * 10 * 2, 2, 4, "float16") + \
        disk.table_bytes(runs * 28, 2, 4, "int24")


def test_the_tiny_models_parameters_are_counted_from_their_shape(tiny_model_dir):
    weights = (tiny_model_dir("tiny-bert") / "model.safetensors").stat().st_size
    counted = model_size("tiny-bert").parameters * 4
    assert abs(counted - weights) / weights < 0.01
    assert bert_parameters(LayerShape(12, 768, 3072), 50265, 514) == pytest.approx(124_645_632, rel=0.01)


def test_the_paper_configuration_plan_counts_the_published_sizes():
    # params.yaml as committed: quickstart.sh and smallest.sh leave their experiment's values in the working tree.
    params = parse_params(yaml.safe_load(repository_params_text()))
    assert task_size(params, "mnli").train == PAPER_TASKS["mnli"][0]
    costs = {c.stage: c for c in plan(params, REPO)}
    # MNLI's train tables: ORIG and two seeds, cls and mean, 13 layers of 768 floats, 20,000 examples (the cap), float16
    # (auto's example rows).
    mnli = get_task("mnli")
    assert params.extract.max_train_examples == 20_000 and params.extract.table_precision == "auto"
    assert disk.table_bytes(20_000 * 6, 12, 768, "float16") == 20_000 * 6 * 13 * 768 * 2
    assert costs["extract"].bytes > disk.table_bytes(20_000 * 6, 12, 768, "float16")
    # Issues 53 and 61: the default needs at most 150 GB in all, DVC's cache included (.dvc/config links it), with
    # the two seeds of Phang et al. and with the three that intervals over seeds need.
    assert copies(REPO) == 1 and total(list(costs.values())).bytes <= 150e9
    three = parse_params({**yaml.safe_load(repository_params_text()), "seeds": [1, 2, 3]})
    assert total(plan(three, REPO)).bytes <= 150e9
    assert costs["finetune"].bytes == 24 * model_size("roberta-base").checkpoint_bytes
    download = terms(costs["download"], cli.device("h100"))  # nothing computed: its processes' starts only
    assert mnli.num_choices == 0 and download["compute"] == download["passes"] == 0 and download["start"] > 0


def test_the_cli_applies_dvc_style_overrides(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(repository_params_text())
    doc = cli.overridden(params, ["model=tiny-bert", "tasks=[synth-choice]", "finetune.max_steps=7"])
    assert doc["model"] == "tiny-bert" and doc["tasks"] == ["synth-choice"] and doc["finetune"]["max_steps"] == 7
    assert cli.main(["--params", str(params), "--root", str(tmp_path), "--device", "h100", "-S", "model=tiny-bert",
                     "-S", "finetune.max_length=64", "-S", "tasks=[synth-choice]"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("layersim plan: tiny-bert, 1 task(s)") and "not measured on an H100" in out
    assert cli.main(["--params", str(params), "--gpus", "0"]) == 1
    assert cli.main(["--params", str(params), "-S", "model"]) == 1


# Stages whose DVC-cached outputs the plan predicts, and the dvc.lock stages that write them. The others (similarity,
# compare, truncate, skip, align, freeze, summary, report) write only metrics and plots, which DVC does not cache
# and the plan does not model (a few MB a task, nothing at the paper configuration's scale).
MEASURED = {"download": ("download_model", "download_compared", "download_paired", "download_task"),
            "finetune": ("finetune@",), "finetune_compared": ("finetune_compared@",),
            "finetune_pretrained": ("finetune_pretrained",), "extract": ("extract",),
            "export": ("export",)}


@pytest.mark.integration
def test_the_plans_bytes_match_the_tiny_pipelines_outputs(tmp_path_factory, built_projects):
    from dvc_project import built_project, configure_pipeline
    from dvc_yaml import lock_path

    root = tmp_path_factory.mktemp("plan")
    built_project(built_projects, root, configure_pipeline, "pipeline")
    params = parse_params(yaml.safe_load((root / "params.yaml").read_text()))
    predicted = {c.stage: c.bytes for c in plan(params, tmp_path_factory.mktemp("before-the-run"))}
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    measured = {stage: sum(out["size"] for name, entry in lock.items() if name.startswith(prefixes)
                           for out in entry.get("outs", []) if lock_path(out["path"]).startswith("data/"))
                for stage, prefixes in MEASURED.items()}
    ratios = {stage: predicted[stage] / measured[stage] for stage in MEASURED}
    print(json.dumps({stage: [predicted[stage], measured[stage], round(r, 3)] for stage, r in ratios.items()}))
    assert all(0.7 <= r <= 1.3 for r in ratios.values()), ratios


def test_the_time_model_adds_one_reasoned_term_each():
    from layersim.plan import timing

    on = timing.Device("cpu", flops=100e9, pass_seconds=1e-3, cpu_flops=50e9, basis="given", train_efficiency=0.5,
                       forward_efficiency=0.8, bandwidth=1e9, cpu_thread_flops=25e9)
    cost = stages.StageCost("finetune", flops=30e9, train_flops=20e9, passes=100, processes=2, loads=2,
                            load_bytes=10**9)
    assert terms(cost, on) == pytest.approx({
        "start": 2 * timing.START_SECONDS["model"],  # two processes, each importing the model stack
        "loads": 2 * timing.FIRST_LOAD_SECONDS + 2 * timing.LOAD_SECONDS + 1.0,  # 1 GB at 1 GB/s
        "compute": 20e9 / (0.5 * 100e9) + 10e9 / (0.8 * 100e9), "passes": 0.1, "heads": 0.0,
        "evaluations": 0.0})
    # numpy on the host: large products on its threads, small ones (below SMALL_PRODUCT) on one.
    numeric = stages.StageCost("similarity", flops=75e9, host_flops=75e9, small_flops=25e9, processes=1,
                               evaluations=1000, heatmaps=2)
    assert terms(numeric, on) == pytest.approx({"start": timing.START_SECONDS["numeric"], "loads": 0.0, "compute": 2.0,
                                                "passes": 0.0, "heads": 0.0,
                                                "evaluations": 1000 * timing.EVALUATION_SECONDS
                                                + 2 * timing.HEATMAP_SECONDS})
    # The nulls' engines on a CPU: float64 batched products, and the kernel engine's gathers, each at its measured
    # share of the host's FLOP/s.
    engines = stages.StageCost("similarity", flops=30e9, host_flops=30e9, analysis_flops=30e9, kernel_flops=10e9)
    assert terms(engines, on)["compute"] == pytest.approx(20e9 / (50e9 * timing.CPU_ENGINE_EFFICIENCY)
                                                          + 10e9 / (50e9 * timing.CPU_KERNEL_EFFICIENCY))
    big, small = measure_costs.measured(["svcca"], 20_000, 768, 10, 0), measure_costs.measured(["svcca", "linear_cka"], 600, 384, 10, 5)
    # …except the nulls' engines, which multiply a batch of permutations of the whole stack at once (torch's threads).
    assert big.host_flops == big.flops > 0 == big.small_flops and small.analysis_flops > 0
    assert small.small_flops == small.flops - small.analysis_flops
    assert small.evaluations == 10 * 6 + 10  # linear CKA's null is exact: its observed cells only
    assert seconds(numeric, on) == pytest.approx(sum(terms(numeric, on).values()))


def test_python_level_work_scales_with_the_machines_probe_and_arithmetic_does_not():
    """Issue 64: on a slower CPU the plan's process starts, loads' fixed part, cells and heatmaps took longer than the
    reference CPU's constants said; a CPU plan scales them by its probe of Python-level work (python_scale), the
    matmul-bound compute by the measured FLOP/s only."""
    from dataclasses import replace

    from layersim.plan import timing

    on = timing.Device("cpu", flops=100e9, pass_seconds=1e-3, cpu_flops=50e9, basis="given", bandwidth=1e9,
                       cpu_thread_flops=25e9)
    slower = replace(on, python_scale=1.5)
    cost = stages.StageCost("similarity", flops=75e9, host_flops=75e9, processes=1, loads=2, load_bytes=10**9,
                            evaluations=1000, heatmaps=2)
    base, scaled = terms(cost, on), terms(cost, slower)
    assert scaled["start"] == pytest.approx(1.5 * base["start"]) and scaled["compute"] == base["compute"]
    assert scaled["evaluations"] == pytest.approx(1.5 * base["evaluations"])
    assert scaled["loads"] - 1.0 == pytest.approx(1.5 * (base["loads"] - 1.0))  # the 1 GB read at 1 GB/s is not scaled
    measured = timing.device("cpu")  # the probe ran, and scaled the CPU's layer pass with the rest
    assert measured.python_scale > 0 and measured.pass_seconds == pytest.approx(timing.CPU_PASS_SECONDS
                                                                                * measured.python_scale)
    assert timing.device("cpu", flops=1e11).python_scale == 1.0  # a given throughput: the reference's constants


def test_small_products_of_pieces_side_by_side_reach_the_hosts_threads_at_their_sustained_share():
    """The similarity stage runs its poolings and its attention section side by side, one thread each
    (layersim.compute.threads): their small products reach min(pieces, threads) one-thread rates, each at
    CPU_THREAD_SCALING; one piece, or one thread, keeps one rate."""
    from dataclasses import replace

    from layersim.plan import timing

    on = timing.Device("cpu", flops=100e9, pass_seconds=1e-3, cpu_flops=50e9, basis="given", cpu_thread_flops=25e9,
                       threads=2)
    alone = stages.StageCost("similarity", flops=25e9, host_flops=25e9, small_flops=25e9)
    beside = replace(alone, side_by_side=3)
    assert terms(alone, on)["compute"] == pytest.approx(1.0)
    assert terms(beside, on)["compute"] == pytest.approx(1.0 / (2 * timing.CPU_THREAD_SCALING))
    assert terms(beside, replace(on, threads=1))["compute"] == pytest.approx(1.0)
    # Tasks run one after another in one process: adding their costs keeps the pieces of one, not their sum.
    total_cost = stages.StageCost("similarity")
    total_cost.add(beside)
    total_cost.add(beside)
    assert total_cost.side_by_side == 3


def test_aligns_maps_train_at_their_own_share_of_the_rate_and_the_rest_at_the_models():
    """align's INN and MLP maps (vmapped steps of small nets on stored rows) reach CPU_MAP_EFFICIENCY of the matmul,
    a model's training steps CPU_TRAIN_EFFICIENCY; the plan counts every map step of the stage there."""
    from layersim.plan import timing

    on = timing.device("cpu", flops=100e9)
    assert on.map_efficiency == timing.CPU_MAP_EFFICIENCY < on.train_efficiency
    cost = stages.StageCost("align", flops=30e9, train_flops=30e9, map_flops=10e9)
    assert terms(cost, on)["compute"] == pytest.approx(20e9 / (on.train_efficiency * 100e9)
                                                       + 10e9 / (timing.CPU_MAP_EFFICIENCY * 100e9))
    params = parse_params(yaml.safe_load(repository_params_text()))
    align = stages.align(params, SMALL, task_size(params, "synth-similarity"))
    assert align.map_flops == align.train_flops > 0


def test_the_sustained_cpu_rate_is_a_windows_mean_at_most_the_threads_one_thread_rates():
    """A 2-core VM's single two-thread products swing 97-179 GFLOP/s from second to second: the plan takes the mean
    rate of products back to back over a window, never more than threads × the one-thread rate."""
    import torch

    from layersim.plan import machine

    threads = torch.get_num_threads()
    assert machine.sustained_cpu_flops(1e6, threads=2, seconds=0.1) == pytest.approx(2 * 1e6)  # the cap
    assert machine.sustained_cpu_flops(1e15, threads=1, seconds=0.1) > 1e8  # uncapped: a real matmul's rate
    assert torch.get_num_threads() == threads  # torch's threads restored


@pytest.mark.parametrize("n, layers, d", [(600, 35, 384), (60, 15, 32), (20_000, 26, 768), (300, 7, 384),
                                          (5000, 4, 16)])
def test_the_plan_counts_a_cka_null_where_its_engine_runs_it(n, layers, d):
    """Linear CKA's null over the quickstart's 600 word rows runs on the 35 stacked layers' kernels, about 70 times
    fewer FLOPs than their features: the plan counted the features and put similarity at 10 minutes (issue 64)."""
    from layersim.similarity.inference._null_engines import _use_gram

    assert measure_costs.null_uses_gram(n, layers, d) == _use_gram("auto", n, [d] * layers, [d] * layers, layers, layers)
    pairs = layers * (layers + 1) // 2
    on_kernels = measure_costs.null_flops("linear_cka", n, d, pairs)
    assert on_kernels <= pairs * measure_costs.measure_flops("linear_cka", n, d) * 2  # never above the feature engine's
    if measure_costs.null_uses_gram(n, layers, d):
        assert on_kernels == (layers ** 2 + measure_costs.GATHER_MULTIPLY_ADDS * layers) * n * n  # upper triangles
    assert measure_costs.null_flops("svcca", n, d, pairs) == measure_costs.engine_blocks(layers) * measure_costs.measure_flops("svcca", n, d)


@pytest.mark.parametrize("layers", [1, 2, 4, 7, 21])
def test_the_plan_counts_the_blocks_the_product_engine_multiplies(monkeypatch, layers):
    """A product engine multiplies a row's layer against every column at once where its cells cover half of them,
    else cell by cell: the blocks the plan counts per permutation are the ones its products hold."""
    import torch

    from layersim.similarity.comparisons import stacked_null
    from layersim.similarity.inference import _device_engines

    rng = np.random.default_rng(0)
    width, multiplied = 3, []

    class Counting:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def matmul(a, b):
            multiplied.append(b.shape[-1] // width)  # the columns of the y stack in this product, in layers
            return torch.matmul(a, b)

    monkeypatch.setattr(_device_engines, "torch", Counting())
    layers_of = [rng.standard_normal((40, width)) for _ in range(layers)]
    cells = np.triu(np.ones((layers, layers), bool))
    multiplied.clear()
    stacked_null("neuronsim", {"a": layers_of}, permutations=1, seed=0, cells=cells)
    assert sum(multiplied) == 2 * measure_costs.engine_blocks(layers)  # the observed matrix, then the one permutation


@pytest.mark.parametrize("n, d", [(30, 384), (481, 384), (600, 384), (20_000, 768), (11, 4), (2, 8)])
def test_the_cca_familys_bases_are_as_wide_as_its_dimension_cap(n, d):
    from layersim.similarity._cca_core import dimension_cap

    assert measure_costs.cca_dimensions(n, d) == min(d, dimension_cap(n))


def test_truncate_counts_every_heads_training_steps_on_the_rows_not_held_out():
    """Each seed's Tuned and TunedOrig head on every layer trains head_epochs epochs of batches of the train examples
    that layersim.training.heads holds out none of: small steps, each its dispatch and its products (issue 64: one
    layer pass a step put truncate at half its time)."""
    import math

    from layersim.plan import timing
    from layersim.training.heads import held_out_examples

    doc = tiny_params(yaml.safe_load(repository_params_text()), tasks=["synth-similarity"], seeds=[1, 2, 3])
    doc["truncate"].update(head_epochs=4, head_batch_size=16, head_holdout=0.1)
    params = parse_params(doc)
    cost = {c.stage: c for c in plan(params, REPO)}["truncate"]
    model, task = model_size(params.model, REPO), task_size(params, "synth-similarity", REPO)
    train = stages.extract_rows(params, task)["train"]
    kept = train - len(held_out_examples(train, 0.1, seed=1))
    layers = model.shape.num_layers + 1
    assert cost.head_steps == 3 * 2 * layers * 4 * math.ceil(kept / 16)
    h = model.shape.hidden
    assert cost.head_flops == 3 * 2 * layers * 4 * kept * 6 * (h * h + h * get_task("synth-similarity").num_labels)
    on = timing.device("cpu", flops=1e11, python_scale=2.0)
    assert terms(cost, on)["heads"] == pytest.approx(cost.head_steps * 2.0 * timing.CPU_HEAD_STEP_SECONDS
                                                     + cost.head_flops / (1e11 * timing.CPU_HEAD_EFFICIENCY))


def test_every_stage_process_of_the_tiny_pipeline_is_counted():
    """One process per stage and matrix item, as dvc.yaml runs them (the time of a tiny run is mostly their starts)."""
    doc = tiny_params(yaml.safe_load(repository_params_text()), tasks=["synth-negation", "synth-similarity"],
                      seeds=[1, 2, 3])
    params = parse_params(doc)
    processes = {c.stage: c.processes for c in plan(params, REPO)}
    assert processes == {"check_params": 1, "download": 3 + 2, "finetune": 6, "finetune_pretrained": 2, "extract": 2,
                         "similarity": 2, "grounding": 2, "compare": 1, "truncate": 2, "skip": 2, "export": 2,
                         "align": 2, "freeze": 2, "weights": 2, "dynamics": 2, "summary": 1, "report": 1}


def test_grounding_off_costs_a_process_and_on_the_observed_stacked_matrices_of_its_runs():
    """Off (the default): a process that records so. On: every measure's stacked matrix of ORIG, the seeds and the
    random-init control once (no null, no resample), per pooling."""
    doc = tiny_params(yaml.safe_load(repository_params_text()), tasks=["synth-similarity"], seeds=[1, 2, 3])
    off = {c.stage: c for c in plan(parse_params(doc), REPO)}["grounding"]
    assert (off.processes, off.flops, off.evaluations) == (1, 0.0, 0)
    doc["grounding"]["enabled"] = True
    params = parse_params(doc)
    on = {c.stage: c for c in plan(params, REPO)}["grounding"]
    model = model_size(params.model, REPO)
    stacked = (1 + 3 + 1) * (model.shape.num_layers + 1)  # ORIG, three seeds, RANDOM (similarity.random_control: 0)
    measures = sum(len(m) for m in params.similarity.measures.values())
    assert on.evaluations == measures * stacked * (stacked + 1) // 2 and on.analysis_evaluations == 0
    assert on.processes == 1 and on.flops > 0
    # grounding.measures: each pooling's matrices once more per measure not already among its similarity.measures
    doc["grounding"]["measures"] = ["cknna", "linear_cka"]
    wider = {c.stage: c for c in plan(parse_params(doc), REPO)}["grounding"]
    added = sum(len({"cknna", "linear_cka"} - set(m)) for m in params.similarity.measures.values())
    assert added > 0 and wider.evaluations == (measures + added) * stacked * (stacked + 1) // 2


def test_the_weights_stage_counts_its_svds_once_per_pretrained_matrix_and_its_null_per_draw():
    """The intruder null's FLOPs on exact cases (a draw on n × n with a full-rank update: two n × n Householder frames
    at 4/3 n³, the Gram matrix n³, eigh's tridiagonalisation 4/3 n³, the k cosines 4 n² k: 5 n³ + 4 n² k), linear in
    weights.null_draws and at LAPACK's efficiency; the pretrained SVDs counted once, whatever the seeds; LoRA's
    rank-r null on its two roles far below full fine-tuning's six full-rank ones."""
    from layersim.plan import lapack, timing

    n, k = 384, 10
    assert lapack.intruder_null_flops(n, n, n, k) == pytest.approx(5 * n ** 3 + 4 * n * n * k)
    # 1536 × 384: the long frame's 384 + 384 rows by Cholesky QR, the (2n × n) Gram matrix.
    assert lapack.intruder_null_flops(4 * n, n, n, k) == pytest.approx(
        4 / 3 * n ** 3 + (2 * 2 * n * n * n + n ** 3 / 3) + 2 * n ** 3 + 4 / 3 * n ** 3 + 8 * n * n * k)
    assert lapack.intruder_null_flops(n, 4 * n, n, k) == lapack.intruder_null_flops(4 * n, n, n, k)

    def cost(**weights):
        doc = tiny_params(yaml.safe_load(repository_params_text()), tasks=["synth-similarity"], seeds=[1, 2, 3])
        doc["weights"].update(weights)
        params = parse_params(doc)
        return stages.weights(params, model_size(params.model, REPO), task_size(params, params.tasks[0], REPO)), params

    none, params = cost(null_draws=0)
    twenty, _ = cost(null_draws=20)
    forty, _ = cost(null_draws=40)
    assert none.lapack_flops == 0 < twenty.lapack_flops and forty.lapack_flops == pytest.approx(2 * twenty.lapack_flops)
    assert twenty.svd_flops == none.svd_flops and twenty.flops == twenty.svd_flops + twenty.lapack_flops
    shape = model_size(params.model, REPO).shape
    h, f = shape.hidden, shape.intermediate
    per_draw = 4 * lapack.intruder_null_flops(h, h, h, k) + 2 * lapack.intruder_null_flops(f, h, h, k)
    assert twenty.lapack_flops == pytest.approx(20 * 3 * shape.num_layers * per_draw)
    once = 4 * lapack.svd_flops(h, h) + 2 * lapack.svd_flops(f, h)
    per_run = 4 * (lapack.svd_flops(h, h) + lapack.svd_values_flops(h, h)) + \
        2 * (lapack.svd_flops(f, h) + lapack.svd_values_flops(f, h))
    assert none.svd_flops == pytest.approx(shape.num_layers * (once + 3 * per_run))
    on = timing.Device("cpu", flops=1e11, pass_seconds=1e-3, cpu_flops=1e11, basis="given", cpu_thread_flops=1e11)
    extra = terms(twenty, on)["compute"] - terms(none, on)["compute"]
    assert extra == pytest.approx(twenty.lapack_flops / (1e11 * timing.LAPACK_EFFICIENCY))
    doc = tiny_params(yaml.safe_load(repository_params_text()), tasks=["synth-similarity"], seeds=[1, 2, 3])
    doc["weights"]["null_draws"] = 20
    doc["finetune"].update(method="lora")
    lora = parse_params(doc)
    lora_cost = stages.weights(lora, model_size(lora.model, REPO), task_size(lora, lora.tasks[0], REPO))
    assert 0 < lora_cost.lapack_flops < twenty.lapack_flops / 3


def test_the_nulls_permutations_are_the_analysis_engines_and_blocks_sample_linear_cka():
    from layersim.similarity.inference.exchangeability import LINEAR_CKA_BLOCK_PERMUTATIONS

    assert measure_costs.LINEAR_CKA_BLOCK_PERMUTATIONS == LINEAR_CKA_BLOCK_PERMUTATIONS  # the plan's copy (it imports no torch)
    plain = measure_costs.measured(["linear_cka", "svcca"], 600, 384, 10, 5, resamples=3)
    words = measure_costs.measured(["linear_cka", "svcca"], 600, 384, 10, 5, resamples=3, blocks=True)
    svcca, cka = measure_costs.measure_flops("svcca", 600, 384), measure_costs.measure_flops("linear_cka", 600, 384)
    # Each permutation of each pair is one engine cell; the observed cells and resamples stay on the host.
    blocks = measure_costs.engine_blocks(4)  # the 10 pairs of 4 stacked layers, as the product engine multiplies them
    assert plain.analysis_evaluations == 10 * 5 and plain.analysis_flops == pytest.approx(blocks * 5 * svcca)
    # Linear CKA's permutations on the kernels are one gather and one product for all cells: no cell's own work.
    assert words.analysis_evaluations == 10 * 5 and words.kernel_flops > 0 == plain.kernel_flops
    # Linear CKA's permutations on these 4 stacked layers run on their kernels (the engine's choice): fewer FLOPs.
    on_kernels = measure_costs.null_flops("linear_cka", 600, 384, 10)
    assert measure_costs.null_uses_gram(600, 4, 384) and on_kernels < 10 * cka
    assert words.analysis_flops == pytest.approx(blocks * 5 * svcca + LINEAR_CKA_BLOCK_PERMUTATIONS * on_kernels)
    assert words.kernel_flops == pytest.approx(LINEAR_CKA_BLOCK_PERMUTATIONS * on_kernels)
    # compare's null tests every cell of the 4 × 4 stacked matrix (a measure is not symmetric in general).
    square = measure_costs.measured(["neuronsim"], 600, 384, 10, 5, square=True)
    neuronsim = measure_costs.measure_flops("neuronsim", 600, 384)
    assert square.analysis_evaluations == 16 * 5 and square.analysis_flops == pytest.approx(16 * 5 * neuronsim)
    assert words.evaluations == words.analysis_evaluations + 2 * (10 + 3)


def test_a_gpu_plan_runs_the_engines_on_the_device_and_says_unmeasured_where_no_figure_was_measured(tmp_path):
    from layersim.plan import timing

    cost = measure_costs.measured(["svcca"], 10_000, 768, 100, 100)
    cost.processes, cost.stage = 1, "similarity"
    unmeasured = timing.device("h200")
    assert unmeasured.analysis_flops.value is None  # gpu_figures.json as committed: never measured on an H200
    assert seconds(cost, unmeasured) is None and terms(cost, unmeasured)["analysis"] is None
    known = timing.known_seconds(cost, unmeasured)
    assert 0 < known < seconds(cost, timing.device("cpu", flops=1e12))  # only the host part is counted
    figures = json.loads(timing.FIGURES_FILE.read_text())
    figures["h200"]["analysis_flops"] = {"value": 5e13, "measured": "2026-12-01"}
    figures["h200"]["analysis_cell_seconds"] = {"value": 1e-5, "measured": "2026-12-01"}
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(figures))
    measured = timing.Figure(5e13, "2026-12-01"), timing.Figure(1e-5, "2026-12-01")
    on = timing.Device("h200", 150e12, 0.8e-3, 1e12, "test", analysis_flops=measured[0],
                       analysis_cell_seconds=measured[1], cpu_thread_flops=1e11)
    assert timing.gpu_figures(path)["h200"]["analysis_flops"]["value"] == 5e13
    assert terms(cost, on)["analysis"] == pytest.approx(cost.analysis_flops / 5e13 + 100 * 100 * 1e-5)
    assert seconds(cost, on) == pytest.approx(known + terms(cost, on)["analysis"])  # the host part as before
    assert timing.where(cost, on) == "device+host" and timing.where(cost, timing.device("cpu", flops=1e12)) == "host"


def test_the_cli_prints_where_each_stage_runs_and_its_time_on_several_devices(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(repository_params_text())
    assert cli.main(["--params", str(params), "--root", str(tmp_path), "--device", "h200", "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    header, rows = out.splitlines()[1], {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert "runs on" in header and "on 4 devices" in header
    assert "unmeasured" in rows["similarity"] and "device+host" in rows["similarity"]
    assert "≥" in rows["total"] and "unmeasured: similarity, compare" in out


@pytest.mark.parametrize("items, workers, wall", [([5, 3, 3, 2], 2, 7), ([4, 4, 4], 3, 4), ([4, 4, 4], 1, 12),
                                                  ([10, 1, 1], 8, 10)])
def test_a_stages_tasks_spread_over_devices_longest_first(items, workers, wall):
    from layersim.plan import makespan

    assert makespan(items, workers) == wall


def test_the_stage_items_add_up_to_the_plan():
    from layersim.plan import plan_items

    params = parse_params(yaml.safe_load(repository_params_text()))
    items, costs = plan_items(params, REPO), {c.stage: c for c in plan(params, REPO)}
    assert list(items) == list(costs)
    assert len(items["finetune"]) == len(params.tasks) * len(params.seeds)  # finetune@task-seed
    for stage, parts in items.items():
        assert sum(p.flops for p in parts) == pytest.approx(costs[stage].flops)
        assert sum(p.bytes for p in parts) == costs[stage].bytes


def test_compiled_training_passes_take_the_gpus_compiled_figure_where_measured_and_the_eager_one_until_then():
    from layersim.plan import timing

    doc = yaml.safe_load(repository_params_text())
    params, off = parse_params(doc), parse_params(doc | {"finetune": doc["finetune"] | {"compile": "off"}})
    size, task = model_size("roberta-base"), task_size(params, "rte")
    cost, eager = stages.finetune(params, size, task, runs=2), stages.finetune(off, size, task, runs=2)
    layers = size.shape.num_layers
    assert cost.compiled_passes == 2 * layers * 3 * params.finetune.max_steps and eager.compiled_passes == 0
    assert cost.passes == eager.passes  # the same passes, some of them compiled
    unmeasured = timing.device("h200")
    assert unmeasured.compiled_pass_seconds.value is None  # gpu_figures.json as committed
    assert terms(cost, unmeasured)["passes"] == terms(eager, unmeasured)["passes"]  # the eager pass stands in
    on = timing.Device("h200", 150e12, 0.8e-3, 1e12, "test", compiled_pass_seconds=timing.Figure(0.2e-3, "2026-12-01"))
    assert terms(cost, on)["passes"] == pytest.approx(cost.passes * 0.8e-3 - cost.compiled_passes * 0.6e-3)
    assert terms(eager, on)["passes"] == pytest.approx(eager.passes * 0.8e-3)
    assert terms(cost, timing.device("cpu", flops=1e11))["passes"] == terms(eager, timing.device("cpu", flops=1e11))["passes"]


def test_the_attention_similarities_their_null_and_intervals_are_counted():
    """The similarity stage's attention work: off without attention measures (or maps); the observed stacked matrix,
    the null of the reported cells (each pair of examples of equal length once a cell, at most one a permutation)
    and the bootstrap, growing with the permutations and with the maps' examples."""
    doc = tiny_params(yaml.safe_load(repository_params_text()))

    def attention(**similarity) -> stages.StageCost:
        changed = json.loads(json.dumps(doc))
        changed["similarity"].update(similarity)
        params = parse_params(changed)
        return measure_costs.attention_measured(params, model_size(params.model, REPO),
                                                task_size(params, "synth-negation", REPO), 2, stages.fine_tuned_runs(params))

    without = {c.stage: c for c in plan(parse_params(json.loads(json.dumps(doc)) | {
        "similarity": doc["similarity"] | {"attention_measures": []}}), REPO)}["similarity"]
    with_maps = {c.stage: c for c in plan(parse_params(doc), REPO)}["similarity"]
    added = attention()
    assert with_maps.flops == pytest.approx(without.flops + added.flops) and added.flops > 0
    # a pair of examples' terms once a cell: past the examples a length shares, more permutations add no arithmetic
    assert attention(permutations=20, bootstrap=0).flops < attention(permutations=20).flops
    assert attention(permutations=20).flops < attention(permutations=100).flops
    assert attention(permutations=5000).flops == pytest.approx(attention(permutations=10000).flops, rel=1e-9)
    # per permutation one Python-level cell of each reported comparison: evaluations grow by permutations × cells
    layers = model_size(parse_params(doc).model, REPO).shape.num_layers
    assert attention(permutations=21).evaluations - attention(permutations=20).evaluations == \
        (4 + 2) * layers ** 2  # FT–ORIG, FT–FT, ORIG–ORIG, FT[1]–FT[2] and the two RANDOM comparisons
    assert attention(attention_measures=["linear_cka"]).analysis_flops > 0  # an array measure: the engines


def test_compare_is_planned_without_a_known_task():
    """A hub task not yet downloaded has no size: compare's plan then counts the loads, not the attention probe (it
    used to stop the params check with a StopIteration)."""
    params = parse_params(tiny_params(yaml.safe_load(repository_params_text())))
    assert params.similarity.attention_measures
    cost = stages.compare(params, model_size(params.model, REPO), {}, {})
    assert cost.loads > 0 and cost.passes == 0 == cost.rows
