"""Validation of a parsed params.yaml document: the top-level keys, each section against its declaration
(:mod:`layersim.params.schema`), and the rules that tie keys of different sections (or the model) together.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from types import SimpleNamespace
from typing import Any

from layersim.errors import LayersimError
from layersim.models.registry import MODELS, MULTIBERTS_SEEDS
from layersim.models.tiny_configs import HIDDEN as TINY_HIDDEN, LAYERS as TINY_LAYERS
from layersim.params.model_kind import (DECODERS, LAST_TOKEN_HEADS, OWN_HEAD_ARCHITECTURES, architecture,  # noqa: F401
                                       family as model_family, head_pooling, own_head_pooling, resolve_model_kind)
from layersim.params.names import check_model, check_task, weights
from layersim.params.rules import MAX_SEED, check_value, fail, repeated, shown
from layersim.params.pairs import check_pair_count, pair_member
from layersim.params.schema import DEVICE, MAX_PERMUTATIONS, SECTIONS, TOP_LEVEL, Params
from layersim.params.vocabulary import NO_NULL_MEASURE_NAMES
from layersim.params.user_tasks import check_user_tasks
from layersim.data.tasks import TASKS, get_task, register_user_tasks

# Longest input (special tokens included) that the position embeddings of the registry models whose
# config is known offline can encode: the tiny configs have 130 positions, RoBERTa's and XLM-R's start after
# the padding index (0 with the MiniLM tokenizer the tiny models use), MPNet's after its fixed padding index 1;
# all-MiniLM-L6-v2 has 512.
# Models with only relative or rotary positions (DeBERTa-v2/v3, ModernBERT, XLNet, Llama, Qwen2, Mistral)
# overflow nothing, so they have no entry. tests/test_params.py checks these against the real models; hub
# models are not known offline.
_TINY_ABSOLUTE = {"bert": 130, "albert": 130, "electra": 130, "distilbert": 130, "gpt2": 130, "roberta": 129,
                  "xlm-roberta": 129, "mpnet": 128}
ABSOLUTE_POSITION_FAMILIES = tuple(_TINY_ABSOLUTE)  # the others' positions are relative or rotary
MODEL_MAX_LENGTH = {**{f"tiny-{arch}": limit for arch, limit in _TINY_ABSOLUTE.items()},
                    "tiny-bert-seed1": 130, "tiny-bert-seed2": 130, "minilm-l6": 512}

# Width of the registry models' layers (tests/test_params.py checks the offline ones against the real
# models; the hub ones are their published configs), for checks of measures against the sizes.
MODEL_HIDDEN_SIZE = {**{spec.name: (spec.shape or (TINY_HIDDEN, TINY_LAYERS))[0]
                        for spec in MODELS.values() if spec.source == "tiny"}, "minilm-l6": 384,
                     "roberta-base": 768, "electra-base": 768, "bert-base-uncased": 768, "albert-large-v2": 1024,
                     "xlm-roberta-base": 768, "distilbert-base-uncased": 768, "deberta-v3-base": 768,
                     "modernbert-base": 768, "mpnet-base": 768, "xlnet-base-cased": 768, "gpt2": 768,
                     "qwen2.5-0.5b": 896, "tinyllama-1.1b": 2048, "mistral-7b": 4096,
                     **{f"multiberts-{n}": 768 for n in range(MULTIBERTS_SEEDS)}}

def _suggestion(section: str | None, key: Any) -> str:
    """' (did you mean …?)' for a mistyped key: a close match in its own section (or among the top-level
    keys), else the same key in another section; '' when nothing fits."""
    own = [f.name for f in dataclasses.fields(SECTIONS[section])] if section else list(TOP_LEVEL)
    close = difflib.get_close_matches(str(key), own, n=1)
    if close:
        return f" (did you mean {section + '.' if section else ''}{close[0]}?)"
    elsewhere = [f"{name}.{key}" for name, cls in SECTIONS.items()
                 if name != section and key in {f.name for f in dataclasses.fields(cls)}]
    return f" (did you mean {' or '.join(elsewhere)}?)" if elsewhere else ""


# Keys of earlier versions of params.yaml → what replaced them.
_RENAMED = {"similarity.poolings": "the poolings are the keys of similarity.measures, e.g. "
                                   "measures: {cls: [linear_cka], tokens: [linear_cka, svcca]}"}


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:  # `finetune:` with nothing under it, like a missing section, takes every default
        raw = {}
    if not isinstance(raw, dict):
        raise fail(name, raw, "a mapping of keys to values")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [key for key in raw if key not in fields]
    if unknown:
        key = unknown[0]
        if f"{name}.{key}" in _RENAMED:
            raise LayersimError(f"params.yaml: {name}.{key} is no longer a key; {_RENAMED[f'{name}.{key}']}.")
        raise LayersimError(f"params.yaml: unknown key '{name}.{str(key)[:100]}'{_suggestion(name, key)}; valid keys of "
                            f"{name} are: {', '.join(fields)}.")
    return cls(**{key: check_value(f"{name}.{key}", fields[key], value) for key, value in raw.items()})


def parse_params(raw: Any) -> Params:
    """Validate a parsed params.yaml document and return typed params."""
    model, tasks, seeds, user_tasks = _parse_runs(raw)
    device = raw.get("device", "auto")
    if not isinstance(device, str) or not re.fullmatch(DEVICE, device):
        raise fail("device", device, "auto, cpu, cuda or cuda:N (auto: the first GPU if there is one, else the CPU)")
    sections = {name: _build_section(name, cls, raw.get(name)) for name, cls in SECTIONS.items()}
    sections = resolve_model_kind(model, sections)  # 'head' poolings and truncate.head 'auto' for this model
    _check_across_sections(model, {**sections, "tasks": tasks, "seeds": seeds})
    return Params(model=model, tasks=tuple(tasks), seeds=tuple(seeds), device=device, user_tasks=user_tasks,
                  **sections)


# The sections that name what an experiment reads from the hub (layersim.params.lockfile.wanted).
SOURCE_SECTIONS = ("download", "compare", "align")


def parse_sources(raw: Any) -> SimpleNamespace:
    """What `raw` names to read: model, tasks, seeds, user_tasks and the sections SOURCE_SECTIONS, each checked on
    its own, without the rules that tie them to the rest of params.yaml (a max_length too long for the model, a
    pooling not extracted: the stages' business, not the lock's)."""
    model, tasks, seeds, user_tasks = _parse_runs(raw)
    return SimpleNamespace(model=model, tasks=tuple(tasks), seeds=tuple(seeds), user_tasks=user_tasks,
                           **{name: _build_section(name, SECTIONS[name], raw.get(name)) for name in SOURCE_SECTIONS})


def _parse_runs(raw: Any) -> tuple[str, list[str], list[int], Any]:
    """The checked model, tasks, seeds and user tasks of a parsed params.yaml (its user tasks registered)."""
    if not isinstance(raw, dict):
        empty = " (an empty document)" if raw is None else ""
        raise LayersimError(f"params.yaml must be a mapping of sections, got {type(raw).__name__}{empty}.")
    unknown = [key for key in raw if key not in TOP_LEVEL]
    if unknown:
        raise LayersimError(f"params.yaml: unknown key {shown(unknown[0])}{_suggestion(None, unknown[0])}; valid "
                            f"top-level keys are: {', '.join(sorted(TOP_LEVEL))}.")
    for key in ("model", "tasks", "seeds"):
        if key not in raw:
            raise LayersimError(f"params.yaml: the key {key!r} is missing.")
    model = raw["model"]
    if not isinstance(model, str):
        raise fail("model", model, "a single model name (a scalar, not a list)")
    check_model("model", model)
    tasks, seeds = raw["tasks"], raw["seeds"]
    if not isinstance(tasks, list) or not tasks or not all(isinstance(task, str) for task in tasks):
        raise fail("tasks", tasks, "a non-empty list of task names")
    user_tasks = check_user_tasks("user_tasks", raw.get("user_tasks"), TASKS)
    register_user_tasks(user_tasks)  # so that get_task knows them in every stage (params are read first)
    for task in tasks:
        check_task("tasks", task)
    same = repeated(tasks)
    if same is not None:
        raise fail("tasks", tasks, f"a list without repeated names ({same!r} is given twice)")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                           for s in seeds):
        raise fail("seeds", seeds, "a non-empty list of non-negative integers")
    if max(seeds) > MAX_SEED:
        raise fail("seeds", seeds, f"a list of integers from 0 to {MAX_SEED}")
    same = repeated(seeds)
    if same is not None:
        raise fail("seeds", seeds, f"a list without repeated seeds ({same} is given twice)")
    return model, tasks, seeds, user_tasks


def _check_across_sections(model: str, sections: dict[str, Any]) -> None:
    """Rules that tie keys of different sections (or the model) together."""
    finetune, extract, similarity = sections["finetune"], sections["extract"], sections["similarity"]
    compare, align = sections["compare"], sections["align"]
    if finetune.warmup_steps >= finetune.max_steps:
        raise LayersimError(f"params.yaml: finetune.warmup_steps = {finetune.warmup_steps} must be smaller than "
                            f"finetune.max_steps = {finetune.max_steps}.")
    if finetune.eval_every > finetune.max_steps:
        raise LayersimError(f"params.yaml: finetune.eval_every = {finetune.eval_every} is larger than "
                            f"finetune.max_steps = {finetune.max_steps}; it must be at most max_steps, or 0 to "
                            "evaluate only at the end.")
    # finetune.checkpoint_every >= max_steps is allowed: like 0, it saves no intermediate state.
    if finetune.keep_states >= finetune.max_steps:
        raise LayersimError(f"params.yaml: finetune.keep_states = {finetune.keep_states} must be smaller than "
                            f"finetune.max_steps = {finetune.max_steps} (a kept state per step at most, the final "
                            "model apart).")
    if similarity.random_controls > 1 and similarity.random_control is None:
        raise LayersimError(f"params.yaml: similarity.random_controls = {similarity.random_controls} needs "
                            "similarity.random_control, the first control's init seed; set it (e.g. 0) or set "
                            "random_controls to 1.")
    if finetune.method in finetune.compare_methods:
        raise LayersimError(f"params.yaml: finetune.compare_methods = {list(finetune.compare_methods)} holds "
                            f"finetune.method = {finetune.method}, whose runs it is compared with; list only other "
                            "methods.")
    if "lora" in (finetune.method, *finetune.compare_methods) and architecture(model) == "xlnet":
        raise LayersimError(f"params.yaml: finetune method lora cannot adapt model {model!r}: XLNet keeps its "
                            "attention weights as bare tensors, not modules an adapter wraps; use method: full "
                            "(and no lora in compare_methods).")
    width = MODEL_HIDDEN_SIZE.get(model)
    if "lora" in (finetune.method, *finetune.compare_methods) and width and finetune.lora.rank > width:
        raise LayersimError(f"params.yaml: finetune.lora.rank = {finetune.lora.rank} is larger than the hidden size "
                            f"{width} of model {model!r}; an update B·A of a matrix {width} wide has rank at most {width}, so "
                            f"use a rank from 1 to {width} (Hu et al.: 1 to 64).")
    if finetune.method == "lora" and sections["freeze"].recipe == "finetune":
        raise LayersimError("params.yaml: freeze.recipe = finetune reuses the finetune stage's runs as the unfrozen "
                            "ones, but freezing layers is an experiment of full fine-tuning and finetune.method = "
                            "lora; use freeze.recipe: wu, or method: full.")
    paired = [name for pair in align.pairs or () for name in pair if pair_member(name)[0] == "model"]
    for name, where in [(model, "model"), *((other, "of compare.models") for other in compare.models),
                        *((other, "of align.pairs") for other in paired)]:
        limit = MODEL_MAX_LENGTH.get(name)
        if limit is not None and finetune.max_length > limit:
            described = f"model {name!r}" if where == "model" else f"{name!r} {where}"
            raise LayersimError(f"params.yaml: finetune.max_length = {finetune.max_length} is too long for "
                                f"{described}; it must be at most {limit}, the tokens its position embeddings hold.")
    missing = [q for q in similarity.poolings if q not in extract.poolings]
    if missing:
        raise LayersimError(f"params.yaml: similarity.measures has the pooling {missing[0]!r}, which is not among "
                            f"extract.poolings = {list(extract.poolings)}; extract it or pick one of those.")
    if similarity.attention_measures and not extract.attention_examples:
        raise LayersimError(f"params.yaml: similarity.attention_measures = {list(similarity.attention_measures)} needs "
                            "attention maps, but extract.attention_examples = 0; set it above 0 or use [].")
    if align.attention and not extract.attention_examples:
        raise LayersimError("params.yaml: align.attention = true needs attention maps, but extract.attention_examples "
                            "= 0; set it above 0 or align.attention to false.")
    _check_permutations_reach(similarity)
    check_pair_count(align.pretraining_models, align.num_pairs)
    if align.pooling not in extract.poolings:
        raise LayersimError(f"params.yaml: align.pooling = {align.pooling!r} is not among "
                            f"extract.poolings = {list(extract.poolings)}; extract it or pick one of those.")
    if weights(model) in {weights(name) for name in compare.models}:
        raise LayersimError(f"params.yaml: compare.models = {list(compare.models)} repeats model = {model!r}; "
                            "list only the other encoders to compare with it.")
    freeze_seeds = sections["freeze"].seeds
    if freeze_seeds is not None and not set(freeze_seeds) <= set(sections["seeds"]):
        raise LayersimError(f"params.yaml: freeze.seeds = {list(freeze_seeds)} has seeds that are not in seeds = "
                            f"{list(sections['seeds'])}; the frozen runs are compared with the unfrozen ones of the "
                            "same seed, so pick from those (or null for all).")
    for pair in align.pairs or ():
        for name in pair:
            kind, index = pair_member(name)
            if kind == "finetuned" and index > len(sections["seeds"]):
                raise LayersimError(f"params.yaml: align.pairs has {name!r}, but seeds = {list(sections['seeds'])} "
                                    f"holds {len(sections['seeds'])} seed(s); FT<i> is the run of the i-th seed, so "
                                    f"use FT1 to FT{len(sections['seeds'])}.")
        widths = [MODEL_HIDDEN_SIZE.get(model if pair_member(name)[0] != "model" else name) for name in pair]
        if None not in widths and widths[0] != widths[1]:
            raise LayersimError(f"params.yaml: align.pairs has [{pair[0]}, {pair[1]}], of widths {widths[0]} and "
                                f"{widths[1]}; a pair must have one width (the INN is a bijection), so pair models "
                                "of the same width.")
    _check_head_poolings(model, sections)


def _check_head_poolings(model: str, sections: dict[str, Any]) -> None:
    """The pooling each model's own head reads is extracted (truncate trains its fresh heads on it), a model
    whose head reads the last token is asked for no "cls" pooling, and a decoder for no multiple choice."""
    extract, compare = sections["extract"], sections["compare"]
    family = model_family(model)
    head = own_head_pooling(model)
    if head not in extract.poolings:
        raise LayersimError(f"params.yaml: extract.poolings = {list(extract.poolings)} must include {head!r} (or "
                            f"'head'); the truncate stage trains its heads on the token the model's own head reads "
                            f"({head}).")
    compared = [(other, "of compare.models", sections["similarity"].poolings) for other in compare.models]
    for name, where, poolings in [(model, "model", extract.poolings), *compared]:
        if architecture(name) in LAST_TOKEN_HEADS and "cls" in poolings:
            setting = "extract.poolings" if where == "model" else "similarity.measures"
            described = f"model {name!r}" if where == "model" else f"{name!r} {where}"
            raise LayersimError(f"params.yaml: {setting} has 'cls', but {described} is a {architecture(name)} model, "
                                "whose head reads the last non-pad token and whose first token is no sequence "
                                "representation; use head (its last token), mean, last or tokens.")
    if sections["truncate"].head == "own" and family is not None and family not in OWN_HEAD_ARCHITECTURES:
        raise LayersimError(f"params.yaml: truncate.head = 'own', but the task head of model {model!r} (a {family} "
                            f"model) cannot be copied yet (only {', '.join(OWN_HEAD_ARCHITECTURES)}); use "
                            "truncate.head: auto or fresh.")
    if family in DECODERS:
        for task in sections["tasks"]:
            if get_task(task).format == "multiple_choice":
                raise LayersimError(f"params.yaml: task {task!r} is multiple choice, which model {model!r} (a "
                                    f"{family} decoder) cannot fine-tune: transformers has no multiple-choice head "
                                    "for decoders; pick a classification or regression task.")


def _check_permutations_reach(similarity) -> None:
    """A sampled null of B draws gives p ≥ 1/(B + 1): at or above the significance level, no cell of any measure
    but linear CKA (whose exact null gives continuous p-values) can be above chance, whatever the correction.
    The bound that depends on the heatmap's cells (layersim.similarity.inference.correction) is checked by the stage."""
    sampled = sorted({m for measures in similarity.measures.values() for m in measures
                      if m != "linear_cka" and m not in NO_NULL_MEASURE_NAMES})
    draws, level = similarity.permutations, similarity.significance
    if not sampled or 1.0 / (draws + 1) < level:
        return
    needed = max(1, math.floor(1.0 / level) - 2)
    while not 1.0 / (needed + 1) < level:  # the same comparison as the hatching's (p < significance)
        needed += 1
    if needed > MAX_PERMUTATIONS:
        raise LayersimError(f"params.yaml: similarity.significance = {level:g} is out of reach of "
                            f"{', '.join(sampled)}: it needs at least {needed} permutations, more than the "
                            f"{MAX_PERMUTATIONS:,} similarity.permutations allows; raise it above "
                            f"1/{MAX_PERMUTATIONS + 1} or measure only with linear_cka (exact null).")
    raise LayersimError(f"params.yaml: similarity.permutations = {draws} cannot reach similarity.significance = "
                        f"{level:g}: the smallest p-value of {draws} permutations is 1/{draws + 1}, so no cell of "
                        f"{', '.join(sampled)} could ever be above chance; use at least {needed} permutations.")
