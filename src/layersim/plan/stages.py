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
from layersim.plan.lapack import intruder_null_flops, svd_flops, svd_values_flops
from layersim.plan.sizes import ModelSize, TaskSize
from layersim.training.recipes import freeze_recipe

CCA_FAMILY = ("svcca", "pwcca", "mean_cca")


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


EXACT_NULL = ("linear_cka",)  # its null's moments are exact (layersim.similarity.inference.null): no permutations
LINEAR_CKA_BLOCK_PERMUTATIONS = 199  # …while rows are exchangeable; with blocks it samples at least these
# (layersim.similarity.inference.exchangeability.LINEAR_CKA_BLOCK_PERMUTATIONS)
SMALL_PRODUCT = 1e8  # layersim.similarity._common: below rows × width² multiply-adds a product runs on one thread


def measure_flops(measure: str, n: int, d: int) -> float:
    """FLOPs of one layer pair's similarity on n points of width d, as the null's engines compute a cell (each layer's
    statistics once; per cell a product of the two sides and its reduction): RBF CKA's n × n kernels; the others'
    cross-products, of the d-wide layers, or for the CCA family of their bases (k = min(n, d) columns at most) and
    the singular values of the k × k block."""
    if measure == "rbf_cka":
        return 2 * n * n * d
    if measure in CCA_FAMILY:
        k = min(n, d)
        return 2 * n * k * k + 4 * k ** 3
    return 2 * n * d * d


# Linear and debiased CKA's null engines permute the stacked layers' centred n × n kernels instead of multiplying
# features when that costs less (layersim.similarity.inference._null_engines._use_gram: kept equal by
# tests/test_plan.py; the similarity package is too heavy an import for the plan).
GRAM_MEASURES = ("linear_cka", "debiased_cka")
GRAM_BYTES_LIMIT = 1 << 30  # layersim.similarity._cka_kernels.GRAM_BYTES_LIMIT
GATHER_MULTIPLY_ADDS = 30.0  # the scattered copy K[π][:, π] per kernel entry, as multiply-adds


def null_uses_gram(n: int, layers: int, d: int) -> bool:
    """Whether a CKA null over `layers` stacked layers of width d on n rows runs on the kernels (as the engine
    decides)."""
    kernel_bytes = 8.0 * 3 * layers * n * n
    gram = (layers * layers + GATHER_MULTIPLY_ADDS * layers) * n * n
    return kernel_bytes <= GRAM_BYTES_LIMIT and gram < n * float(layers * d) ** 2


def null_flops(measure: str, n: int, d: int, pairs: int) -> float:
    """FLOPs of one permutation of a stacked matrix's null over `pairs` cells (its upper triangle with the diagonal):
    each cell's product, or for CKA on the kernels every kernel gathered and each pair's inner product."""
    layers = round((math.sqrt(8 * pairs + 1) - 1) / 2)
    if measure in GRAM_MEASURES and null_uses_gram(n, layers, d):
        return 2 * (layers * layers + GATHER_MULTIPLY_ADDS * layers) * n * n
    return pairs * measure_flops(measure, n, d)


def measured(measures, n: int, d: int, pairs: int, permutations: int, resamples: int = 0,
             blocks: bool = False) -> StageCost:
    """`pairs` layer pairs of each measure on n points of width d, over the observed matrix, each permutation of the
    null (none for an exact null; with `blocks`, rows of one example together, linear CKA samples at least
    LINEAR_CKA_BLOCK_PERMUTATIONS) and `resamples` bootstrap cells: numpy on the host, on one thread where the
    products are small; the permutations are the nulls' engines' (analysis_flops: torch's batched products, on the
    host's threads in a CPU plan, on the GPU in a GPU plan)."""
    cost = StageCost("similarity")
    for m in measures:
        drawn = 0 if m in EXACT_NULL and not blocks else max(permutations, LINEAR_CKA_BLOCK_PERMUTATIONS) \
            if m in EXACT_NULL else permutations
        cells = pairs * (1 + drawn) + resamples
        flops, null = measure_flops(m, n, d), null_flops(m, n, d, pairs) * drawn
        cost.add(StageCost("similarity", flops=flops * (pairs + resamples) + null, evaluations=cells,
                           analysis_flops=null, analysis_evaluations=pairs * drawn))
    cost = host(cost, n * d * d)
    # The nulls' engines multiply a batch of permutations of the whole stack at once, in torch: on its threads.
    cost.small_flops = max(0.0, cost.small_flops - cost.analysis_flops)
    return cost


def host(cost: StageCost, product: float) -> StageCost:
    """`cost` with its FLOPs numpy's on the host CPU, on one thread if its products (multiply-adds) are small."""
    cost.host_flops = cost.flops
    cost.small_flops = cost.flops if product < SMALL_PRODUCT else 0.0
    return cost


def similarity(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Every layer of every run against every other (the stacked matrix), per measure and pooling, over the observed
    matrix and each permutation of the null; the bootstrap resamples of the FT–ORIG and FT[1]–FT[2] diagonals."""
    s = params.similarity
    runs, diagonals = disk.extract_runs(params), 2 + 2 * len(params.finetune.compare_methods)  # LoRA–ORIG, LoRA–FT
    stacked = runs * (model.shape.num_layers + 1)
    pairs, resamples = stacked * (stacked + 1) // 2, diagonals * (model.shape.num_layers + 1) * s.bootstrap
    cost = StageCost("similarity", processes=1, heatmaps=len(s.measures) + bool(s.attention_measures))
    for pooling, measures in s.measures.items():
        n = pooling_rows(params, task, pooling)
        cost.rows += n
        cost.add(measured(measures, n, model.shape.hidden, pairs, s.permutations, resamples, pooling == "tokens"))
    return cost


def pooling_rows(params, task: TaskSize, pooling: str) -> int:
    """The rows of one pooling's activation tables: words (at most extract.max_tokens) or examples × choices."""
    rows = extract_rows(params, task)
    return min(params.extract.max_tokens, rows["words"]) if pooling == "tokens" else rows["validation"] * task.choices


def grounding(params, model: ModelSize, task: TaskSize) -> StageCost:
    """Off (grounding.enabled false): a process that records so. On: per pooling and measure, the stacked matrix of
    ORIG, the seeds' runs and the random-init control, observed cells only (no null, no resample: the bootstrap
    resamples the tests' per-run and per-layer scores, not the measures), and one figure."""
    if not params.grounding.enabled:
        return StageCost("grounding", processes=1)
    s = params.similarity
    stacked = (1 + len(params.seeds) + (s.random_control is not None)) * (L(model) + 1)
    cost = StageCost("grounding", processes=1, heatmaps=1)
    for pooling, measures in s.measures.items():
        n = pooling_rows(params, task, pooling)
        cost.rows += n
        cost.add(measured(measures, n, model.shape.hidden, stacked * (stacked + 1) // 2, 0))
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
    # Each point against each reference and layer, and its resamples: a measure call each; per run a heatmap and a
    # panel of curves.
    return StageCost("dynamics", rows=states * n, processes=1, **loaded(model, fine_tuned_runs(params) if states else 0),
                     evaluations=pairs, heatmaps=2 * fine_tuned_runs(params),
                     flops=states * n * forward(model, s)
                     + pairs * measure_flops("linear_cka", n, model.shape.hidden),
                     passes=states * L(model) * math.ceil(n / params.extract.batch_size))


def truncate(params, model: ModelSize, task: TaskSize, num_labels: int) -> StageCost:
    """Each seed's model scored once at every exit, and per layer a Tuned and a TunedOrig head trained on the train
    tables for head_epochs (a dense h×h layer and the output layer)."""
    t, rows, s = params.truncate, extract_rows(params, task), task.tokens(params.finetune.max_length)
    seeds, layers = len(params.seeds), model.shape.num_layers + 1
    h = model.shape.hidden
    head = 6 * (h * h + h * num_labels)
    heads = seeds * 2 * layers * t.head_epochs * rows["train"] * task.choices
    val = seeds * rows["validation"] * task.choices
    return StageCost("truncate", rows=val + seeds * rows["train"] * task.choices, flops=val * forward(model, s) + heads * head,
                     # A head's step (one small dense layer: forward, backward, update) dispatches about what one
                     # encoder layer's forward pass does: one pass.
                     passes=L(model) * math.ceil(val / params.extract.batch_size) + math.ceil(heads / t.head_batch_size),
                     train_flops=heads * head, processes=1, **loaded(model, seeds), notes=["heads: every epoch of head_epochs counted (early stopping ends sooner)"])


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
    stacked = sum(L(m) + 1 for m in models)
    for pooling, measures in s.measures.items():
        rows = min(params.extract.max_tokens, words) if pooling == "tokens" else n
        cost.add(measured(measures, rows, model.shape.hidden, stacked * (stacked + 1) // 2, s.permutations,
                          pooling == "tokens"))
    return cost
