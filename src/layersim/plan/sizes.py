"""What the plan knows before anything is downloaded: each task's rows and words per example, each model's layer
shape and parameters. The paper tasks' and hub models' figures are published ones (assumptions, listed in
docs/paper-configuration.md); the built-in tasks are generated here (milliseconds); a model already downloaded, or a
local folder, is read from its config.json and weights file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from layersim.compute.flops import LayerShape, layer_shape
from layersim.data.layout import task_tables
from layersim.data.tasks import TASKS_DIR, generated, get_task
from layersim.errors import LayersimError
from layersim.models.local_models import local_model_dir
from layersim.models.model_files import read_json
from layersim.models.registry import LOCAL_PREFIX, MODELS, WEIGHTS_FILE
from layersim.models.tiny_configs import HIDDEN as TINY_HIDDEN, LAYERS as TINY_LAYERS
from layersim.models.tiny_tokenizers import BYTE_BPE, TOKENIZER_KINDS
from layersim.params import MODEL_HIDDEN_SIZE

# Train and validation examples as the download stage keeps them (MNLI's matched validation, Yelp's test split), and
# about how many words an input has (every text field; per choice for multiple choice). Rows: the datasets'
# published sizes; words: rounded means, which only the FLOPs and the attention maps read.
PAPER_TASKS = {"cola": (8_551, 1_043, 9), "mnli": (392_702, 9_815, 30), "mrpc": (3_668, 408, 43),
               "qnli": (104_743, 5_463, 37), "qqp": (363_846, 40_430, 23), "rte": (2_490, 277, 52),
               "sst2": (67_349, 872, 19), "stsb": (5_749, 1_500, 20), "boolq": (9_427, 3_270, 115),
               "yelp_polarity": (560_000, 38_000, 133), "hellaswag": (39_905, 10_042, 45),
               "cosmosqa": (25_262, 2_985, 88)}
TOKENS_PER_WORD = 1.3   # sub-words per word, English text (assumption); plus the special tokens
SPECIAL_TOKENS = 3
# The lengths of a paper task's inputs about its mean (assumption): exponential, whose coefficient of variation is 1, a
# tail as long as Yelp's reviews' and longer than most tasks' (so the attention maps' bytes, which go with the square of
# the length, err high rather than low). The built-in tasks' lengths are counted.
LENGTH_DISTRIBUTION = "exponential"
TEXT_BYTES_PER_WORD = 4.0  # a task table's Parquet bytes per word of text (about 6 characters, compressed)

# Hub models: layers, feed-forward width, attention heads, parameters (their published configs; the width of every
# registry model is params.MODEL_HIDDEN_SIZE). Checkpoints are counted in float32, 4 bytes a parameter.
_BERT_BASE = (12, 3072, 12, 109_482_240)
HUB_MODELS = {"roberta-base": (12, 3072, 12, 124_645_632), "bert-base-uncased": _BERT_BASE,
              "electra-base": (12, 3072, 12, 108_891_648), "albert-large-v2": (24, 4096, 16, 17_683_968),
              "xlm-roberta-base": (12, 3072, 12, 278_043_648), "distilbert-base-uncased": (6, 3072, 12, 66_362_880),
              "deberta-v3-base": (12, 3072, 12, 183_831_552), "modernbert-base": (22, 1152, 12, 149_014_272),
              "mpnet-base": (12, 3072, 12, 109_486_464), "xlnet-base-cased": (12, 3072, 12, 116_718_336),
              "gpt2": (12, 3072, 12, 124_439_808), "qwen2.5-0.5b": (24, 4864, 14, 494_032_768),
              "tinyllama-1.1b": (22, 5632, 32, 1_100_048_384), "mistral-7b": (32, 14336, 32, 7_241_732_096),
              "minilm-l6": (6, 1536, 12, 22_713_216),
              **{name: _BERT_BASE for name in MODELS if name.startswith("multiberts-")}}
BYTES_PER_PARAMETER = 4
HUB_TOKENIZER_BYTES = 2_000_000  # a hub model's tokenizer files (RoBERTa's: 2.7 MB; BERT's: 0.9 MB)
TOKENIZER_BYTES_PER_ENTRY = 24  # tokenizer.json and friends, per vocabulary entry (MiniLM's: 711 kB for 30,522)
# The tiny models' vocabularies: MiniLM's WordPiece unless layersim.models.tiny_tokenizers trains them one.
TINY_VOCAB = {None: 30_522, BYTE_BPE: 400}
TINY_UNIGRAM_VOCAB = 300
TINY_POSITIONS, TINY_HEADS = 130, 2


@dataclass(frozen=True)
class TaskSize:
    train: int
    validation: int
    words: float       # per input (per choice)
    choices: int       # inputs per example (1 but for multiple choice)
    text_bytes: int    # the task tables' bytes
    lengths: tuple[int, ...] | None = None  # words of each input where counted; else LENGTH_DISTRIBUTION about words

    def tokens(self, max_length: int) -> float:
        """Tokens of an input, truncated at max_length."""
        return min(max_length, self.words * TOKENS_PER_WORD + SPECIAL_TOKENS)

    def square_units(self, unit: str, max_length: int) -> float:
        """The mean square of an input's length in attention units (extract.attention_unit: words, each special
        token a unit of its own, or tokens), truncated at max_length tokens: what an attention map's rows go with."""
        cap = (max_length - SPECIAL_TOKENS) / TOKENS_PER_WORD  # the words that fit
        if self.lengths:
            kept = np.minimum(np.asarray(self.lengths, float), cap)
            first, second = kept.mean(), (kept ** 2).mean()
        else:  # E[min(W, c)] and E[min(W, c)²] of an exponential W of mean `words`
            mean = max(self.words, 1e-9)
            tail = math.exp(-cap / mean)
            first, second = mean * (1 - tail), 2 * mean ** 2 * (1 - tail * (1 + cap / mean))
        if unit == "words":  # units = kept words + the 2 special tokens (a BERT pair's third is rounded away)
            return second + 4 * first + 4
        return TOKENS_PER_WORD ** 2 * second + 2 * TOKENS_PER_WORD * SPECIAL_TOKENS * first + SPECIAL_TOKENS ** 2

    def length_sharing(self, max_length: int) -> float:
        """The chance that two inputs have the same length (words, truncated at max_length tokens): the counted
        lengths' Σ p², else an exponential's of mean `words` (≈ 1 / (2√π sd), sd = mean). How many examples an
        attention null can pair an example with (layersim.similarity.inference.attention_null)."""
        cap = int((max_length - SPECIAL_TOKENS) / TOKENS_PER_WORD)
        if self.lengths:
            counts = np.bincount(np.minimum(np.asarray(self.lengths, dtype=np.int64), cap))
            return float(((counts / counts.sum()) ** 2).sum())
        return min(1.0, 1.0 / (2.0 * math.sqrt(math.pi) * max(self.words, 1e-9)))


@dataclass(frozen=True)
class ModelSize:
    shape: LayerShape
    heads: int
    parameters: int
    tokenizer_bytes: int

    @property
    def checkpoint_bytes(self) -> int:
        return self.parameters * BYTES_PER_PARAMETER + self.tokenizer_bytes


def task_size(params, name: str, root: Path = Path(".")) -> TaskSize:
    """The rows the download stage keeps of task `name` under `params` (download.max_*_examples applied)."""
    spec, d, lengths = get_task(name), params.download, None
    if name in PAPER_TASKS:
        train, validation, words = PAPER_TASKS[name]
    elif spec.hub is None and spec.user is None:
        train, validation = d.generated_train_examples, d.generated_validation_examples
        columns = generated.generate(name, "validation", min(validation, 200), d.generated_seed)
        lengths = _words(columns, spec.format)
        words = sum(lengths) / max(1, len(lengths))
    else:
        train, validation, words = _downloaded(name, task_tables(root / TASKS_DIR, name))
    train = min(train, d.max_train_examples or train)
    validation = min(validation, d.max_validation_examples or validation)
    choices = spec.num_choices or 1
    return TaskSize(train, validation, words, choices,
                    round((train + validation) * choices * words * TEXT_BYTES_PER_WORD), lengths)


def _words(columns: dict, form: str) -> tuple[int, ...]:
    """Words of each input (per choice for multiple choice)."""
    if form == "multiple_choice":
        texts = [f"{c} {x}" for c, xs in zip(columns["context"], columns["choices"]) for x in xs]
    else:
        texts = [" ".join(parts) for parts in zip(*(columns[k] for k in ("text", "text_a", "text_b") if k in columns))]
    return tuple(len(t.split()) for t in texts)


def _downloaded(name: str, folder: Path) -> tuple[int, int, float]:
    """A user task's sizes, from the tables the download stage wrote (the plan cannot know them before)."""
    try:
        rows = [pq.ParquetFile(folder / f"{split}.parquet").metadata.num_rows for split in ("train", "validation")]
    except OSError:
        raise LayersimError(f"the plan needs the size of task {name!r}, which is known only once downloaded: run "
                            f"`dvc repro download_task@{name}` first.") from None
    return rows[0], rows[1], 20.0  # words: not read (FLOPs only)


def model_size(name: str, root: Path = Path(".")) -> ModelSize:
    """The shape and parameters of model `name`: published for the hub models, counted for the tiny ones, read from
    the folder of a downloaded or local model."""
    spec = MODELS.get(name)
    hidden = MODEL_HIDDEN_SIZE.get(name)
    if name in HUB_MODELS and hidden:
        layers, width, heads, parameters = HUB_MODELS[name]
        return ModelSize(LayerShape(layers, hidden, width), heads, parameters, HUB_TOKENIZER_BYTES)
    if spec is not None and spec.source == "tiny":
        hidden, layers = spec.shape or (TINY_HIDDEN, TINY_LAYERS)
        kind = TOKENIZER_KINDS.get(spec.architecture)
        vocab = TINY_VOCAB.get(kind, TINY_UNIGRAM_VOCAB)
        shape = LayerShape(layers, hidden, 2 * hidden)
        return ModelSize(shape, TINY_HEADS, bert_parameters(shape, vocab, TINY_POSITIONS), vocab * TOKENIZER_BYTES_PER_ENTRY)
    local = name.startswith(LOCAL_PREFIX)
    folder = local_model_dir(name, root) if local else root / "data" / "models" / name / "pretrained"
    if not (folder / "config.json").is_file():
        raise LayersimError(f"the plan does not know the size of model {name!r}: run `dvc repro download_model` "
                            "first (the plan then reads its config).")
    remedy = f"save the model there again with model.save_pretrained('{folder}')" if local else \
        "run `dvc repro download_model` again"
    config = read_json(folder / "config.json", f"model {name!r}: its config", remedy)
    weights = folder / WEIGHTS_FILE
    parameters = weights.stat().st_size // BYTES_PER_PARAMETER if weights.exists() else 0
    heads = next((config[k] for k in ("num_attention_heads", "n_head", "n_heads") if config.get(k)), 1)
    return ModelSize(layer_shape(config), int(heads), parameters, config.get("vocab_size", 0) * TOKENIZER_BYTES_PER_ENTRY)


def bert_parameters(shape: LayerShape, vocab: int, positions: int) -> int:
    """Parameters of a BERT-like encoder: token, position and type embeddings and their norm, per layer the
    attention (4 h×h with biases), the feed-forward (h×f, f×h with biases) and two norms, and the pooler."""
    h, f = shape.hidden, shape.intermediate
    layer = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h
    return (vocab + positions + 2) * h + 2 * h + shape.num_layers * layer + h * h + h
