"""Extraction: every layer's representation of every validation example, pooled, into activation
tables (docs/architecture.md, "Activation table").

Which token stands for a sequence depends on the architecture's own classification head
(``head_token`` in :data:`layersim.models.layer_stacks.FAMILIES`, spelled out torch-free as
:data:`layersim.params.validate.LAST_TOKEN_HEADS`): encoders read the first token ([CLS], <s>);
decoders (GPT-2, Llama, Qwen2, Mistral) and XLNet read the last non-pad token, where a causal model has seen the
whole input and XLNet's tokenizer puts its <cls>. For those, "cls" is refused (a decoder's first token has seen
only itself; with XLNet's left padding it is padding) and "last" is the last non-pad token, as their heads read
it; :func:`layersim.params.validate.head_pooling` names the pooling a model folder's head reads, on which
truncate trains its fresh heads.
The last hidden state of decoders and ModernBERT is after their final norm (transformers' convention:
``hidden_states[-1]`` is ``last_hidden_state``), the others' are not normed; the layer-pruning measures written
beside the tables take layer L before the norm (layersim.experiments.pruning_states)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from layersim.data.batching import EncodedTask, collate, collate_words, encode_task
from layersim.compute.device import to_device
from layersim.errors import LayersimError, unknown_name
from layersim.data.io import ActivationWriter, layer_column, with_metadata, write_json, write_parquet
from layersim.data.io.stored import Scales, encode, table_encoding, to_arrow
from layersim.experiments.pruning_states import PruningStates
from layersim.models.encoders import last_block_output
from layersim.params import POOLINGS
from layersim.params.validate import LAST_TOKEN_HEADS, head_pooling  # noqa: F401 (head_pooling: part of the API)
from layersim.data.tasks import TaskSpec
from layersim.data.words import align_rows, word_attention


def reads_last_token(config) -> bool:
    """Whether the model's own classification head reads each row's last non-pad token (decoders, XLNet)
    rather than its first token."""
    return getattr(config, "model_type", None) in LAST_TOKEN_HEADS


def check_poolings(config, poolings) -> None:
    """Refuse "cls" for a model whose head reads the last token: it has no sequence token first."""
    if "cls" in poolings and reads_last_token(config):
        valid = [q for q in POOLINGS if q != "cls"]
        raise LayersimError(f"pooling 'cls' is not defined for a {config.model_type!r} model, whose classification "
                            "head reads the last non-pad token (a decoder's first token has seen only itself); valid "
                            f"poolings for it are: {', '.join(valid)}.")


def last_content_position(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          special_ids: list[int], last_token_head: bool = False) -> torch.Tensor:
    """(rows,) index of the last token that is neither padding nor a special token ([SEP], </s>):
    the last sub-word of the input's last word. Falls back to the last non-padding token.

    With `last_token_head` (decoders, XLNet): the last non-padding token, special or not, whichever side is
    padded: the token their own heads read (transformers' ``*ForSequenceClassification`` takes the rightmost
    token that is not padding)."""
    attended = attention_mask.bool()
    if last_token_head:
        content = attended
    else:
        content = attended & ~torch.isin(input_ids, torch.tensor(special_ids, device=input_ids.device))
        content = torch.where(content.any(1, keepdim=True), content, attended)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    return (content * positions).argmax(1)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str,
         last_position: torch.Tensor | None = None, word_index: tuple | None = None) -> torch.Tensor:
    """(rows, length, hidden) → (rows, hidden): the first token (CLS, or <s> for RoBERTa), the mean
    over non-padding tokens, or the token at `last_position` (see :func:`last_content_position`);
    "cls" assumes the first token is the sequence's (see :func:`check_poolings`);
    for "tokens", (words, hidden): the tokens at `word_index` = (row, position) tensors.

    Wu et al. (2020) represent a word by its last sub-word token; "last" applies that rule to the
    input's final word, keeping one row per example so that tables of different runs line up;
    "tokens" keeps one row per word (see layersim.data.words)."""
    if pooling == "tokens":
        if word_index is None:
            raise LayersimError("pooling 'tokens' needs the (row, position) of each word's last sub-word.")
        return hidden[word_index[0], word_index[1]]
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
    if pooling == "last":
        if last_position is None:
            raise LayersimError("pooling 'last' needs the position of each row's last content token.")
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last_position]
    raise LayersimError(f"unknown pooling {pooling!r}; valid poolings are: {', '.join(POOLINGS)}.")


def pool_layers(hidden_states, input_ids: torch.Tensor, attention_mask: torch.Tensor, poolings,
                special_ids: list[int], word_index: tuple | None = None,
                last_token_head: bool = False) -> dict[str, list[np.ndarray]]:
    """Every layer's hidden states, pooled: pooling → [(rows, hidden) float32 array per layer 0 … L].

    Each pooling's layers are stacked into one (layers, rows, hidden) tensor and copied to NumPy once;
    the per-layer arrays are contiguous slices of that fresh block, so they never pin the hidden
    states in memory (``hidden[:, 0]`` alone would be a view of the whole hidden-state tensor).
    Stacking the pooled rows, not the hidden states, avoids copying every hidden state once more."""
    last_position = (last_content_position(input_ids, attention_mask, special_ids, last_token_head)
                     if "last" in poolings else None)
    pooled: dict[str, list[np.ndarray]] = {}
    for pooling in poolings:
        values = torch.stack([pool(h, attention_mask, pooling, last_position, word_index) for h in hidden_states])
        pooled[pooling] = list(values.float().cpu().numpy())
    return pooled


@dataclass
class PooledBatch:
    """One batch of extracted rows: one row per (example, choice), each pooling's per-layer arrays; with
    the "tokens" pooling, its rows are the batch's words, keyed by `word_keys`."""
    example_id: np.ndarray
    cluster_id: np.ndarray  # each per-example row's cluster (EncodedTask.cluster_id)
    choice: np.ndarray
    labels: np.ndarray
    layers: dict[str, list[np.ndarray]]  # pooling → [(rows, hidden) float32 per layer 0 … L]
    word_keys: np.ndarray | None = None  # (words, 4) int64 example_id, choice, segment, word of layers["tokens"]
    word_labels: np.ndarray | None = None  # each word's example label


def _word_rows(encoded: EncodedTask, indices: np.ndarray, budget: int | None, attention_mask: torch.Tensor,
               left_padded: bool):
    """Keys, labels and (row, position) index of the batch's words, at most `budget` of them (in order)."""
    keys, rows, positions, labels = [], [], [], []
    for j, i in enumerate(indices):
        for c, located in enumerate(encoded.words[i]):
            if budget is not None:
                located, budget = located[:budget], budget - min(budget, len(located))
            n = len(located)
            keys.append(np.column_stack([np.full(n, encoded.example_id[i]), np.full(n, c), located[:, :2]]))
            rows.append(np.full(n, j * encoded.num_choices + c))
            positions.append(located[:, 2])
            labels.append(np.full(n, encoded.labels[i]))
    rows, positions = np.concatenate(rows).astype(np.int64), np.concatenate(positions).astype(np.int64)
    if left_padded:  # positions count from each row's first token
        positions += (attention_mask.shape[1] - attention_mask.sum(1)).cpu().numpy()[rows]
    index = (torch.from_numpy(rows).to(attention_mask.device), torch.from_numpy(positions).to(attention_mask.device))
    return np.concatenate(keys).astype(np.int64), np.concatenate(labels), index, budget


def _hidden_states(encoder, batch: dict, device: torch.device, num_layers: int, **outputs):
    """Run `encoder` on `batch` flattened to (rows, length): every (example, choice) is one row."""
    batch = {k: v.reshape(-1, v.shape[-1]) for k, v in to_device(batch, device).items()}
    out = encoder(**batch, **outputs)
    states = out.attentions if outputs.get("output_attentions") else out.hidden_states
    want = num_layers if outputs.get("output_attentions") else num_layers + 1
    if len(states) != want:
        raise LayersimError(f"the encoder returned {len(states)} {'attention maps' if want == num_layers else 'hidden states'}"
                            f", expected {want}.")
    return batch, states


@torch.inference_mode()
def pooled_batches(encoder, tokenizer, encoded: EncodedTask, poolings, batch_size: int, device: torch.device,
                   desc: str = "extract", max_tokens: int | None = None,
                   pruning: PruningStates | None = None) -> Iterator[PooledBatch]:
    """Run `encoder` over `encoded` in order and pool every layer's hidden states of each batch.

    Multiple-choice examples give one row per (example, choice). The "tokens" pooling (`encoded` made
    with words=True) gives one row per word, example by example, the first `max_tokens` words in all, from a
    second pass over the examples' pre-split words (layersim.data.words), run only while words are wanted.
    "cls" is refused, before any batch runs, for a model whose head reads the last token (:func:`check_poolings`).
    With `pruning`, the per-example pass (run for it alone if no per-example pooling is asked for) also adds
    every sequence's states to it (layersim.experiments.pruning_states)."""
    check_poolings(encoder.config, poolings)
    last_token_head = reads_last_token(encoder.config)
    encoder.eval().to(device)
    num_layers = encoder.config.num_hidden_layers
    special_ids = tokenizer.all_special_ids
    words = "tokens" in poolings
    per_example = [q for q in poolings if q != "tokens"]
    if words and encoded.word_features is None:
        raise LayersimError("pooling 'tokens' needs word positions; encode the task with encode_task(..., words=True).")
    budget = max_tokens
    choices = encoded.num_choices
    for start in tqdm(range(0, len(encoded), batch_size), desc=desc, mininterval=2):
        indices = np.arange(start, min(start + batch_size, len(encoded)))
        layers: dict[str, list[np.ndarray]] = {}
        if per_example or pruning is not None:
            with last_block_output(encoder) as last_block:
                batch, hidden_states = _hidden_states(encoder, collate(encoded, indices, tokenizer, with_labels=False),
                                                      device, num_layers, output_hidden_states=True)
            layers = pool_layers(hidden_states, batch["input_ids"], batch["attention_mask"], per_example, special_ids,
                                 None, last_token_head)
            if pruning is not None:
                _add_pruning_states(pruning, hidden_states, last_block[-1], batch, special_ids, last_token_head)
        word_keys = word_labels = None
        if words and budget != 0:
            batch, hidden_states = _hidden_states(encoder, collate_words(encoded, indices, tokenizer), device,
                                                  num_layers, output_hidden_states=True)
            word_keys, word_labels, word_index, budget = _word_rows(encoded, indices, budget, batch["attention_mask"],
                                                                    tokenizer.padding_side == "left")
            layers |= pool_layers(hidden_states, batch["input_ids"], batch["attention_mask"], ["tokens"], special_ids,
                                  word_index)
        elif words:  # the budget is spent: no rows, and no pass
            word_keys, word_labels = np.zeros((0, 4), np.int64), encoded.labels[:0]
            layers["tokens"] = [np.zeros((0, encoder.config.hidden_size), np.float32)] * (num_layers + 1)
        yield PooledBatch(
            example_id=np.repeat(encoded.example_id[indices], choices),
            cluster_id=np.repeat(encoded.cluster_id[indices], choices),
            choice=np.tile(np.arange(choices, dtype=np.int16), len(indices)),
            labels=np.repeat(encoded.labels[indices], choices),
            layers=layers, word_keys=word_keys, word_labels=word_labels)
        if words and budget == 0 and not per_example and pruning is None:
            return  # nothing more to extract


def _add_pruning_states(pruning: PruningStates, hidden_states, last_block: torch.Tensor, batch: dict,
                        special_ids: list[int], last_token_head: bool) -> None:
    """Every layer's block output (layer L's from the hook: before any final norm) into `pruning`."""
    if last_block.shape != hidden_states[-1].shape:
        raise LayersimError(f"the last layer's output has shape {tuple(last_block.shape)} but the hidden states "
                            f"{tuple(hidden_states[-1].shape)}; this architecture's block outputs are not batch-first "
                            "states, so the pruning measures cannot read them.")
    mask = batch["attention_mask"]
    head = (last_content_position(batch["input_ids"], mask, special_ids, True) if last_token_head
            else torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device))
    pruning.update([*hidden_states[:-1], last_block], mask, head)


def extract_activations(encoder, tokenizer, spec: TaskSpec, encoded: EncodedTask, outputs: dict[str, Path],
                        metadata: dict, batch_size: int, device: torch.device, max_tokens: int | None = None,
                        pruning_path: Path | None = None, precision: str = "float32") -> None:
    """Run `encoder` over `encoded` and write one activation table per pooling in `outputs` (for "tokens",
    one row per word, at most `max_tokens`: see layersim.data.words), batch by batch, its values stored as
    `precision` (extract.table_precision) says for its pooling (layersim.data.io.stored.table_encoding); with `pruning_path`, the layer-pruning measures as its papers define
    their rows (layersim.experiments.pruning_states) as JSON."""
    config = encoder.config
    pruning = (PruningStates(config.num_hidden_layers, "last" if reads_last_token(config) else "first")
               if pruning_path is not None else None)
    with contextlib.ExitStack() as stack:
        # Every table appears under its final name only if the whole extraction succeeds.
        writers = {pooling: stack.enter_context(ActivationWriter(
            path, num_layers=config.num_hidden_layers, hidden_size=config.hidden_size, label_type=spec.label_type,
            metadata={**metadata, "pooling": pooling, "shared": spec.shared},
            precision=table_encoding(precision, pooling)))
            for pooling, path in outputs.items()}
        for batch in pooled_batches(encoder, tokenizer, encoded, list(outputs), batch_size, device,
                                    desc=f"extract {metadata['run']}", max_tokens=max_tokens, pruning=pruning):
            for pooling, writer in writers.items():
                if pooling == "tokens":
                    keys = batch.word_keys
                    writer.write(keys[:, 0], keys[:, 1], batch.word_labels, batch.layers[pooling],
                                 segment=keys[:, 2], word=keys[:, 3], cluster_id=encoded.clusters_of(keys[:, 0]))
                else:
                    writer.write(batch.example_id, batch.choice, batch.labels, batch.layers[pooling],
                                 cluster_id=batch.cluster_id)
        if pruning is not None:
            shape = {"num_layers": config.num_hidden_layers, "hidden_size": config.hidden_size}  # as the tables'
            write_json({**metadata, **shape, **pruning.record()}, pruning_path)


@dataclass
class Pooled:
    """Pooled layers in memory: pooling → per-layer (rows, hidden) float32 arrays, and the keys of the
    "tokens" rows: (words, 4) example_id, choice, segment, word — or (words, 5) led by a part index
    when several tasks are concatenated (:func:`concatenate_pooled`)."""
    layers: dict[str, list[np.ndarray]]
    word_keys: np.ndarray | None = None


def pooled_layers(encoder, tokenizer, encoded: EncodedTask, poolings, batch_size: int,
                  device: torch.device, max_tokens: int | None = None) -> Pooled:
    """In memory: every pooling's per-layer arrays over all of `encoded` (words: the first `max_tokens`)."""
    batches = list(pooled_batches(encoder, tokenizer, encoded, poolings, batch_size, device, max_tokens=max_tokens))
    keys = np.concatenate([b.word_keys for b in batches]) if "tokens" in poolings else None
    return Pooled(concatenate_layers([batch.layers for batch in batches]), keys)


def concatenate_pooled(parts: list[Pooled]) -> Pooled:
    """Row-wise concatenation of several Pooled (e.g. one per task); word keys get the part's index first,
    since example ids repeat across tasks."""
    keys = None
    if parts[0].word_keys is not None:
        keys = np.concatenate([np.column_stack([np.full(len(p.word_keys), i), p.word_keys])
                               for i, p in enumerate(parts)]).astype(np.int64)
    return Pooled(concatenate_layers([p.layers for p in parts]), keys)


def models_for_pooling(representations: dict[str, Pooled], pooling: str) -> dict[str, list[np.ndarray]]:
    """Label → per-layer arrays of one pooling, rows lined up across the models: per-example rows are
    already; "tokens" rows are aligned on their word keys (:func:`layersim.data.words.align_rows`), so models
    with different tokenizers compare the same words."""
    if pooling != "tokens":
        return {label: reps.layers[pooling] for label, reps in representations.items()}
    _, aligned = align_rows({label: (reps.word_keys, reps.layers[pooling]) for label, reps in representations.items()})
    return aligned


def concatenate_layers(parts: list[dict[str, list[np.ndarray]]]) -> dict[str, list[np.ndarray]]:
    """Row-wise concatenation of several pooling → per-layer arrays dicts (batches, or tasks)."""
    return {pooling: [np.concatenate([part[pooling][k] for part in parts]) for k in range(len(layers))]
            for pooling, layers in parts[0].items()}


ATTENTION_UNITS = ("words", "tokens")


@torch.inference_mode()
def extract_attention(encoder, tokenizer, encoded: EncodedTask, path: Path, metadata: dict, batch_size: int,
                      device: torch.device, unit: str = "tokens", precision: str = "float32") -> None:
    """Write the attention maps of every layer and head for the examples in `encoded` to `path`, stored in
    the encoding `precision` (extract.table_precision) gives attention tables (layersim.data.io.stored.table_encoding;
    scaled per head).

    One Parquet row per (example, choice, query, key) over non-padding units, in that order; column `layer_k`
    (k = 1 … L) holds that pair's weight in each head of layer k, so each attention row (one query's
    distribution over keys) is a contiguous run of rows summing to 1 per head. `unit` "tokens": the model's
    tokens of the encoding every pooling but "tokens" reads; "words" (`encoded` made with words=True): Wu et
    al.'s words, from the pre-split encoding, attention to a word summed over its sub-words and from a word
    averaged over them (layersim.data.words.word_attention), each special token a unit of its own. The
    metadata records the unit (``attention_unit``).
    """
    if unit not in ATTENTION_UNITS:
        raise unknown_name("attention unit", unit, ATTENTION_UNITS)
    if unit == "words" and encoded.word_units is None:
        raise LayersimError("attention between words needs the word encoding; encode the task with "
                            "encode_task(..., words=True).")
    encoder.eval().to(device)
    # Fused attention kernels (sdpa) never materialise the weights; the eager path returns them.
    encoder.set_attn_implementation("eager")
    config = encoder.config
    num_layers, heads, choices = config.num_hidden_layers, config.num_attention_heads, encoded.num_choices
    columns = {"example_id": [], "choice": [], "query": [], "key": []}
    weights: list[list[np.ndarray]] = [[] for _ in range(num_layers)]
    for start in tqdm(range(0, len(encoded), batch_size), desc=f"attention {metadata['run']}", mininterval=2):
        indices = np.arange(start, min(start + batch_size, len(encoded)))
        inputs = (collate_words(encoded, indices, tokenizer) if unit == "words"
                  else collate(encoded, indices, tokenizer, with_labels=False))
        batch, attentions = _hidden_states(encoder, inputs, device, num_layers, output_attentions=True)
        units = [u for i in indices for u in encoded.word_units[i]] if unit == "words" else None
        for row, mask in enumerate(batch["attention_mask"].bool().cpu()):
            tokens = mask.nonzero().squeeze(1)
            maps = [attention[row][:, tokens][:, :, tokens].float().cpu().numpy() for attention in attentions]
            if units is not None:
                maps = [word_attention(m, units[row]) for m in maps]
            length = maps[0].shape[-1]
            query, key = np.divmod(np.arange(length * length), length)
            columns["example_id"].append(np.full(length * length, encoded.example_id[indices[row // choices]], np.int64))
            columns["choice"].append(np.full(length * length, row % choices, np.int16))
            columns["query"].append(query.astype(np.int16))
            columns["key"].append(key.astype(np.int16))
            for layer, m in enumerate(maps):  # (heads, length, length) → (query, key) rows of heads
                weights[layer].append(m.transpose(1, 2, 0).reshape(-1, heads))
    arrays = [pa.array(np.concatenate(columns[name])) for name in columns]
    layers = [layer_column(k) for k in range(1, num_layers + 1)]
    scales = Scales(layers, heads)  # one block: the whole table
    per_layer, stored_as = [], table_encoding(precision, "attention")
    for layer_weights in weights:
        stored, scale = encode(np.concatenate(layer_weights), stored_as, centred=False)  # weights stay >= 0
        arrays.append(pa.FixedSizeListArray.from_arrays(to_arrow(stored, stored_as), heads))
        per_layer.append(scale)
    table = pa.Table.from_arrays(arrays, names=list(columns) + layers)
    if stored_as != "float32":
        scales.add(table.num_rows, per_layer)
    write_parquet(with_metadata(table, {**metadata, "num_layers": num_layers, "num_heads": heads,
                                        "kind": "attention", "attention_unit": unit}), path,
                  scales.footer() if stored_as != "float32" else None)


def extract_task_attention(encoder, tokenizer, table: pa.Table, spec: TaskSpec, params, path: Path, metadata: dict,
                           device: torch.device) -> EncodedTask:
    """The attention maps of `table`'s examples as the extract stage keeps them: in extract.attention_unit
    (words, as Wu et al., or tokens), encoded as fine-tuning encodes them; returns that encoding."""
    unit = params.extract.attention_unit
    encoded = encode_task(table, spec, tokenizer, params.finetune.max_length, words=unit == "words")
    extract_attention(encoder, tokenizer, encoded, path, metadata, params.extract.batch_size, device, unit,
                      params.extract.table_precision)
    return encoded
