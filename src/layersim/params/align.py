"""The align section of params.yaml (Ren et al. 2023: maps between two models' representation spaces, layersim.align);
:mod:`layersim.params.schema` declares it beside the other sections."""

from __future__ import annotations

from dataclasses import dataclass

from layersim.params.pairs import _align_pairs, _pretraining_models
from layersim.params.rules import FRACTION, NON_NEGATIVE, POSITIVE, SEED, at_least, at_most, knob
from layersim.params.vocabulary import ALIGN_METHODS, ENOUGH, EXAMPLE_POOLING_NAMES, LEARNING_RATE, _BATCH, _EXAMPLES, _WIDTH


@dataclass(frozen=True)
class AlignParams:  # Ren et al. 2023; see layersim.align
    pooling: str = knob("mean", "the per-example points mapped (Ren §3.1: mean-pooled)", names=EXAMPLE_POOLING_NAMES)
    methods: tuple[str, ...] = knob(ALIGN_METHODS, "the maps fitted", names=ALIGN_METHODS)
    ridge: float = knob(0.0, "linear: ridge penalty on standardised features", NON_NEGATIVE)
    svcca_variance: float = knob(0.99, "svcca: share of variance the kept directions explain", FRACTION)
    inn_depth: int = knob(4, "inn: affine coupling blocks", POSITIVE, at_most(256, "coupling blocks"))
    inn_hidden: int = knob(256, "inn: width of each block's scale/translation network", POSITIVE,
                           at_most(_WIDTH, "units per layer"))
    inn_init: str = knob("identity", "inn: its start — identity (the flow maps standardised X to itself, Ren's INN "
                                     "trained from scratch) or least_squares (the linear layer starts at the "
                                     "least-squares fit, so \"INN beats linear\" is nearly built in)",
                         names=("identity", "least_squares"))
    mlp_depth: int = knob(2, "mlp: hidden layers", POSITIVE, at_most(256, "hidden layers"))
    mlp_hidden: int = knob(512, "mlp: units per hidden layer", POSITIVE, at_most(_WIDTH, "units per layer"))
    steps: int = knob(600, "inn and mlp: Adam steps (5% warm-up, cosine decay)", POSITIVE,
                      at_most(10**7, "optimiser steps"))
    learning_rate: float = knob(1e-3, "inn and mlp: peak learning rate", LEARNING_RATE)
    batch_size: int = knob(256, "inn and mlp: examples per step", POSITIVE, at_most(_BATCH, "examples per step"))
    matrix_steps: int = knob(200, "INN steps per cell of the layer × layer matrix (L² fits)", POSITIVE,
                             at_most(10**6, "optimiser steps per cell of the layer × layer matrix"))
    synthetic_scale: float = knob(0.5, "weight scale of the random INN to recover: how non-linear it is", POSITIVE)
    synthetic_hidden: int = knob(64, "units per coupling block of the random INN to recover: how many non-linear "
                                     "directions it has", POSITIVE, at_most(_WIDTH, "units per layer"))
    synthetic_rows: int = knob(20000, "rows of the pretrained last layer (a seeded sample of train and validation) "
                                      "the random INN is recovered from, 80 % fitted, 20 % held out",
                               at_least(3, "rows"), at_most(10**7, "rows"))
    synthetic_steps: int = knob(5000, "inn and mlp: Adam steps when recovering the random INN", POSITIVE,
                                at_most(10**7, "optimiser steps"))
    synthetic_learning_rate: float = knob(2e-3, "inn and mlp: peak learning rate when recovering the random INN",
                                          LEARNING_RATE)
    seed: int = knob(0, "seed of the maps' initialisation and batches", SEED)
    attention: bool = knob(False, "also align the attention weights, per layer, of each pair (Ren Fig. 4 / 5b; points: "
                                  "attention maps of extract.attention_examples examples as the extract stage keeps "
                                  "them, one feature per head)")
    pairs: tuple[tuple[str, str], ...] | None = knob(
        None, "the [source, target] pairs aligned: ORIG (the pretrained model), `FT<i>` (fine-tuned with the i-th "
              "seed) or a registry model, pretrained (e.g. multiberts-0 and multiberts-1: two pretraining seeds); "
              "null: [FT1, FT2] with two seeds or more, then [ORIG, FT1]", check=_align_pairs)
    pretraining_models: tuple[str, ...] = knob(
        (), "registry models that differ only in their pretraining seed (Ren: the 25 MultiBERTs, multiberts-0 … "
            "multiberts-24), each fine-tuned on every task with the first of seeds (stage finetune_pretrained); "
            "their pairs' alignment errors before and after fine-tuning, attention alignment and injection, mean ± sd "
            "over the pairs ([]: none)", check=_pretraining_models)
    num_pairs: int | None = knob(None, "pairs of align.pretraining_models compared, a seeded draw from all C(k, 2) "
                                       "(Ren: 8 of the 300); null: every pair", POSITIVE, at_most(10**5, "pairs"))
    pair_seed: int = knob(0, "seed of the draw of align.num_pairs pairs", SEED)
    train_rows: int | None = knob(None, "train examples the maps are fitted on, a seeded draw (align.seed) from the "
                                        "extracted ones (Ren: 1,600); null: every one", ENOUGH,
                                  at_most(_EXAMPLES, "examples"))
    test_rows: int | None = knob(None, "validation examples the maps are scored on, a seeded draw (align.seed) from the "
                                       "extracted ones (Ren: 1,600); null: every one", ENOUGH,
                                 at_most(_EXAMPLES, "examples"))
