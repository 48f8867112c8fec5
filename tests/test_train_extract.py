"""Tests for fine-tuning (layersim.training.train), metrics (layersim.training.evaluate) and extraction
(layersim.experiments.extract) on tiny random-init encoders and the built-in generated tasks.

Extraction is checked against the encoder run by hand on one unpadded example at a time, so a
pooling mistake or padding that leaks into the pooled rows shows up as a numerical mismatch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from layersim.models import registry as models

from layersim.training import train
from layersim.data.batching import encode_task
from layersim.errors import LayersimError
from layersim.training.evaluate import compute_metrics, predict
from layersim.experiments.extract import extract_activations, extract_attention
from layersim.data.io import ActivationTable, AttentionTable
from layersim.data.layout import finetuned as seed_checkpoint
from layersim.models.registry import load_encoder, load_tokenizer
from layersim.params import FinetuneParams
from layersim.data.tasks import TaskSpec, generated_table, get_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
TINY = ("tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra")
RANGES = {"accuracy": (0.0, 1.0), "f1": (0.0, 1.0), "mcc": (-1.0, 1.0), "pearson": (-1.0, 1.0),
          "spearman": (-1.0, 1.0)}
DETERMINISM_PARAMS = FinetuneParams(batch_size=4, learning_rate=1e-3, warmup_steps=2, max_steps=8,
                                    eval_every=4, max_length=32)
SHORT_PARAMS = FinetuneParams(batch_size=4, learning_rate=1e-3, warmup_steps=1, max_steps=3,
                              eval_every=0, max_length=48, eval_batch_size=8)




def _encoded(spec: TaskSpec, tokenizer, split: str, n: int, max_length: int, seed: int = 0):
    return encode_task(generated_table(spec, split, n, seed=seed), spec, tokenizer, max_length)


def _run_finetune(folder, task: str, params: FinetuneParams, seed: int, n_train=64, n_val=32):
    spec = get_task(task)
    tokenizer = load_tokenizer(folder)
    train_set = _encoded(spec, tokenizer, "train", n_train, params.max_length)
    val_set = _encoded(spec, tokenizer, "validation", n_val, params.max_length)
    logs: list[tuple[int, dict]] = []
    model, metrics = train.finetune(folder, spec, train_set, val_set, params, seed,
                                    log=lambda step, values: logs.append((step, dict(values))), device=CPU)
    return model, metrics, logs, tokenizer, val_set


@pytest.fixture(scope="module")
def finetuned(tiny_model_dir):
    """finetuned(arch, task) → (model, metrics, logs, tokenizer, validation set), cached per module."""
    cache: dict = {}

    def get(arch: str, task: str):
        key = (arch, task)
        if key not in cache:
            cache[key] = _run_finetune(tiny_model_dir(arch), task, SHORT_PARAMS, seed=0, n_train=32, n_val=16)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def bert_seed0(tiny_model_dir):
    """tiny-bert fine-tuned on synth-negation with DETERMINISM_PARAMS, seed 0."""
    return _run_finetune(tiny_model_dir("tiny-bert"), "synth-negation", DETERMINISM_PARAMS, seed=0)


# --- schedule and data order ------------------------------------------------------------------------

def _lrs(warmup: int, max_steps: int, peak: float, steps: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=peak)
    scheduler = train.linear_warmup_decay(optimizer, warmup, max_steps)
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


def test_linear_warmup_decay_exact_values():
    # lrs[s] is the rate used by the (s+1)-th optimizer step.
    lrs = _lrs(warmup=4, max_steps=12, peak=2.0, steps=14)
    # warm-up: 1/4, 2/4, 3/4, 4/4 of the peak over the first four steps
    assert lrs[:4] == [0.5, 1.0, 1.5, 2.0]
    # peak at warmup_steps, then linear decay: (12 - s) / (12 - 4) of the peak
    assert lrs[4] == 2.0
    assert lrs[4:13] == [2.0 * (12 - s) / 8 for s in range(4, 13)]
    assert lrs[6] == 1.5 and lrs[8] == 1.0 and lrs[10] == 0.5
    assert lrs[12] == 0.0
    assert lrs[13] == lrs[14] == 0.0  # never negative after max_steps
    # linear: constant differences within each phase
    assert np.allclose(np.diff(lrs[:4]), 0.5) and np.allclose(np.diff(lrs[4:13]), -0.25)


def test_linear_warmup_decay_no_warmup():
    lrs = _lrs(warmup=0, max_steps=4, peak=1.0, steps=4)
    assert lrs == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_data_order_epochs_are_permutations():
    order = train.data_order(num_examples=10, batch_size=4, max_steps=7, seed=3)
    assert order.shape == (7, 4)
    assert np.issubdtype(order.dtype, np.integer)
    flat = order.reshape(-1)
    np.testing.assert_array_equal(np.sort(flat[:10]), np.arange(10))
    np.testing.assert_array_equal(np.sort(flat[10:20]), np.arange(10))
    tail = flat[20:]
    assert len(np.unique(tail)) == len(tail) == 8 and tail.min() >= 0 and tail.max() < 10
    assert not np.array_equal(flat[:10], flat[10:20])  # a fresh shuffle per epoch
    assert not np.array_equal(flat[:10], np.arange(10))

    exact = train.data_order(num_examples=8, batch_size=4, max_steps=6, seed=0).reshape(-1)
    for epoch in range(3):
        np.testing.assert_array_equal(np.sort(exact[8 * epoch:8 * epoch + 8]), np.arange(8))


def test_data_order_deterministic_per_seed():
    a = train.data_order(50, 4, 30, seed=1)
    np.testing.assert_array_equal(a, train.data_order(50, 4, 30, seed=1))
    assert not np.array_equal(a, train.data_order(50, 4, 30, seed=2))


# --- fine-tuning ------------------------------------------------------------------------------------

def _assert_state_dicts_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_finetune_deterministic_per_seed(tiny_model_dir, bert_seed0):
    model_a, metrics_a, logs_a, _, _ = bert_seed0
    model_b, metrics_b, logs_b, _, _ = _run_finetune(tiny_model_dir("tiny-bert"), "synth-negation",
                                                     DETERMINISM_PARAMS, seed=0)
    _assert_state_dicts_equal(model_a.state_dict(), model_b.state_dict())
    assert metrics_a == metrics_b
    assert logs_a == logs_b

    model_c, _, _, _, _ = _run_finetune(tiny_model_dir("tiny-bert"), "synth-negation", DETERMINISM_PARAMS, seed=1)
    sd_a, sd_c = model_a.state_dict(), model_c.state_dict()
    assert not torch.equal(sd_a["classifier.weight"], sd_c["classifier.weight"])
    # the seed also changes the data order, hence the encoder's weights
    encoder_a, encoder_c = model_a.base_model.state_dict(), model_c.base_model.state_dict()
    assert any(not torch.equal(encoder_a[k], encoder_c[k]) for k in encoder_a)


def test_finetune_changes_encoder_weights(tiny_model_dir, bert_seed0):
    model = bert_seed0[0]
    pretrained = load_encoder(tiny_model_dir("tiny-bert")).state_dict()
    tuned = model.base_model.state_dict()
    changed = [k for k in tuned if not torch.equal(tuned[k], pretrained[k])]
    assert "encoder.layer.0.attention.self.query.weight" in changed


def test_finetune_log_callback(bert_seed0):
    _, metrics, logs, _, _ = bert_seed0
    params = DETERMINISM_PARAMS
    train_logs = [(step, v) for step, v in logs if "train/loss" in v]
    eval_logs = [(step, v) for step, v in logs if "eval/accuracy" in v]
    assert len(train_logs) + len(eval_logs) == len(logs)
    # every train entry carries loss and lr; the last one is at max_steps with lr decayed to 0
    assert all(set(v) == {"train/loss", "train/lr"} for _, v in train_logs)
    assert train_logs[-1][0] == params.max_steps
    assert [s for s, _ in train_logs] == sorted(s for s, _ in train_logs)
    assert all(math.isfinite(v["train/loss"]) and v["train/loss"] > 0 for _, v in train_logs)
    assert all(0.0 <= v["train/lr"] <= params.learning_rate for _, v in train_logs)
    assert train_logs[-1][1]["train/lr"] == 0.0
    assert max(v["train/lr"] for _, v in train_logs) == pytest.approx(params.learning_rate)
    # evaluation every eval_every steps, and once more at the end with the returned metrics
    assert [s for s, _ in eval_logs] == [4, 8]
    assert eval_logs[-1][1] == {"eval/accuracy": metrics["accuracy"]}
    assert all(0.0 <= v["eval/accuracy"] <= 1.0 for _, v in eval_logs)


HEAD_CASES = [  # every task format, each on another architecture so that every head runs
    ("tiny-bert", "synth-negation"),
    ("tiny-roberta", "synth-roles"),
    ("tiny-electra", "synth-similarity"),
    ("tiny-albert", "synth-choice"),
]


@pytest.mark.parametrize("arch,task", HEAD_CASES)
def test_every_head_format_trains_and_evaluates(finetuned, arch, task):
    model, metrics, logs, tokenizer, val_set = finetuned(arch, task)
    spec = get_task(task)
    assert list(metrics) == list(spec.metrics)
    for name, value in metrics.items():
        low, high = RANGES[name]
        assert isinstance(value, float) and math.isfinite(value), (name, value)
        assert low <= value <= high, (name, value)
    assert logs[-1] == (SHORT_PARAMS.max_steps, {f"eval/{k}": v for k, v in metrics.items()})

    logits = predict(model, val_set, tokenizer, batch_size=SHORT_PARAMS.eval_batch_size, device=CPU)
    n = len(val_set)
    expected_shape = {"single": (n, 2), "pair": (n, 1) if spec.regression else (n, 2),
                      "multiple_choice": (n, 4)}[spec.format]
    assert logits.shape == expected_shape
    assert np.isfinite(logits).all()
    # the returned metrics are those of the returned model on the validation set
    assert compute_metrics(spec, logits, val_set.labels) == metrics
    # and other batch sizes (so other padding) give the same logits up to rounding
    np.testing.assert_allclose(predict(model, val_set, tokenizer, batch_size=5, device=CPU), logits, atol=1e-5)
    if "accuracy" in metrics:
        assert metrics["accuracy"] * n == pytest.approx(round(metrics["accuracy"] * n))


@pytest.mark.parametrize("arch,task", [("tiny-bert", None)] + HEAD_CASES[1:])
def test_checkpoint_round_trip_gives_finetuned_encoder(tiny_model_dir, finetuned, bert_seed0, tmp_path, arch, task):
    if task is None:
        model, _, _, tokenizer, _ = bert_seed0
        task = "synth-negation"
    else:
        model, _, _, tokenizer, _ = finetuned(arch, task)
    base = tiny_model_dir(arch)
    folder = tmp_path / "ckpt"
    train.save_checkpoint(model, tokenizer, folder, base_dir=base, task=task, seed=0)

    info = models.model_info(folder)
    assert info["base_digest"] == models.model_info(base)["digest"]
    assert info["digest"] == models.weights_digest(folder)
    assert info["task"] == task and info["seed"] == 0 and info["source"] == "finetune"

    encoder = load_encoder(folder)
    loaded = encoder.state_dict()
    expected = model.base_model.state_dict()
    missing = sorted(set(expected) - set(loaded))
    assert not missing, missing
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key
    # and the fine-tuned weights are not the pretrained ones (so equality above means something)
    pretrained = load_encoder(base).state_dict()
    assert any(not torch.equal(pretrained[k], v) for k, v in expected.items())
    assert load_tokenizer(folder)("a test")["input_ids"] == tokenizer("a test")["input_ids"]


# --- extraction -------------------------------------------------------------------------------------

def _row_inputs(spec: TaskSpec, table) -> list[tuple[str, ...]]:
    """The tokenizer arguments of each (example, choice) row."""
    columns = table.to_pydict()
    if spec.format == "single":
        return [(t,) for t in columns["text"]]
    if spec.format == "pair":
        return list(zip(columns["text_a"], columns["text_b"]))
    return [(c, e) for c, choices in zip(columns["context"], columns["choices"]) for e in choices]


def _reference_rows(encoder, tokenizer, spec: TaskSpec, table) -> tuple[list[list[torch.Tensor]], list[int]]:
    """Per layer, the hidden states of each (example, choice), run alone and unpadded."""
    per_row, lengths = [], []
    with torch.no_grad():
        for args in _row_inputs(spec, table):
            encoded = tokenizer(*args, return_tensors="pt")
            assert (encoded["attention_mask"] == 1).all()
            lengths.append(encoded["input_ids"].shape[1])
            hidden = encoder(**encoded, output_hidden_states=True).hidden_states
            per_row.append([h[0] for h in hidden])  # (length, hidden) per layer
    return per_row, lengths




def _last_content_index(tokenizer, input_ids: list[int]) -> int:
    """Index of the last token that is not special, found from the tokenizer's own special-token mask."""
    special = tokenizer.get_special_tokens_mask(input_ids, already_has_special_tokens=True)
    return max(i for i, is_special in enumerate(special) if not is_special)


@pytest.mark.parametrize("task", ["synth-negation", "synth-roles", "synth-choice"])
@pytest.mark.parametrize("arch", TINY)
def test_extraction_matches_unpadded_single_example_runs(tiny_model_dir, tmp_path, arch, task):
    folder = tiny_model_dir(arch)
    spec = get_task(task)
    table = generated_table(spec, "validation", 7, seed=1)
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(table, spec, tokenizer, max_length=128)
    outputs = {q: tmp_path / f"acts.{q}.parquet" for q in ("cls", "mean", "last")}
    metadata = {"model": arch, "run": "orig", "task": task, "split": "validation"}
    extract_activations(load_encoder(folder), tokenizer, spec, encoded, outputs, metadata, batch_size=3, device=CPU)

    reference_encoder = load_encoder(folder).eval()
    rows, lengths = _reference_rows(reference_encoder, tokenizer, spec, table)
    row_ids = [tokenizer(*args)["input_ids"] for args in _row_inputs(spec, table)]
    assert max(lengths) < 128  # nothing was truncated, so the batched run saw the same tokens
    choices = spec.num_choices if spec.format == "multiple_choice" else 1
    batch_rows = 3 * choices
    assert any(len(set(lengths[i:i + batch_rows])) > 1 for i in range(0, len(lengths), batch_rows)), \
        "no batch needed padding; the test would not catch padding leaks"

    n = table.num_rows
    example_ids = np.asarray(table.column("example_id").to_pylist())
    labels = np.asarray(table.column("label").to_pylist())
    for pooling, path in outputs.items():
        acts = ActivationTable(path)
        assert acts.metadata == {**metadata, "pooling": pooling, "num_layers": 3, "hidden_size": 32,
                                 "shared": spec.shared}
        assert acts.num_rows == n * choices
        np.testing.assert_array_equal(acts.example_id, np.repeat(example_ids, choices))
        np.testing.assert_array_equal(acts.cluster_id, np.repeat(table.column("cluster_id").to_numpy(), choices))
        np.testing.assert_array_equal(acts.choice, np.tile(np.arange(choices), n))
        np.testing.assert_array_equal(acts.labels(), np.repeat(labels, choices))
        for k in range(4):
            got = acts.layer(k)
            if pooling == "cls":
                want = np.stack([r[k][0].numpy() for r in rows])
            elif pooling == "mean":
                want = np.stack([r[k].mean(0).numpy() for r in rows])
            else:
                want = np.stack([r[k][_last_content_index(tokenizer, ids)].numpy() for r, ids in zip(rows, row_ids)])
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"{arch} {task} {pooling} layer {k}")
    if spec.format == "multiple_choice":
        acts = ActivationTable(outputs["cls"])
        assert choices == 4
        np.testing.assert_array_equal(acts.choice[:8], [0, 1, 2, 3, 0, 1, 2, 3])
        assert (acts.example_id[:4] == acts.example_id[0]).all() and acts.example_id[4] != acts.example_id[0]


def test_extraction_failure_leaves_no_tables(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("tiny-bert")
    spec = get_task("synth-negation")
    tokenizer = load_tokenizer(folder)
    encoded = _encoded(spec, tokenizer, "validation", 6, 64)
    encoder = load_encoder(folder)

    calls = {"n": 0}

    def fail_second_batch(module, args, output):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash")

    encoder.register_forward_hook(fail_second_batch)
    outputs = {"cls": tmp_path / "a.cls.parquet", "mean": tmp_path / "a.mean.parquet"}
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract_activations(encoder, tokenizer, spec, encoded, outputs, {"run": "orig"}, batch_size=3, device=CPU)
    assert list(tmp_path.iterdir()) == []


# --- metrics ---------------------------------------------------------------------------------------

def _logits(predictions: list[int], classes: int = 2) -> np.ndarray:
    out = np.zeros((len(predictions), classes), dtype=np.float32)
    out[np.arange(len(predictions)), predictions] = 1.0
    return out


def test_metrics_accuracy_f1():
    labels = np.array([1, 1, 1, 0, 0, 0])
    logits = _logits([1, 1, 0, 1, 0, 0])  # TP 2, FN 1, FP 1, TN 2
    assert compute_metrics(get_task("synth-roles"), logits, labels) == {"accuracy": 4 / 6, "f1": pytest.approx(2 / 3)}
    assert compute_metrics(get_task("synth-negation"), logits, labels) == {"accuracy": 4 / 6}
    assert compute_metrics(get_task("mrpc"), _logits([0, 0, 0, 0, 0, 0]), labels) == {"f1": 0.0, "accuracy": 0.5}


def test_metrics_mcc():
    labels = np.array([1, 1, 1, 0, 0, 0])
    cola = get_task("cola")
    # (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 − 1) / 9
    assert compute_metrics(cola, _logits([1, 1, 0, 1, 0, 0]), labels)["mcc"] == pytest.approx(1 / 3)
    assert compute_metrics(cola, _logits([1, 1, 1, 0, 0, 0]), labels)["mcc"] == pytest.approx(1.0)
    assert compute_metrics(cola, _logits([0, 0, 0, 1, 1, 1]), labels)["mcc"] == pytest.approx(-1.0)
    assert compute_metrics(cola, _logits([1] * 6), labels)["mcc"] == 0.0


def test_metrics_multiple_choice_argmax():
    logits = np.array([[0.1, 0.9, 0.0, 0.0], [2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 3.0], [0.0, 5.0, 0.0, 0.0]])
    assert compute_metrics(get_task("synth-choice"), logits, np.array([1, 0, 3, 2])) == {"accuracy": 0.75}


def test_metrics_regression_correlations():
    spec = get_task("synth-similarity")
    labels = np.array([1.0, 2.0, 3.0, 4.0])
    # Pearson of x=[1,2,3,4], y=[1,3,2,4]: Σdxdy = 4, Σdx² = Σdy² = 5 → 0.8; the ranks are the same → 0.8.
    result = compute_metrics(spec, np.array([[1.0], [3.0], [2.0], [4.0]]), labels)
    assert result == {"pearson": pytest.approx(0.8), "spearman": pytest.approx(0.8)}
    # monotone but not linear: Spearman 1, Pearson below 1
    result = compute_metrics(spec, np.array([[1.0], [4.0], [9.0], [100.0]]), labels)
    assert result["spearman"] == pytest.approx(1.0) and result["pearson"] < 0.9
    result = compute_metrics(spec, -2 * labels[:, None] + 7, labels)
    assert result == {"pearson": pytest.approx(-1.0), "spearman": pytest.approx(-1.0)}


def test_metrics_constant_prediction_is_zero_not_nan():
    spec = get_task("synth-similarity")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about constant input; the result is what matters
        result = compute_metrics(spec, np.full((5, 1), 2.5), np.array([0.0, 1.0, 2.0, 3.0, 5.0]))
    assert result == {"pearson": 0.0, "spearman": 0.0}
    assert all(isinstance(v, float) for v in result.values())


def test_metrics_unknown_metric_is_an_error():
    spec = TaskSpec("weird", "single", ("bleu",), ("a", "b"))
    with pytest.raises(LayersimError, match="unknown metric 'bleu'"):
        compute_metrics(spec, _logits([0, 1]), np.array([0, 1]))


@pytest.mark.parametrize("arch", TINY)
def test_attention_maps_match_single_example_runs(tiny_model_dir, tmp_path, arch):
    folder = tiny_model_dir(arch)
    spec = get_task("synth-similarity")
    table = generated_table(spec, "validation", 5, seed=1)
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(table, spec, tokenizer, max_length=128)
    path = tmp_path / "attention.parquet"
    extract_attention(load_encoder(folder), tokenizer, encoded, path, {"run": "orig", "task": spec.name},
                      batch_size=2, device=CPU)
    attention = AttentionTable(path)
    reference = load_encoder(folder).eval()
    reference.set_attn_implementation("eager")
    offsets = 0
    with torch.no_grad():
        for example, args in enumerate(_row_inputs(spec, table)):
            maps = reference(**tokenizer(*args, return_tensors="pt"), output_attentions=True).attentions
            length = maps[0].shape[-1]
            rows = slice(offsets, offsets + length * length)
            assert (attention.index[rows, 0] == table.column("example_id")[example].as_py()).all()
            for k in range(1, attention.num_layers + 1):
                want = maps[k - 1][0].permute(1, 2, 0).reshape(-1, attention.num_heads).numpy()
                np.testing.assert_allclose(attention.layer(k)[rows], want, atol=1e-5)
            offsets += length * length
    assert offsets == len(attention.index)
    # Every attention row is one query's distribution over keys: it sums to 1 in each head.
    sums = np.add.reduceat(attention.layer(1).astype(np.float64), attention.row_starts, axis=0)
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)


def test_bf16_autocast_fine_tuning_runs_on_cpu_and_learns(tiny_model_dir):
    """bf16 autocast (finetune.precision) on the CPU: the loss of memorising 8 examples falls as in fp32,
    and the arithmetic really changed (the losses are not bit-equal to fp32's)."""
    losses = {}
    for precision in ("fp32", "bf16"):
        params = FinetuneParams(batch_size=8, learning_rate=1e-3, warmup_steps=2, max_steps=40, eval_every=0,
                                max_length=32, precision=precision)
        _, _, logs, _, _ = _run_finetune(tiny_model_dir("tiny-bert"), "synth-negation", params, seed=0, n_train=8,
                                         n_val=8)
        losses[precision] = np.array([values["train/loss"] for _, values in logs if "train/loss" in values])
    bf16, fp32 = losses["bf16"], losses["fp32"]
    assert bf16[-3:].mean() < bf16[:3].mean() - 0.02
    assert not np.array_equal(bf16, fp32)
    np.testing.assert_allclose(bf16, fp32, atol=0.01)


def test_fp16_needs_a_gpu_and_unknown_precisions_are_refused():
    from layersim.compute.device import resolve_device, resolve_precision
    assert resolve_precision("auto", CPU) == "fp32" and resolve_precision("bf16", CPU) == "bf16"
    with pytest.raises(LayersimError, match="fp16.*needs a CUDA GPU"):
        resolve_precision("fp16", CPU)
    with pytest.raises(LayersimError, match="'fp8' is not one of auto, fp32, bf16, fp16"):
        resolve_precision("fp8", CPU)
    assert resolve_device("cpu") == CPU
    if not torch.cuda.is_available():
        assert resolve_device("auto") == CPU
        with pytest.raises(LayersimError, match="no CUDA GPU"):
            resolve_device("cuda:0")


def test_a_real_fine_tune_ends_with_its_convergence_check(tiny_model_dir, tmp_path):
    """Three steps of a random-init encoder on a regression task learn nothing: the check says so, from the
    run's own logged losses, the train labels' variance and the validation score; the record travels in the
    checkpoint's info file, where the figure stages read it."""
    from layersim.training.convergence import checkpoint_flags

    folder = tiny_model_dir("tiny-bert")
    spec, tokenizer = get_task("synth-similarity"), load_tokenizer(folder)
    train_set = _encoded(spec, tokenizer, "train", 32, SHORT_PARAMS.max_length)
    val_set = _encoded(spec, tokenizer, "validation", 16, SHORT_PARAMS.max_length)
    logs, checks = [], {}
    model, metrics = train.finetune(folder, spec, train_set, val_set, SHORT_PARAMS, 0, device=CPU, checks=checks,
                                    log=lambda step, values: logs.append(values))
    check = checks["convergence"]
    assert check.trivial_loss == pytest.approx(float(np.var(train_set.labels)))
    assert check.final_train_loss == pytest.approx([v["train/loss"] for v in logs if "train/loss" in v][-1])
    assert check.score == metrics["pearson"] and check.baseline == 0.0 and check.metric == "pearson"
    assert not check.converged and "training loss" in check.reason
    assert check.n == 16 and check.test == "permutation"  # paired with the run's own validation predictions
    assert list(metrics) == ["pearson", "spearman"]  # the returned metrics stay the validation metrics

    record = check.record()
    for seed, convergence in ((1, record), (2, {**record, "converged": True, "score": record["score"]})):
        train.save_checkpoint(model, tokenizer, seed_checkpoint(tmp_path, seed), base_dir=folder, task=spec.name,
                              seed=seed, convergence=convergence)
    assert models.model_info(seed_checkpoint(tmp_path, 1))["convergence"] == record
    assert list(checkpoint_flags(tmp_path, [1, 2])) == ["FT[1]"]


def test_the_trivial_score_is_the_majority_class_or_a_constant_mean():
    labels = np.array([1, 1, 0, 1])
    assert train.trivial_score(get_task("synth-negation"), np.array([1, 1, 0]), labels) == 0.75
    assert train.trivial_score(get_task("cola"), np.array([1, 1, 0]), labels) == 0.0   # MCC of a constant
    assert train.trivial_score(get_task("mrpc"), np.array([1, 0, 1]), labels) == pytest.approx(2 * 0.75 / 1.75)
    assert train.trivial_score(get_task("synth-choice"), np.array([2, 2, 3]), np.array([2, 0, 2, 1])) == 0.5
    assert train.trivial_score(get_task("stsb"), np.array([1.0, 4.0]), np.array([0.0, 5.0, 2.0])) == 0.0
