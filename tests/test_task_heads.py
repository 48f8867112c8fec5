"""The task model's own head (Phang et al.'s Tuned / TunedOrig) and heads trained on streamed rows:
exact identities against the model's forward, and the training rules (held-out stopping, streaming)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from layersim.data.batching import encode_task, length_sorted_batches, sequential_batches
from layersim.models.encoders import all_spans, exit_at, inject_first_token, num_layers, skip_span
from layersim.errors import LayersimError
from layersim.training.evaluate import predict
from layersim.training.heads import HEAD_KINDS, HeadParams, Rows, held_out_examples, train_head
from layersim.experiments.injection import injected_logits, injected_score
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.models.registry import load_task_model, load_tokenizer
from layersim.models.task_heads import own_head
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.truncation import exit_logits, initial_head, span_logits

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
ARCHITECTURES = ("tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra")
TASKS = ("synth-negation", "synth-choice", "synth-similarity")  # classification, multiple choice, regression


def _model(tiny_model_dir, arch: str, task: str, examples: int = 12):
    spec = get_task(task)
    folder = tiny_model_dir(arch)
    torch.manual_seed(0)
    model = load_task_model(folder, spec).eval()
    tokenizer = load_tokenizer(folder)
    return spec, model, tokenizer, encode_task(generated_table(spec, "validation", examples, seed=0), spec,
                                               tokenizer, 32)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("task", TASKS)
def test_one_pass_gives_every_exit_exactly(tiny_model_dir, arch: str, task: str) -> None:
    spec, model, tokenizer, encoded = _model(tiny_model_dir, arch, task)
    every_exit = exit_logits(model, encoded, tokenizer, 5, CPU)
    assert len(every_exit) == num_layers(model) + 1
    for k, logits in enumerate(every_exit):
        with exit_at(model, k):
            np.testing.assert_array_equal(logits, predict(model, encoded, tokenizer, 5, CPU), err_msg=f"layer {k}")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_copied_head_is_the_models_and_training_it_leaves_the_model_alone(tiny_model_dir, arch: str) -> None:
    spec, model, tokenizer, encoded = _model(tiny_model_dir, arch, "synth-negation")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    head = own_head(model)
    names = {name for name, _ in head.named_parameters()}
    assert any("classifier" in name or "out_proj" in name for name in names), names
    rows = np.random.default_rng(0).standard_normal((40, model.config.hidden_size)).astype(np.float32)
    train_head(spec, rows, np.arange(40) % 2, HeadParams(epochs=2, learning_rate=1e-2), seed=0, head=head)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), f"{name} changed"
    assert not all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), own_head(model).state_dict().values()))


def test_the_initial_head_is_seeded(tiny_model_dir) -> None:
    spec = get_task("synth-negation")
    folder = tiny_model_dir("tiny-bert")
    a, b, c = (initial_head(folder, spec, seed).state_dict() for seed in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["classifier.weight"], c["classifier.weight"])
    # The pooler is the pretrained one, whatever the seed: only the classifier is new.
    assert torch.equal(a["pool.dense.weight"], c["pool.dense.weight"])


def test_a_head_that_training_only_worsens_is_kept_as_it_started() -> None:
    """Epoch 0 competes on the held-out examples: a head that is already exact (held-out loss 0) comes back
    unchanged after a run of ruinous steps."""
    spec = get_task("synth-similarity")  # regression: squared error, 0 for an exact head
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 6)).astype(np.float32)
    y = 2 * x[:, 0]
    start = torch.nn.Linear(6, 1)
    with torch.no_grad():
        start.weight.zero_()
        start.bias.zero_()
        start.weight[0, 0] = 2.0
    trained = train_head(spec, x, y, HeadParams(epochs=3, learning_rate=10.0, holdout=0.2, patience=5), seed=0,
                         head=_copy(start))
    assert trained.best_epoch == 0 and trained.held_out_loss == 0.0 and trained.epochs_run == 3
    np.testing.assert_array_equal(trained.logits(x), start(torch.from_numpy(x)).detach().numpy())


def test_a_given_heads_dropout_is_seeded_whatever_ran_before() -> None:
    """Tuned trains a copy of the fine-tuned head, whose dropout draws from torch's global generator: the same
    seed gives the same head whatever the process drew before (truncate's Tuned values moved ~2e-4 between runs)."""
    spec = get_task("synth-similarity")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 6)).astype(np.float32)
    y = x[:, 0] - x[:, 1]
    start = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(6, 1))
    params = HeadParams(epochs=2, learning_rate=1e-2)
    results = []
    for draws_before in (0, 7):
        torch.rand(draws_before)  # other work of the process moves the global generator
        results.append(train_head(spec, x, y, params, seed=3, head=_copy(start)).logits(x))
    np.testing.assert_array_equal(results[0], results[1])


def _copy(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module)


def test_held_out_examples_are_a_seeded_share_and_never_all() -> None:
    a = held_out_examples(1000, 0.1, seed=3)
    assert len(a) == 100 and np.all(np.diff(a) > 0) and a.max() < 1000
    np.testing.assert_array_equal(a, held_out_examples(1000, 0.1, seed=3))
    assert not np.array_equal(a, held_out_examples(1000, 0.1, seed=4))
    assert len(held_out_examples(1000, 0.0, seed=3)) == 0
    assert len(held_out_examples(2, 0.9, seed=3)) == 1 and len(held_out_examples(1, 0.5, seed=3)) == 0


def test_early_stopping_ends_when_the_held_out_score_stalls() -> None:
    spec = get_task("synth-negation")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    y = rng.integers(0, 2, 300)  # labels carry nothing: the held-out score cannot keep improving
    trained = train_head(spec, x, y, HeadParams(epochs=200, holdout=0.2, patience=2), seed=0)
    assert trained.epochs_run < 200 and trained.epochs_run - trained.best_epoch == 2


def _table(path, x: np.ndarray, y: np.ndarray, choices: int = 1, rows_per_group: int = 64) -> ActivationTable:
    examples = len(y)
    with ActivationWriter(path, num_layers=0, hidden_size=x.shape[1], label_type=pa.int64(),
                          metadata={"task": "t"}, rows_per_group=rows_per_group) as writer:
        for at in range(0, examples, 10):
            ids = np.arange(at, min(at + 10, examples))
            writer.write(np.repeat(ids, choices), np.tile(np.arange(choices, dtype=np.int16), len(ids)),
                         np.repeat(y[ids], choices), [x[at * choices:(at + len(ids)) * choices]])
    return ActivationTable(path)


def test_streamed_rows_train_exactly_like_an_array_when_one_chunk_holds_them(tmp_path) -> None:
    spec = get_task("synth-choice")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((120 * 4, 5)).astype(np.float32)
    y = rng.integers(0, 4, 120)
    table = _table(tmp_path / "t.parquet", x, y, choices=4)
    assert len(table.row_groups()) > 1
    params = HeadParams(epochs=4, holdout=0.25, patience=10)
    streamed = train_head(spec, Rows(4, table=table, chunk_rows=10**6), y, params, seed=0)
    in_memory = train_head(spec, x, y, params, seed=0)
    np.testing.assert_array_equal(streamed.logits(x), in_memory.logits(x))


def test_small_chunks_visit_every_example_once_per_epoch_in_a_seeded_order(tmp_path) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((90 * 2, 3)).astype(np.float32)
    table = _table(tmp_path / "t.parquet", x, np.arange(90), choices=2, rows_per_group=20)
    rows = Rows(2, table=table, chunk_rows=40)
    orders = []
    for seed in (0, 0, 1):
        seen = [(index, chunk) for index, chunk in rows.chunks(np.random.default_rng(seed))]
        index = np.concatenate([i for i, _ in seen])
        assert sorted(index.tolist()) == list(range(90))
        for i, chunk in seen:  # each example's rows are its own, choices in order
            np.testing.assert_array_equal(chunk, x.reshape(90, 2, 3)[i])
        orders.append(index.tolist())
    assert orders[0] == orders[1] and orders[0] != orders[2]


def test_a_table_in_one_chunk_is_read_once_and_a_larger_one_chunk_by_chunk(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((90 * 2, 3)).astype(np.float32)
    y = rng.integers(0, 2, 90)
    table = _table(tmp_path / "t.parquet", x, y, choices=2, rows_per_group=20)
    reads = []
    original = ActivationTable.layer_of_row_groups
    monkeypatch.setattr(ActivationTable, "layer_of_row_groups",
                        lambda self, layer, groups: reads.append(list(groups)) or original(self, layer, groups))
    whole, chunked = Rows(2, table=table, chunk_rows=10**6), Rows(2, table=table, chunk_rows=40)
    for epoch in range(3):  # every epoch gives every example's own rows, however they were read
        for index, chunk in whole.chunks(np.random.default_rng(epoch)):
            np.testing.assert_array_equal(chunk, x.reshape(90, 2, 3)[index])
    assert len(reads) == 1 and len(reads[0]) == len(table.row_groups())
    reads.clear()
    for epoch in range(2):  # several chunks: each read when it comes, never the whole table at once
        assert sum(len(i) for i, _ in chunked.chunks(np.random.default_rng(epoch))) == 90
    assert len(reads) == 2 * 5 and all(len(groups) <= 2 for groups in reads)  # 9 groups of 20 rows, 2 per chunk


def test_head_kinds_match_the_params_names() -> None:
    from layersim.params.vocabulary import HEAD_KINDS as DECLARED

    assert DECLARED == HEAD_KINDS


def test_head_scores_train_a_copy_of_the_start_on_each_layer(tmp_path) -> None:
    from layersim.experiments.truncation import head_scores

    spec = get_task("synth-negation")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    train, validation = _table(tmp_path / "train.parquet", x[:200], y[:200]), _table(tmp_path / "v.parquet", x[200:], y[200:])
    params = HeadParams(epochs=30, learning_rate=1e-2, holdout=0.2, patience=30)
    torch.manual_seed(0)
    start = torch.nn.Linear(6, 2)
    before = {k: v.clone() for k, v in start.state_dict().items()}
    own, fresh = head_scores(spec, train, validation, params, 0, start), head_scores(spec, train, validation, params, 0)
    assert len(own) == len(fresh) == 1 and own[0] > 0.85 and fresh[0] > 0.85
    assert all(torch.equal(before[k], v) for k, v in start.state_dict().items())  # the start itself is untouched


# --- fewer passes (issue 18): prefix-reusing skip, length-sorted batches, injection through the head ---

@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("task", TASKS)
def test_prefix_reusing_skip_equals_the_direct_skip_exactly(tiny_model_dir, arch: str, task: str) -> None:
    spec, model, tokenizer, encoded = _model(tiny_model_dir, arch, task)
    full, spans = span_logits(model, encoded, tokenizer, 5, CPU)
    np.testing.assert_array_equal(full, predict(model, encoded, tokenizer, 5, CPU))
    assert list(spans) == all_spans(num_layers(model))
    for (i, j), logits in spans.items():
        with skip_span(model, i, j):
            np.testing.assert_array_equal(logits, predict(model, encoded, tokenizer, 5, CPU), err_msg=f"span {i}-{j}")


@pytest.mark.parametrize("task", TASKS)
def test_length_sorted_batches_give_every_example_once_and_table_order_back(tiny_model_dir, task: str) -> None:
    spec, model, tokenizer, encoded = _model(tiny_model_dir, "tiny-bert", task, examples=23)
    seen, widths = [], []
    for indices, batch in length_sorted_batches(encoded, 4, tokenizer):
        seen.extend(indices.tolist())
        widths.append(batch["input_ids"].shape[-1])
        np.testing.assert_array_equal(batch["labels"].numpy(), encoded.labels[indices].astype(batch["labels"].numpy().dtype))
    assert sorted(seen) == list(range(23)) and widths == sorted(widths, reverse=True)
    in_order = np.concatenate([model(**batch).logits.detach().numpy()
                               for _, batch in sequential_batches(encoded, 4, tokenizer, with_labels=False)])
    np.testing.assert_allclose(predict(model, encoded, tokenizer, 4, CPU), in_order, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("task", TASKS)
def test_injection_through_the_head_equals_the_model_with_its_state_replaced(tiny_model_dir, arch, task) -> None:
    spec, model, tokenizer, encoded = _model(tiny_model_dir, arch, task)
    rows = len(encoded) * encoded.num_choices
    vectors = np.random.default_rng(0).standard_normal((rows, model.config.hidden_size)).astype(np.float32)
    with torch.no_grad(), inject_first_token(model, torch.from_numpy(vectors)):  # the model's own path
        expected = np.concatenate([model(**batch).logits.numpy()
                                   for _, batch in sequential_batches(encoded, 5, tokenizer, with_labels=False)])
    np.testing.assert_array_equal(injected_logits(model, vectors, encoded.num_choices, 5, CPU), expected)
    with pytest.raises(LayersimError, match=f"{rows - 1} vectors were given"):
        injected_score(model, spec, encoded, vectors[1:], 5, CPU)
