"""A smaller model that keeps the score: the fewest layers of a fine-tuned model whose score stays within a
tolerance of the full model's, written as an ordinary Hugging Face checkpoint (no layersim code needed to
load it), re-scored from its files and timed against the full model.

The candidates are every exit after layer k (Phang et al.'s Untuned truncation, k = 1..L, k = L being the
full model) and every contiguous span i..j < L skipped (§4.1), each with the fine-tuned head as it is; all
their logits come from one forward pass per batch (:func:`layersim.experiments.truncation.span_logits`). The choice is
made on examples of the train split, so it never sees the validation score that is then reported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from layersim.data.batching import EncodedTask, length_sorted_batches
from layersim.compute.device import autocast, to_device
from layersim.models.encoders import num_layers, smaller_copy
from layersim.errors import LayersimError
from layersim.training.evaluate import predict
from layersim.data.io import atomic_path
from layersim.data.tasks import TaskSpec
from layersim.experiments.truncation import primary_score, span_logits

EXPORT_INFO_FILE = "layersim_export.json"  # provenance, next to the checkpoint's own files
TASK_INFO_FILE = "layersim_task.json"      # how to call the model: its task's inputs, labels and max length
TIMED_BATCH_SIZES = (1, 32)


@dataclass(frozen=True, order=True)
class LayerChoice:
    """A way to run fewer layers: exit after layer `exit_layer`, or skip the layers `first`..`last` (1-based)."""

    num_layers: int          # the full model's depth L
    exit_layer: int          # L when a span is skipped
    first: int = 0           # 0: nothing skipped
    last: int = 0

    @property
    def kept(self) -> list[int]:
        """The 0-based layers this choice runs, in order."""
        return [n for n in range(self.exit_layer) if not self.first - 1 <= n <= self.last - 1]

    @property
    def depth(self) -> int:
        return len(self.kept)

    def describe(self) -> str:
        if self.first:
            return f"layers {self.first}-{self.last} of {self.num_layers} skipped"
        if self.exit_layer == self.num_layers:
            return f"the full model ({self.num_layers} layers)"
        return f"exit after layer {self.exit_layer} of {self.num_layers}"

    def as_dict(self) -> dict:
        """Scalars only (metrics and details files keep lists as per-layer rows): the kept layers 1-based,
        comma-separated; the skipped span's first and last layer, None when nothing is skipped."""
        return {"description": self.describe(), "layers": self.depth, "exit_layer": self.exit_layer,
                "skipped_first": self.first or None, "skipped_last": self.last or None,
                "kept_layers": ",".join(str(n + 1) for n in self.kept)}


def choice_logits(model, encoded: EncodedTask, tokenizer, batch_size: int, device: torch.device,
                  precision: str = "fp32") -> dict[LayerChoice, np.ndarray]:
    """The logits of every choice of at least one layer, from one forward pass per batch: the exits after
    layers 1..L−1 are the spans k+1..L skipped, the full model is exit L."""
    num = num_layers(model)
    full, spans = span_logits(model, encoded, tokenizer, batch_size, device, precision)
    out = {LayerChoice(num, num): full}
    for (i, j), logits in spans.items():
        if j == num and i > 1:
            out[LayerChoice(num, i - 1)] = logits
        elif j < num:
            out[LayerChoice(num, num, i, j)] = logits
    return out


def choose_layers(scores: dict[LayerChoice, float], tolerance: float) -> LayerChoice:
    """The choice with the fewest layers whose score is at least the full model's minus `tolerance`; among
    equally deep ones the best score, then an exit before a skipped span (the simpler model)."""
    full = next(c for c in scores if c.exit_layer == c.num_layers and not c.first)
    within = [c for c, s in scores.items() if s >= scores[full] - tolerance]
    return min(within, key=lambda c: (c.depth, -scores[c], bool(c.first), c))


def best_per_depth(scores: dict[LayerChoice, float]) -> dict[int, LayerChoice]:
    """For each number of layers, the choice with the best score (ties: as :func:`choose_layers`)."""
    best: dict[int, LayerChoice] = {}
    for choice in sorted(scores, key=lambda c: (-scores[c], bool(c.first), c)):
        best.setdefault(choice.depth, choice)
    return dict(sorted(best.items()))


def task_card(spec: TaskSpec, max_length: int) -> dict:
    """What a user needs to call the exported model: the task's input format and the texts it takes, in the
    order the tokenizer takes them, its labels, and the training max length (tokens; longer inputs were cut)."""
    calls = {"single": "tokenizer(text)", "pair": "tokenizer(text_a, text_b)",
             "multiple_choice": "tokenizer([context] * len(choices), choices, truncation='only_first'), "
                                "one row per choice, scores over choices"}
    return {"task": spec.name, "format": spec.format, "text_columns": list(spec.text_columns),
            "tokenize": calls[spec.format], "label_names": list(spec.label_names), "regression": spec.regression,
            "num_choices": spec.num_choices or None, "max_length": max_length, "metric": spec.primary_metric,
            "load_with": auto_class_name(spec) + ".from_pretrained"}


def _label_config(config, spec: TaskSpec) -> None:
    """The task's label names into a classifier's config, so that it predicts "positive", not "LABEL_1"."""
    if spec.label_names and spec.num_labels == len(spec.label_names):
        config.id2label = dict(enumerate(spec.label_names))
        config.label2id = {name: i for i, name in enumerate(spec.label_names)}


def _limit_tokenizer(folder: Path, max_length: int) -> None:
    """The saved tokenizer truncates at the training max length (the model never saw longer inputs)."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["model_max_length"] = max_length
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_checkpoint(model, tokenizer, choice: LayerChoice, folder: str | Path, spec: TaskSpec,
                     provenance: dict, check, *, max_length: int) -> tuple[object, object]:
    """Write `model` cut to `choice` into `folder` (weights, a config with the task's label names, the
    tokenizer limited to `max_length`, a provenance file and :func:`task_card`), reload it with plain
    transformers and call ``check(reloaded)`` before the folder appears: a check that raises leaves nothing
    behind. Returns the reloaded model and what the check returned."""
    small = smaller_copy(model, choice.kept)
    _label_config(small.config, spec)
    with atomic_path(folder, is_dir=True) as tmp:
        small.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _limit_tokenizer(tmp, max_length)
        info = {**provenance, "task": spec.name, "choice": choice.as_dict(),
                "load_with": auto_class_name(spec) + ".from_pretrained"}
        (tmp / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / TASK_INFO_FILE).write_text(json.dumps(task_card(spec, max_length), indent=2) + "\n", encoding="utf-8")
        reloaded = load_exported(tmp, spec)
        if num_layers(reloaded) != choice.depth:
            raise LayersimError(f"the exported model has {num_layers(reloaded)} layers, expected {choice.depth}; "
                                "this is a bug in layersim.models.encoders.smaller_copy.")
        checked = check(reloaded)
    return reloaded, checked


def auto_class_name(spec: TaskSpec) -> str:
    return "AutoModelForMultipleChoice" if spec.format == "multiple_choice" else "AutoModelForSequenceClassification"


def load_exported(folder: str | Path, spec: TaskSpec):
    """An exported checkpoint loaded as a user would: transformers' auto class alone."""
    import transformers

    return getattr(transformers, auto_class_name(spec)).from_pretrained(folder).eval()


def exact_rescore(reloaded, expected: np.ndarray, spec: TaskSpec, encoded: EncodedTask, tokenizer,
                  batch_size: int, device: torch.device, precision: str) -> float:
    """The reloaded model's score on `encoded`; in fp32 its logits must equal `expected` (the in-memory
    truncated model's) bit for bit, else the export is refused."""
    logits = predict(reloaded.to(device), encoded, tokenizer, batch_size, device, precision=precision)
    if precision == "fp32" and not np.array_equal(logits, expected):
        worst = float(np.nanmax(np.abs(logits - expected)))
        raise LayersimError(f"the exported checkpoint's logits differ from the truncated model's by up to {worst:.3g} "
                            "in fp32, expected none; the export was not written.")
    return primary_score(spec, logits, encoded.labels)


@torch.inference_mode()
def time_models(models: dict[str, torch.nn.Module], encoded: EncodedTask, tokenizer, batch_size: int,
                device: torch.device, precision: str, repeats: int) -> dict[str, dict[str, float]]:
    """Per model: the median seconds per batch of `batch_size` and the examples per second over `encoded`,
    the models timed in turn on the same batches after one warm-up pass each (median over `repeats`)."""
    batches = [to_device(batch, device) for _, batch in
               length_sorted_batches(encoded, batch_size, tokenizer, with_labels=False)]
    per_batch = {name: [] for name in models}
    per_pass = {name: [] for name in models}

    def one_pass(model) -> list[float]:
        times = []
        for batch in batches:
            start = time.perf_counter()
            with autocast(device, precision):
                model(**batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return times

    for model in models.values():
        model.eval()
        one_pass(model)
    for _ in range(repeats):
        for name, model in models.items():
            times = one_pass(model)
            per_batch[name].extend(times)
            per_pass[name].append(sum(times))
    return {name: {"seconds_per_batch": float(np.median(per_batch[name])),
                   "examples_per_second": len(encoded) / float(np.median(per_pass[name]))} for name in models}


def export_timings(timings: dict) -> dict:
    """The measured times per batch size (:func:`time_models` of the full and the exported model) and the
    speed-ups (full ÷ exported, median seconds per batch). Wall-clock numbers: they go to the stage's timings
    file, never into an output DVC hashes (a rerun would never give the same dvc.lock)."""
    sizes = sorted(timings)
    return {"timing": {f"batch_{size}": {name: {key: round(value, 6) for key, value in times.items()}
                                         for name, times in timings[size].items()} for size in sizes},
            "speedup": {f"batch_{size}": round(timings[size]["full"]["seconds_per_batch"]
                                               / timings[size]["exported"]["seconds_per_batch"], 3) for size in sizes}}


def export_report(spec: TaskSpec, scores: dict, chosen: LayerChoice, exported: torch.nn.Module, exported_score: float,
                  full_model: torch.nn.Module, *, seed: int, tolerance: float, examples: tuple[int, int]):
    """The export stage's metrics, plot rows and figure from the scores by split ("train", "validation") and
    choice, and the numbers of (train, validation) `examples`: the choice (scored on the train examples it was
    made on, and on validation from the saved files), the full model, parameters, and per depth the choice best
    on the train examples, scored on both splits (validation chooses nothing). No timings: see export_timings."""
    from layersim.reporting.plots import export_curve

    full = max(scores["train"], key=lambda c: c.depth)
    metrics = {"metric": spec.primary_metric, "seed": seed, "tolerance": tolerance,
               "selection_examples": examples[0], "validation_examples": examples[1],
               "full": {"layers": full.depth, "train": round(scores["train"][full], 6),
                        "validation": round(scores["validation"][full], 6)},
               "exported": {**chosen.as_dict(), "train": round(scores["train"][chosen], 6),
                            "validation": round(exported_score, 6),
                            "parameters": sum(t.numel() for t in exported.parameters())},
               "full_parameters": sum(t.numel() for t in full_model.parameters())}
    per_depth = best_per_depth(scores["train"])
    splits = ("train", "validation")
    curves = {split: {n: scores[split][c] for n, c in per_depth.items()} for split in splits}
    rows = [{"series": split, "layers": n, "split": split, "score": round(value, 6)} for split, points in curves.items()
            for n, value in points.items()]
    figure = export_curve(curves, {split: scores[split][full] for split in splits}, tolerance, chosen.depth,
                          spec.primary_metric, f"export — {spec.name}: {chosen.describe()}")
    return metrics, rows, figure
