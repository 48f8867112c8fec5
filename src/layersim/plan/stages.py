"""Each stage's cost under a params.yaml, before it runs: the rows it processes, the bytes of its DVC outputs (the
workspace copy; the cache's is the plan's business), its FLOPs, and its layer passes: a batch through one layer, a
training step counting three (forward, backward, update), which is what a GPU spends launch time on at small batches.

FLOPs are matmul FLOPs (:func:`layersim.compute.flops.training_flops`: 2 per multiply-add, about 2·params·tokens
forward and 6·params·tokens for a training step, attention's s²·h terms included) over inputs of their task's mean
length (sizes.TaskSize.tokens; batches padded to their longest are not counted longer). The similarity measures
count n·d² per layer pair (cross-covariances), d³ per pair for the CCA family (SVDs), n²·d for RBF CKA, each over
the observed matrix, every permutation of the null and the bootstrap resamples of the diagonals. Metrics and plots
(not DVC-cached, a few MB per task) are left out of the bytes."""

from __future__ import annotations

import math

from layersim.data import disk
from layersim.compute.flops import training_flops
from layersim.models.matrix_roles import MATRIX_TYPES, adapter_roles
from layersim.params.pairs import aligned_pairs, paired_models
from layersim.plan.cost import StageCost
from layersim.plan.measure_costs import (ATTENTION_TERM_FLOPS, attention_measured, attention_partners, host,
                                         measure_flops, measured)
from layersim.plan.lapack import intruder_null_flops, svd_flops, svd_values_flops
from layersim.plan.sizes import ModelSize, TaskSize
from layersim.training.recipes import freeze_recipe



def L(model: ModelSize) -> int:
    return model.shape.num_layers


def forward(model: ModelSize, tokens: float, layers: int | None = None) -> float:
    """Forward FLOPs of one input of `tokens` tokens through `layers` of the model's layers (default: all)."""
    per_layer = training_flops(model.shape, None, 0, max(1, round(tokens)))["forward"] / model.shape.num_layers
    return per_layer * (model.shape.num_layers if layers is None else layers)


def train_step(model: ModelSize, tokens: float, side: str | None = None, k: int = 0) -> float:
    """Forward and backward FLOPs of one training input (the bottom or top k layers frozen, or none)."""
    f = training_flops(model.shape, side, k, max(1, round(tokens)))
    return f["forward"] + f["backward"]


def download(params, model: ModelSize, sizes: dict[str, TaskSize], others: dict[str, ModelSize]) -> StageCost:
    cost = StageCost("download", rows=sum(t.train + t.validation for t in sizes.values()),
                     processes=3 + len(sizes))  # the model, the compared and paired models, each task
    cost.bytes = model.checkpoint_bytes + sum(t.text_bytes for t in sizes.values())
    cost.bytes += sum(others[m].checkpoint_bytes for m in list(params.compare.models) + paired_models(params))
    return cost


def finetune(params, model: ModelSize, task: TaskSize, runs: int, kept_states: bool = True) -> StageCost:
    """`runs` fine-tuning runs of the finetune recipe on one task, evaluated every eval_every steps, each keeping
    finetune.keep_states states unless `kept_states` is False (finetune_pretrained's runs keep none)."""
    f, s = params.finetune, task.tokens(params.finetune.max_length)
    evals = (f.max_steps // f.eval_every if f.eval_every else 0) + 1
    rows = f.max_steps * f.batch_size * task.choices
    val = task.validation * task.choices
    # The kept states (finetune.keep_states): the encoder's weights each, about a checkpoint's bytes.
    states = f.keep_states if kept_states else 0
    return StageCost("finetune", rows=runs * rows, bytes=runs * (1 + states) * model.checkpoint_bytes,
                     flops=runs * (rows * train_step(model, s) + evals * val * forward(model, s)),
                     train_flops=runs * rows * train_step(model, s), processes=runs, **loaded(model, runs),
                     passes=runs * L(model) * (3 * f.max_steps + evals * math.ceil(val / f.eval_batch_size)),
                     compiled_passes=runs * L(model) * 3 * f.max_steps if f.compile != "off" else 0)


def loaded(model: ModelSize, loads: int) -> dict[str, int]:
    return {"loads": loads, "load_bytes": loads * model.checkpoint_bytes}


def bookends(params, tasks: int) -> list[StageCost]:
    """The stages that load no model and compute little: the params gate, finetune_pretrained's process (one a task,
    models or not: the models' runs are counted as finetune's), the summary and the report."""
    return [StageCost("check_params", processes=1), StageCost("finetune_pretrained", processes=tasks),
            StageCost("summary", processes=1), StageCost("report", processes=1)]


def extract_rows(params, task: TaskSize) -> dict[str, int]:
    """Examples extract reads per split, and the validation split's words (the "tokens" pooling's rows)."""
    p = params.extract
    validation = min(task.validation, p.max_examples or task.validation)
    return {"validation": validation, "train": min(task.train, p.max_train_examples or task.train),
            "words": round(validation * task.choices * task.words)}


def extract(params, spec, model: ModelSize, task: TaskSize, head: str) -> StageCost:
    p, s = params.extract, task.tokens(params.finetune.max_length)
    runs = disk.extract_runs(params)
    rows = extract_rows(params, task)
    shape = {"num_layers": model.shape.num_layers, "hidden_size": model.shape.hidden}
    tables = disk.extract_bytes(params, spec, rows, runs, head, shape)
    maps = runs * min(p.attention_examples, rows["validation"]) * task.choices
    attention = disk.attention_bytes(maps, task.square_units(p.attention_unit, params.finetune.max_length),
                                     model.shape.num_layers, model.heads, p.table_precision,
                                     max_units=params.finetune.max_length)
    inputs = (runs * rows["validation"] + (runs - disk.validation_only_runs(params)) * rows["train"]
              ) * task.choices + maps
    return StageCost("extract", rows=disk.extract_rows(params, spec, rows, runs, head), bytes=tables + attention,
                     flops=inputs * forward(model, s), passes=L(model) * math.ceil(inputs / p.batch_size),
                     processes=1, **loaded(model, runs))


def similarity(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Every layer of every run against every other (the stacked matrix), per measure and pooling, over the observed
    matrix and each permutation of the null; the bootstrap resamples of the FT–ORIG and FT[1]–FT[2] diagonals."""
    s = params.similarity
    runs, diagonals = disk.extract_runs(params), 2 + 2 * len(params.finetune.compare_methods)  # LoRA–ORIG, LoRA–FT
    stacked = runs * (model.shape.num_layers + 1)
    pairs, resamples = stacked * (stacked + 1) // 2, diagonals * (model.shape.num_layers + 1) * s.bootstrap
    attention = bool(s.attention_measures and params.extract.attention_examples)
    cost = StageCost("similarity", processes=1, heatmaps=len(s.measures) + bool(s.attention_measures),
                     side_by_side=len(s.measures) + attention)  # experiments.similarity.measure_results
    for pooling, measures in s.measures.items():
        n = pooling_rows(params, task, pooling)
        cost.rows += n
        cost.add(measured(measures, n, model.shape.hidden, pairs, s.permutations, resamples, pooling == "tokens"))
    if attention:
        cost.add(attention_measured(params, model, task, diagonals, fine_tuned_runs(params)))
    return cost


def pooling_rows(params, task: TaskSize, pooling: str) -> int:
    """The rows of one pooling's activation tables: words (at most extract.max_tokens) or examples × choices."""
    rows = extract_rows(params, task)
    return min(params.extract.max_tokens, rows["words"]) if pooling == "tokens" else rows["validation"] * task.choices


def grounding(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Off (grounding.enabled false): a process that records so. On: per pooling and measure (grounding.measures
    beside similarity.measures), the stacked matrix of ORIG, the seeds' runs and the random-init control, observed
    cells only (no null, no resample: the bootstrap resamples the tests' per-run and per-layer scores, not the
    measures), and one figure."""
    if not params.grounding.enabled:
        return StageCost("grounding", processes=1)
    s = params.similarity
    stacked = (1 + len(params.seeds) + (s.random_control is not None)) * (L(model) + 1)
    cost = StageCost("grounding", processes=1, heatmaps=1)
    for pooling, measures in s.measures.items():
        n = pooling_rows(params, task, pooling)
        cost.rows += n
        cost.add(measured(params.grounding.ranked(measures), n, model.shape.hidden, stacked * (stacked + 1) // 2, 0))
    return cost


def weights(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Every layer's six weight matrices (four h × h, f × h, h × f): the pretrained one's SVD once for every run; per
    run, the fine-tuned one's SVD with its singular vectors and the update's spectrum; no example is read. The
    intruder count's null (weights.null_draws per adapted matrix: :func:`intruder_null_flops`) on a full-rank update
    under full fine-tuning, on LoRA's rank-r update of the roles it adapts: a draw with a full-rank update costs
    5 n³ FLOPs on an n × n matrix, 9 n³ on an n × 4n one (its long frame has at most 2n rows), where the SVD with
    vectors counts 26 n³ and 38 n³. All LAPACK in float64 on one thread per matrix, the matrices on torch's threads
    (layersim.experiments.weights)."""
    h, f, k = model.shape.hidden, model.shape.intermediate, params.weights.top_k
    shapes = {role: (h, h) for role in MATRIX_TYPES} | {"intermediate": (f, h), "output": (h, f)}
    lora = params.finetune.lora
    lora_roles = adapter_roles(lora.target_modules)
    methods = [params.finetune.method, *params.finetune.compare_methods]
    once = sum(svd_flops(*shape) for shape in shapes.values())
    per_run = sum(svd_flops(*shape) + svd_values_flops(*shape) for shape in shapes.values())
    null = params.weights.null_draws * sum(
        intruder_null_flops(*shape, min(lora.rank, *shape) if method == "lora" else min(shape), k)
        for method in methods for role, shape in shapes.items() if method != "lora" or role in lora_roles)
    layers, runs = model.shape.num_layers, fine_tuned_runs(params)
    svds, null = layers * (once + runs * per_run), layers * len(params.seeds) * null
    return host(StageCost("weights", flops=svds + null, svd_flops=svds, lapack_flops=null, processes=1,
                          heatmaps=runs, **loaded(model, 1 + runs)), f * h * h)  # a heatmap panel a run


def fine_tuned_runs(params) -> int:
    """Fine-tuning runs per task: each seed's, by finetune.method and by each of finetune.compare_methods."""
    return len(params.seeds) * (1 + len(params.finetune.compare_methods))


def dynamics(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Each seed's kept states run over the validation rows (ORIG's and the final model's are extract's tables), and
    every point's layers against ORIG's and the final model's (linear CKA, its exact null and bootstrap resamples)."""
    n = extract_rows(params, task)["validation"] * task.choices
    states, s = fine_tuned_runs(params) * params.finetune.keep_states, task.tokens(params.finetune.max_length)
    points = fine_tuned_runs(params) * (2 + params.finetune.keep_states)
    pairs = points * 2 * (L(model) + 1) * (1 + params.similarity.bootstrap)
    # Each point against each reference and layer, and its resamples: a measure call each, in float64 on the analysis
    # device (the stage runs under layersim.compute.device.analysis_on); per run a heatmap and a panel of curves.
    measures = pairs * measure_flops("linear_cka", n, model.shape.hidden)
    cost = StageCost("dynamics", rows=states * n, processes=1,
                     **loaded(model, fine_tuned_runs(params) if states else 0),
                     evaluations=pairs, heatmaps=2 * fine_tuned_runs(params),
                     flops=states * n * forward(model, s) + measures, host_flops=measures, analysis_flops=measures,
                     analysis_evaluations=pairs,
                     passes=states * L(model) * math.ceil(n / params.extract.batch_size))
    return cost


def truncate(params, model: ModelSize, task: TaskSize, num_labels: int) -> StageCost:
    """Each seed's model scored once at every exit, and per layer a Tuned and a TunedOrig head trained on the train
    tables for head_epochs: per epoch a step a batch of the examples not held out (truncate.head_holdout), each the
    head's forward and backward (a dense h×h layer and the output layer) and AdamW's update. The heads are small
    training steps (:attr:`StageCost.head_steps`), not layer passes: at batch 64 their products are small and a
    step's dispatch dominates."""
    t, rows, s = params.truncate, extract_rows(params, task), task.tokens(params.finetune.max_length)
    seeds, layers = len(params.seeds), model.shape.num_layers + 1
    h = model.shape.hidden
    examples = rows["train"] - held_out(rows["train"], t.head_holdout)
    heads = seeds * 2 * layers * t.head_epochs  # each head's epochs: every one counted (early stopping ends sooner)
    head_flops = heads * examples * task.choices * 6 * (h * h + h * num_labels)
    val = seeds * rows["validation"] * task.choices
    return StageCost("truncate", rows=val + seeds * rows["train"] * task.choices,
                     flops=val * forward(model, s) + head_flops, head_flops=head_flops,
                     head_steps=heads * math.ceil(examples / t.head_batch_size),
                     passes=L(model) * math.ceil(val / params.extract.batch_size), processes=1,
                     **loaded(model, 2 * seeds),  # each seed's model, and the pretrained one for TunedOrig's head
                     notes=["heads: every epoch of head_epochs counted (early stopping ends sooner)"])


def held_out(examples: int, share: float) -> int:
    """Train examples held out to stop the heads early (layersim.training.heads.held_out_examples' count)."""
    return min(examples - 1, max(1, round(share * examples))) if share > 0 and examples >= 2 else 0


def skipped_layers(num_layers: int) -> int:
    """Layers run to score every contiguous span [i, j] left out (and every exit), as span_logits runs them: one full
    pass keeps the state after each layer, from which a span [i, j] runs only the layers after j (none when j = L:
    the head reads the state): L + Σ over j of j · (L − j), j spans ending at each j."""
    return num_layers + sum(j * (num_layers - j) for j in range(1, num_layers + 1))


def skip(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Each seed's model run on the validation examples with each contiguous span of layers left out."""
    rows, s = extract_rows(params, task), task.tokens(params.finetune.max_length)
    val = len(params.seeds) * rows["validation"] * task.choices
    layers = skipped_layers(model.shape.num_layers)
    return StageCost("skip", rows=val, flops=val * forward(model, s, layers),
                     passes=layers * math.ceil(val / params.extract.batch_size),
                     processes=1, **loaded(model, len(params.seeds)))


def export(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Every exit and skipped span scored on selection_examples train examples and on the validation examples (as
    skip does), then the chosen model written (at most the full model: the layers kept are known only after the run)
    and timed."""
    e, s = params.export, task.tokens(params.finetune.max_length)
    chosen = (min(task.train, e.selection_examples) + extract_rows(params, task)["validation"]) * task.choices
    timed = 2 * 2 * e.timing_repeats * min(e.timing_examples, task.validation) * task.choices
    layers = skipped_layers(model.shape.num_layers)
    return StageCost("export", rows=chosen, bytes=model.checkpoint_bytes,
                     flops=chosen * forward(model, s, layers) + timed * forward(model, s),
                     passes=layers * math.ceil(chosen / params.extract.batch_size),
                     processes=1, **loaded(model, 2),  # a seed's model, and the chosen one read back to be timed
                     notes=["bytes: the full model, an upper bound"])


def align(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Per pair and layer: the closed-form maps (linear, CCA family: n·d² and d³) and the INN and MLP maps' training
    steps; the INN layer × layer matrix; the synthetic recovery check."""
    a, rows, d = params.align, extract_rows(params, task), model.shape.hidden
    n = min(rows["train"] * task.choices, a.train_rows or rows["train"] * task.choices)
    layers, pairs = model.shape.num_layers + 1, len(aligned_pairs(params))
    inn = a.inn_depth * 3 * d * a.inn_hidden
    mlp = d * a.mlp_hidden + (a.mlp_depth - 1) * a.mlp_hidden ** 2 + a.mlp_hidden * d
    closed = sum(2 * n * d * d + d ** 3 if m == "linear" else 4 * n * d * d + 10 * d ** 3
                 for m in a.methods if m not in ("inn", "mlp"))
    trained = a.steps * a.batch_size * 6 * (inn * ("inn" in a.methods) + mlp * ("mlp" in a.methods))
    matrix = layers * layers * a.matrix_steps * a.batch_size * 6 * inn
    synthetic = a.synthetic_steps * a.batch_size * 6 * (inn + mlp)
    # A method's maps of every layer train together (one batched step for all), as does a row of the matrix.
    neural = ("inn" in a.methods) + ("mlp" in a.methods)
    steps = pairs * a.steps * neural + layers * a.matrix_steps + a.synthetic_steps * neural
    depth = 3 * max(a.inn_depth, a.mlp_depth)  # a map's training step: its blocks forward, backward, update
    trained_flops = pairs * layers * trained + matrix + synthetic
    return StageCost("align", rows=pairs * n, flops=pairs * layers * closed + trained_flops, train_flops=trained_flops,
                     map_flops=trained_flops,
                     passes=depth * steps, processes=1,
                     **loaded(model, 1))  # the injection's target model


def freeze(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Per seed of freeze.seeds, a run with the bottom and one with the top k layers frozen for each k of
    freeze.layers (scaled to the depth), and with recipe wu an unfrozen run too; each evaluated once at the end."""
    f, s = params.freeze, task.tokens(params.finetune.max_length)
    recipe = freeze_recipe(f.recipe, params.finetune, task.train)
    seeds = len(f.seeds or params.seeds)
    L = model.shape.num_layers
    configs = [(side, round(k * L / 12)) for k in f.layers for side in ("bottom", "top")]
    if f.recipe == "wu":
        configs.append((None, 0))
    rows = recipe.max_steps * recipe.batch_size * task.choices
    val = task.validation * task.choices
    trained = sum(rows * train_step(model, s, side, k) for side, k in configs)
    evaluated = len(configs) * val * forward(model, s)
    timed_steps = (f.timing_rounds + 1) * f.timing_steps * (len(configs) + 1)
    timing = timed_steps * recipe.batch_size * task.choices * train_step(model, s)
    return StageCost("freeze", rows=seeds * len(configs) * rows, flops=seeds * (trained + evaluated) + timing,
                     train_flops=seeds * trained + timing, processes=1,
                     **loaded(model, seeds * len(configs) + 1),
                     passes=seeds * len(configs) * L * (3 * recipe.max_steps + math.ceil(val / params.finetune.eval_batch_size))
                     + 3 * L * timed_steps,  # the timed steps are eager (layersim.training.step_timing)
                     compiled_passes=seeds * len(configs) * L * 3 * recipe.max_steps if recipe.compile != "off" else 0)


def compare(params, model: ModelSize, tasks: dict[str, TaskSize], others: dict[str, ModelSize]) -> StageCost:
    """probe_examples validation examples of every task through the stacked models (ORIG, the RANDOM control, each
    task's first seed, each compared model), then every measure on the stacked layers with its permutation null and
    a heatmap each."""
    s = params.similarity
    models = [model] * (1 + (s.random_control is not None) + len(tasks)) + [others[n] for n in params.compare.models]
    cost = StageCost("compare", processes=1, heatmaps=sum(map(len, s.measures.values())) + len(s.attention_measures))
    n = words = 0
    for task in tasks.values():
        probe = min(params.compare.probe_examples, task.validation) * task.choices
        n, words = n + probe, words + round(probe * task.words)
        for m in models:
            cost.add(StageCost("compare", rows=probe, flops=probe * forward(m, task.tokens(params.finetune.max_length)),
                               passes=L(m) * math.ceil(probe / params.extract.batch_size)))
    for m in models:
        cost.add(StageCost("compare", **loaded(m, 1 + bool(s.attention_measures))))  # the attention probe loads again
    if s.attention_measures and tasks:  # no known task (a hub task not yet downloaded): nothing to probe yet
        cost.add(compare_attention(params, model, tasks, len(models) - len(params.compare.models)))
    stacked = sum(L(m) + 1 for m in models)
    for pooling, measures in s.measures.items():
        rows = min(params.extract.max_tokens, words) if pooling == "tokens" else n
        # Its null tests every cell of the stacked matrix (layersim.similarity.stacked_results.stacked_result); a word's
        # example moves as one.
        cost.add(measured(measures, rows, model.shape.hidden, stacked * (stacked + 1) // 2, s.permutations,
                          blocks=pooling == "tokens", square=True))
    return cost


def compare_attention(params, model: ModelSize, tasks: dict[str, TaskSize], same_tokenizer: int) -> StageCost:
    """compare's attention probe: the first task's first min(probe_examples, attention_examples) validation examples
    run through each model of `model`'s tokenizer (ORIG, RANDOM, each task's first seed) with their maps kept, and
    each attention measure's stacked matrix of their layers; its null on every cell between two models (each pair of
    examples of equal length its permutations meet, once a cell: measure_costs.attention_partners) and the bootstrap
    of each model's layer k against ORIG's (layersim.similarity.stacked_results.attention_uncertainty)."""
    p, s = params.extract, params.similarity
    task = next(iter(tasks.values()))
    maps = min(params.compare.probe_examples, p.attention_examples, task.validation) * task.choices
    entries = maps * task.square_units(p.attention_unit, params.finetune.max_length)  # (query, key) pairs
    stacked = same_tokenizer * L(model)
    pairs = stacked * (stacked + 1) // 2
    tested = stacked ** 2 - same_tokenizer * L(model) ** 2  # the cells between two models, each way
    diagonals = (same_tokenizer - 1) * L(model) if s.bootstrap else 0
    measures = len(s.attention_measures)
    probe = StageCost("compare", flops=same_tokenizer * maps * forward(model, task.tokens(params.finetune.max_length)),
                      passes=same_tokenizer * L(model) * math.ceil(maps / p.batch_size),
                      evaluations=measures * (pairs + tested * s.permutations + diagonals * s.bootstrap))
    per_entry = sum(ATTENTION_TERM_FLOPS.get(m, ATTENTION_TERM_FLOPS["jensen_shannon"]) for m in s.attention_measures)
    cells = pairs + tested * attention_partners(params, task, maps) + diagonals  # in one cell's terms
    cells_cost = StageCost("compare", flops=cells * model.heads ** 2 * entries * per_entry)
    probe.add(host(cells_cost, entries * model.heads))
    return probe
