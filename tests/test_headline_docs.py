"""Every headline a stage writes is in docs/outputs.md's table, with a null or interval beside it or marked
descriptive (tests/headline_docs.py reads the table; test_pipeline walks a real run's metrics files with it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dvc_yaml import from_root
from headline_docs import AS_ABOVE, DESCRIPTIVE, ITSELF, rows_of, table, undocumented
from layersim.experiments.dynamics import half_way_headline
from layersim.experiments.freeze import freeze_headline
from layersim.experiments.weights import weights_headline
from layersim.reporting.headlines import (align_headline, compare_headline, similarity_headline, skip_headline,
                                          summary_headline, truncate_headline)
from test_headlines import FULL_SIMILARITY

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_ITEM = {"task": "rte", "seed": "1", "method": "lora"}  # a value for each ${item.…} of dvc.yaml


def stage_metrics_files() -> list[str]:
    """The metrics files dvc.yaml declares, with an example value in each ${item.…}."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    files = []
    for stage in stages.values():
        for entry in stage.get("metrics", []):
            path = from_root(next(iter(entry)) if isinstance(entry, dict) else entry)
            if path.startswith("metrics/"):
                files.append(re.sub(r"\$\{item\.(\w+)\}", lambda m: EXAMPLE_ITEM[m.group(1)], path))
    return files


def test_every_row_says_what_stands_beside_its_keys():
    """Each row names its null or interval keys (keys the table documents for the same file), or says that it is one
    itself, or that it is descriptive."""
    assert len(table()) > 30
    for row in table():
        assert row.files and row.keys, row
        words = row.uncertainty.lower()
        if words.startswith((DESCRIPTIVE, ITSELF, AS_ABOVE)):
            continue
        documented = {key for file in row.files for other in rows_of(file.replace("<", "x").replace(">", ""))
                      for key in other.keys}
        assert set(row.named()) & documented, (row.keys, row.uncertainty)  # params may be named beside them


def test_every_metrics_file_dvc_declares_is_in_the_table():
    files = stage_metrics_files()
    assert "metrics/similarity/rte/metrics.json" in files and "metrics/summary.json" in files
    assert [file for file in files if not rows_of(file)] == []


SKIP = {"largest_span_within_tolerance": {"first": 2, "last": 3, "length": 2}, "prediction": {
    "angular_distance": {"within_length": 0.5, "beyond_position": 0.1},
    "block_influence": {"within_length": 0.4, "beyond_position": None},
    "baselines": {"random_layer": {"within_length": 0.0, "within_length_high": 0.7, "beyond_position_high": 0.4},
                  "position_only": {"within_length": 0.6}}}}
ALIGN = {"alignment_over_pairs": {"finetuning_seeds": {
    "pairs": [], "num_pairs": 2, "linear": {"layer_mean": 0.4, "layer_mean_sd": 0.1},
    "inn": {"layer_mean": 0.3, "layer_mean_sd": 0.1}}}}
WEIGHT_ROWS = [{"seed": seed, "run": f"{label}[{seed}]", "layer": 1, "matrix": matrix, "adapted": matrix in adapted,
                "intruders": 0, "relative_update_norm": 0.1, "update_rank": 2, **({"method": method} if method else {})}
               for method, label, adapted in ((None, "FT", ("query", "value", "key")),
                                              ("lora", "LoRA", ("query", "value")))
               for seed in (1, 2) for matrix in ("query", "key", "value")]


def headlines() -> dict[str, dict]:
    """What each stage's headline function gives on small inputs, by the metrics file it writes."""
    draws = {(row["run"], row["layer"], row["matrix"]): [0, 1, 0] for row in WEIGHT_ROWS}
    return {
        "metrics/similarity/rte/metrics.json": similarity_headline(FULL_SIMILARITY, 0.05),
        "metrics/truncate/rte/metrics.json": truncate_headline({"droppable_top_layers_untuned": 1,
                                                                "droppable_top_layers_tuned": 2}),
        "metrics/skip/rte/metrics.json": skip_headline(SKIP),
        "metrics/align/rte/metrics.json": align_headline(ALIGN),
        "metrics/compare.json": compare_headline({"cls": {"linear_cka": {"FT:rte": {"diagonal": {"layer_01": 0.5}}}}},
                                                 "cls", "linear_cka"),
        "metrics/freeze/rte/metrics.json": freeze_headline({"bottom2": {"score_change": -0.01,
                                                                        "backward_flops_saved": 0.3}}),
        "metrics/dynamics/rte/metrics.json": {"pooling": "cls", "points": 4, "top_layer_final_distance": 0.2,
                                              **half_way_headline([(50.0, [0, 40, 80]), (60.0, [0, 40, 80])])},
        "metrics/weights/rte/metrics.json": weights_headline(WEIGHT_ROWS, "full", draws),
        "metrics/summary.json": summary_headline(
            {"finetune": {"rte": [{"accuracy": 0.7}]}, "similarity": {"rte": {"cls": {"linear_cka": {
                "ft_orig_top": 0.5}}}}, "truncate": {"rte": {"untuned_droppable_top_layers": 1,
                                                          "tuned_droppable_top_layers": 2}}},
            {"rte": "accuracy"}, ("cls", "linear_cka")),
    }


@pytest.mark.parametrize("file", sorted(headlines()))
def test_every_key_a_headline_function_writes_is_documented(file):
    metrics = headlines()[file]
    assert metrics, file  # something was written, so the check below checks something
    assert undocumented(file, metrics) == []


def test_an_undocumented_key_is_found():
    """The walk can fail: a key the table does not name, or a file it has no row for."""
    assert undocumented("metrics/truncate/rte/metrics.json", {"untuned_droppable_top_layers": 1, "new_key": 2}) == [
        "new_key"]
    assert undocumented("metrics/similarity/rte/metrics.json", {"cls": {"linear_cka": {"ft_orig_topp": 1}}}) == [
        "cls.linear_cka.ft_orig_topp"]
    assert rows_of("metrics/unknown/rte/metrics.json") == []
