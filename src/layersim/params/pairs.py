"""align.pairs: which runs and models Ren et al.'s maps align (ORIG, ``FT<i>``, registry models); and
align.pretraining_models: models that differ in their pretraining seed, and the seeded sample of their pairs."""

from __future__ import annotations

import re
from itertools import combinations
from typing import Protocol

import numpy as np


class _Runs(Protocol):
    """What the functions here read of :class:`layersim.params.schema.Params` (not imported from there:
    schema imports this module for align.pairs' check)."""

    seeds: tuple[int, ...]
    align: object  # AlignParams, whose `pairs` is read


ORIG_RUN = "ORIG"             # align.pairs: the pretrained `model`
_FINETUNED_RUN = re.compile(r"FT([1-9][0-9]{0,3})")  # align.pairs: FT<i>, fine-tuned with the i-th seed


def pair_member(name: str) -> tuple[str, int | str]:
    """What a name of align.pairs stands for: ("orig", "ORIG"), ("finetuned", i) for ``FT<i>`` (1-based seed
    position), or ("model", name) for a registry model, pretrained."""
    if name == ORIG_RUN:
        return "orig", name
    match = _FINETUNED_RUN.fullmatch(name)
    return ("finetuned", int(match.group(1))) if match else ("model", name)


def aligned_pairs(params: _Runs) -> tuple[tuple[str, str], ...]:
    """align.pairs, or its default: [FT1, FT2] with two seeds or more, then [ORIG, FT1]."""
    if params.align.pairs is not None:
        return params.align.pairs
    return ((("FT1", "FT2"),) if len(params.seeds) > 1 else ()) + ((ORIG_RUN, "FT1"),)


def paired_models(params: _Runs) -> list[str]:
    """The registry models (pretrained) that align.pairs or align.pretraining_models name, each once, in order."""
    names = [name for pair in aligned_pairs(params) for name in pair if pair_member(name)[0] == "model"]
    return list(dict.fromkeys(names + list(params.align.pretraining_models)))


def _align_pairs(key: str, value) -> tuple[tuple[str, str], ...] | None:
    """align.pairs: null, or a list of [source, target] pairs of ORIG, ``FT<i>`` or registry model names."""
    from layersim.params.names import check_model
    from layersim.params.rules import fail

    if value is None:
        return None
    allowed = ("null or a non-empty list of distinct [source, target] pairs, each ORIG (the pretrained model), "
               "FT<i> (fine-tuned with the i-th seed) or a registry model name, e.g. [[FT1, FT2], [ORIG, FT1]]")
    if not (isinstance(value, list) and value and all(isinstance(pair, list) and len(pair) == 2 and
                                                      all(isinstance(name, str) for name in pair) for pair in value)):
        raise fail(key, value, allowed)
    pairs = tuple(tuple(pair) for pair in value)
    for source, target in pairs:
        if source == target:
            raise fail(key, value, f"a list of pairs of two different runs ([{source}, {target}] aligns a run with itself)")
        for name in (source, target):
            if pair_member(name)[0] == "model":
                check_model(key, name, entry=True)
    if len(set(pairs)) != len(pairs):
        raise fail(key, value, "a list without repeated pairs")
    return pairs


def pretraining_pairs(params: _Runs) -> tuple[tuple[str, str], ...]:
    """The pairs of align.pretraining_models compared (Ren et al. §4.1: "we randomly select 8 model pairs" of
    the C(25, 2) = 300): all C(k, 2) pairs in list order when align.num_pairs is null, else a draw of that
    many without repeats, seeded by align.pair_seed and kept in list order, so that a larger draw from the
    same seed is not a superset of a smaller one but any draw is reproducible."""
    models = params.align.pretraining_models
    every = list(combinations(models, 2))
    wanted = params.align.num_pairs
    if wanted is None:
        return tuple(every)
    check_pair_count(models, wanted)
    chosen = np.sort(np.random.default_rng(params.align.pair_seed).choice(len(every), size=wanted, replace=False))
    return tuple(every[k] for k in chosen)


def check_pair_count(models, wanted: int | None) -> None:
    """Refuse an align.num_pairs larger than the C(k, 2) pairs of the k align.pretraining_models (checked with
    params.yaml, before any fine-tuning)."""
    from layersim.errors import LayersimError

    count = len(models) * (len(models) - 1) // 2
    if models and wanted is not None and wanted > count:
        raise LayersimError(f"params.yaml: align.num_pairs = {wanted}, but the {len(models)} models of "
                            f"align.pretraining_models make only {count} pairs; set it to at most {count} or null "
                            "(every pair).")


def _pretraining_models(key: str, value) -> tuple[str, ...]:
    """align.pretraining_models: [] or a list of at least two distinct registry model names."""
    from layersim.params.names import check_model
    from layersim.params.rules import fail

    allowed = ("[] or a list of at least two distinct registry models that differ only in their pretraining seed, "
               "e.g. [multiberts-0, multiberts-1, multiberts-2]")
    if not (isinstance(value, list) and all(isinstance(name, str) for name in value)
            and len(set(value)) == len(value) and len(value) != 1):
        raise fail(key, value, allowed)
    for name in value:
        check_model(key, name, entry=True)
    return tuple(value)
