"""Calibration of the nulls: the false-positive rate of each measure's null on independent data.

For each measure, regime n × d (n < d: 40 × 100, n ≈ d: 60 × 55, n > d: 150 × 15) and distribution
(Gaussian, Student t with 3 degrees of freedom), ``--draws`` independent pairs x, y (n × d each): the share
of p-values ≤ 0.05 and ≤ 0.01 (expected: 0.05 and 0.01; binomial SE ``sqrt(α(1−α)/draws)``) for

* **memory**: ``permutation_test`` — linear CKA's exact moments (Pearson III with the exact mean, variance
  and skewness), ``--permutations`` sampled permutations for the other measures;
* **streamed**: the moments route of a table too large for memory (``LayerMoments`` / ``rotation_null``,
  ``streamed_linear_cka_null``) with its row sample cut to ``--sample-share`` of the rows (default 0.5, so
  the route is the one a 50,000-row table takes: rotations, neuronsim's tails from the sample, linear CKA's
  skewness estimated from the sample). With the default 1,024-row sample these small tables would be
  permuted exactly (= memory).

mixedsim needs more examples than neurons and is skipped where n ≤ d. ``--quick``: 100 draws (α = .01 is then
±0.01).

    python benchmarks/calibration.py --quick        # ~2 min on 2 cores
    python benchmarks/calibration.py                # 400 draws, 99 permutations

``--structured`` runs grouped rows (words, choices); ``--structured --premises`` examples that share a premise
(100 premises × 3 hypotheses) through the similarity stage's own null and bootstrap, with and without the
clusters, and the share of word rows a cluster null can move (:func:`premise_calibration`, :func:`movable_shares`).
``--attention`` the attention maps' null and bootstrap on planted maps (:func:`attention_calibration`); with
``--compare`` through the compare stage's attention heatmap (:func:`attention_compare_calibration`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from layersim.similarity import (LayerMoments, LinearCKAAccumulator, permutation_test, rotation_null,
                                 streamed_linear_cka_null)

REGIMES = [(40, 100), (60, 55), (150, 15)]
MEASURES = ["linear_cka", "svcca", "pwcca", "mean_cca", "neuronsim", "mixedsim"]


def _options(name: str) -> dict:
    return {"variance_threshold": 0.99} if name == "svcca" else {}


def _streamed(name: str, x, y, draws: int, seed: int, sample_rows: int) -> float:
    acc = LinearCKAAccumulator(precision="float64", sample_rows=sample_rows, seed=seed)
    acc.update([x, y])
    if name == "linear_cka":
        return float(streamed_linear_cka_null(acc).p_value[0, 1])
    null = rotation_null(name, LayerMoments(acc), [0], [1], draws=draws, seed=seed, **_options(name))
    return float(null.p_value[0, 0])


def compare_probe(draws: int = 400, permutations: int = 99, measures=("linear_cka", "neuronsim", "svcca")) -> None:
    """The compare stage's 12-task probe (layersim.experiments.compare.probe_result, the stage's own code): two
    representations that share only the tasks (x = a_task + 0.5·e, y = b_task + 0.5·f, a, b, e, f independent;
    12 tasks × 100 rows, d = 64) and, in 3 of the tasks, the 25 four-choice examples' own component (sd 1, one per
    example and representation). False-positive rate at α = 0.05 of the stage's route (centred within task, examples
    permuted within task) and of the mixed probe it replaced (rows as they come, rows permuted); target 0.05 ± 0.03.
    ``python benchmarks/calibration.py --compare-probe``"""
    from layersim.experiments.compare import probe_result
    from layersim.similarity.results import Uncertainty

    task = np.repeat(np.arange(12), 100)
    example = np.concatenate([np.arange(100) // (4 if t >= 9 else 1) + 1000 * t for t in range(12)])
    groups = np.unique(example, return_inverse=True)[1]
    uncertainty = Uncertainty(permutations=permutations, bootstrap=0)
    print(f"compare probe: 12 tasks × 100 rows (3 tasks of 4-choice examples), d = 64; {draws} draws, "
          f"{permutations} permutations")
    print("| measure | stage (within task) α=.05 | mixed probe α=.05 | s |\n|---|---|---|---|")
    for name in measures:
        start, rng = time.perf_counter(), np.random.default_rng(47)
        within, mixed = [], []
        def draw():
            own = rng.normal(size=(groups.max() + 1, 64))[groups] * (task >= 9)[:, None]  # a 4-choice example's
            return rng.normal(size=(12, 64))[task] + own + 0.5 * rng.normal(size=(1200, 64))

        for k in range(draws):
            x, y = draw(), draw()
            for out, keywords in ((within, {"strata": task, "groups": groups}), (mixed, {})):
                result = probe_result({"x": [x], "y": [y]}, name, options=_options(name),
                                      uncertainty=dataclasses.replace(uncertainty, seed=k), **keywords)
                out.append(result.null.p_value[0, 1])
        rates = [f"{np.mean(np.array(p) <= 0.05):.3f}" for p in (within, mixed)]
        print(f"| {name} | {rates[0]} | {rates[1]} | {time.perf_counter() - start:.0f} |", flush=True)


STRUCTURED_MEASURES = ["linear_cka", "debiased_cka", "rbf_cka", "svcca", "pwcca", "mean_cca", "neuronsim", "mixedsim",
                       "procrustes", "shape_metric", "rsa", "knn_jaccard"]


def _structured_designs(rng: np.random.Generator) -> dict:
    """Independent x and y (H0 true) that share how their rows are grouped, d = 20: (x, y, groups) makers."""
    def words(sd, lengths):
        g = np.repeat(np.arange(len(lengths)), lengths)
        return lambda: tuple(sd * rng.normal(size=(len(lengths), 20))[g] + rng.normal(size=(len(g), 20))
                             for _ in range(2)) + (g,)

    unequal = np.random.default_rng(5).integers(5, 16, size=50)  # 50 sentences of 5–15 words (fixed)
    return {"words sd 0": words(0.0, [10] * 50), "words sd 0.3": words(0.3, [10] * 50),
            "words sd 1": words(1.0, [10] * 50), "4-choice sd 1": words(1.0, [4] * 100),
            "unequal words sd 1": words(1.0, unequal)}


def structured(draws: int, permutations: int, measures, streamed: bool) -> None:
    """Structured data (issue 47): the words of sentences (50 × 10, sentence effect sd 0, 0.3, 1), 4-choice
    examples (100 × 4, example sd 1) and sentences of unequal length (50 of 5–15 words, sd 1), x and y independent
    with unit row noise, d = 20. False-positive rate at α = 0.05 (target 0.05 ± 0.03; binomial SE 0.015 at 200
    draws) through the similarity stage's own function (``stacked_null``, as ``phang_result`` calls it): before,
    rows permuted (no groups; linear CKA's exact moments); after, whole examples (``groups``). With
    ``--streamed``, the streamed route too: before, the moments' null (linear CKA's exact moments, the rotation
    null with the row sample cut to half the rows; none for the other measures); after, the block null of a
    random sample of whole examples (``example_sample``, 60 % of the rows here) with its own observed values.
    ``python benchmarks/calibration.py --structured [--streamed] [--draws 200]``"""
    from layersim.similarity.comparisons import stacked_null
    from layersim.similarity.inference.exchangeability import example_sample
    from layersim.similarity.stacked_moments import moments_stacked_null

    options = {"svcca": {"variance_threshold": 0.99}, "rbf_cka": {"sigma_scale": 1.0}}
    print(f"structured data: {draws} draws, {permutations} permutations (linear CKA's block null: at least 199)")
    head = "| design | measure | memory rows | memory blocks |" + (" streamed before | streamed blocks |" if streamed
                                                                   else "") + " s |"
    print(head + "\n|" + "---|" * (head.count("|") - 1))
    for design in _structured_designs(np.random.default_rng(0)):
        for name in measures:
            start, rng = time.perf_counter(), np.random.default_rng(47)
            make = _structured_designs(rng)[design]
            rates = {key: [] for key in ("rows", "blocks", "streamed rows", "streamed blocks")}
            for k in range(draws):
                x, y, g = make()
                models, cell = {"x": [x], "y": [y]}, np.array([[False, True], [False, False]])
                o = options.get(name, {})
                rates["rows"].append(stacked_null(name, models, permutations=permutations, seed=k, cells=cell,
                                                  **o).p_value[0, 1])
                rates["blocks"].append(stacked_null(name, models, permutations=permutations, seed=k, cells=cell,
                                                    groups=g, **o).p_value[0, 1])
                if streamed:
                    acc = LinearCKAAccumulator(precision="float64", sample_rows=len(x) // 2, seed=k)
                    acc.update([x, y])  # a table larger than its row sample: rotations, estimated skewness
                    null = moments_stacked_null(name, acc, cell, permutations=permutations, seed=k, **o)
                    rates["streamed rows"].append(np.nan if null is None else null.p_value[0, 1])
                    rows = example_sample(g, int(0.6 * len(g)), k)
                    rates["streamed blocks"].append(stacked_null(
                        name, {"x": [x[rows]], "y": [y[rows]]}, permutations=permutations, seed=k, cells=cell,
                        groups=g[rows], **o).p_value[0, 1])
            shown = ["rows", "blocks"] + (["streamed rows", "streamed blocks"] if streamed else [])
            cells = ["—" if np.isnan(rates[key]).all() else f"{np.mean(np.array(rates[key]) <= 0.05):.3f}"
                     for key in shown]
            print(f"| {design} | {name} | " + " | ".join(cells) + f" | {time.perf_counter() - start:.0f} |",
                  flush=True)


# The similarity stage's default measures (params.yaml: head [linear_cka], tokens [linear_cka, svcca, pwcca,
# neuronsim]): the shared-premise design checks each of them.
STAGE_MEASURES = ["linear_cka", "svcca", "pwcca", "neuronsim"]
PREMISES, HYPOTHESES, WIDTH = 100, 3, 20
# ReSi's measures and mutual k-NN / CKNNA, whose intervals' coverage issue 65 measures (:func:`premise_coverage`).
COVERAGE_MEASURES = ["mutual_knn", "cknna", "rank_similarity", "distance_correlation", "second_order_cosine",
                     "rsm_norm", "linear_regression", "size_and_shape", "aligned_cosine", "hard_correlation_match",
                     "soft_correlation_match", "gulp", "eigenspace_overlap"]


def shared_premise(rng: np.random.Generator, premise_sd: float, premises: int = PREMISES, signal: float = 0.0,
                   mixing: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`premises` × 3 hypotheses, one row each (cls), d = 20: x = a_p + e, y = signal·x·A + b_p + f, with a, b
    (premise sd `premise_sd`), e, f (sd 1) independent; at signal 0, x and y share nothing but the premise (H0
    true). Returns x, y and each row's premise (the task table's cluster_id)."""
    premise = np.repeat(np.arange(premises), HYPOTHESES)
    x = premise_sd * rng.normal(size=(premises, WIDTH))[premise] + rng.normal(size=(len(premise), WIDTH))
    y = premise_sd * rng.normal(size=(premises, WIDTH))[premise] + rng.normal(size=(len(premise), WIDTH))
    if signal:
        y = y + signal * x @ mixing
    return x, y, premise


def stage_numbers(measure: str, x: np.ndarray, y: np.ndarray, groups: np.ndarray | None, seed: int,
                  bootstrap: int = 200):
    """FT–ORIG's p-value and bootstrap interval of one layer pair as the similarity stage computes them
    (``phang_result`` with the stage's default similarity params; ``groups``: the tables' cluster ids, or None
    for one example per row as before clusters)."""
    import dataclasses as dc

    from layersim.params.schema import SimilarityParams
    from layersim.similarity.comparisons import stacked_matrix
    from layersim.similarity.results import phang_result, settings

    options, uncertainty = settings(SimilarityParams())
    uncertainty = dc.replace(uncertainty, seed=seed, bootstrap=bootstrap)
    models, sizes = {"ORIG": [x], "FT[1]": [y]}, {"ORIG": 1, "FT[1]": 1}
    o = options.get(measure, {})
    result = phang_result(measure, stacked_matrix(measure, models, **o), sizes, models=models,
                          uncertainty=uncertainty, groups=groups, options=o)
    found = next(c for c in result.comparisons if c.key == "ft_orig")
    low, high = (np.nan, np.nan) if found.interval is None else (found.interval[0][0], found.interval[1][0])
    return float(found.p_value[0, 0]), float(low), float(high)


def premise_population(measure: str, premise_sd: float, signal: float, mixing: np.ndarray,
                       premises: int = 20_000) -> float:
    """The measure on a large sample of the coverage design (60,000 rows): the value its intervals should cover."""
    from layersim.params.schema import SimilarityParams
    from layersim.similarity import similarity
    from layersim.similarity.results import settings

    x, y, _ = shared_premise(np.random.default_rng(123), premise_sd, premises, signal, mixing)
    return similarity(measure, x, y, **settings(SimilarityParams())[0].get(measure, {}))


def premise_calibration(draws: int, measures, coverage_draws: int) -> None:
    """The shared-premise design (issue 63; the fidelity review's §1): 100 premises × 3 hypotheses, d = 20,
    premise sd 0.5 and 1. False-positive rate at α = 0.05 of the similarity stage's null (``phang_result``,
    default params: 100 permutations, linear CKA's block null ≥ 199) with one example per block, as before
    clusters, and with the premises as blocks (the tables' cluster_id); then, for the measures the stage gives an
    interval (linear CKA's basic), the coverage of the population value (60,000 rows) by the stage's 95% bootstrap
    interval (200 resamples) on y = 0.5·x·A + b_p + f, with and without the clusters.
    ``python benchmarks/calibration.py --structured --premises [--draws 200]``"""
    from layersim.similarity.inference.bootstrap import chosen_interval

    print(f"shared premises: {PREMISES} × {HYPOTHESES} hypotheses, d = {WIDTH}; {draws} null draws, "
          f"{coverage_draws} coverage draws")
    print("| measure | premise sd | false positives, examples | false positives, premises | coverage, examples "
          "| coverage, premises | s |\n|---|---|---|---|---|---|---|")
    mixing = np.random.default_rng(7).normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
    for name in measures:
        for sd in (0.5, 1.0):
            start, rng = time.perf_counter(), np.random.default_rng(63)
            p = {"examples": [], "premises": []}
            for k in range(draws):
                x, y, premise = shared_premise(rng, sd)
                for unit, groups in (("examples", None), ("premises", premise)):
                    p[unit].append(stage_numbers(name, x, y, groups, k, bootstrap=0)[0])
            covered = {"examples": [], "premises": []}
            if chosen_interval(name, "auto"):
                truth = premise_population(name, sd, 0.5, mixing)
                for k in range(coverage_draws):
                    x, y, premise = shared_premise(rng, sd, signal=0.5, mixing=mixing)
                    for unit, groups in (("examples", None), ("premises", premise)):
                        _, low, high = stage_numbers(name, x, y, groups, k)
                        covered[unit].append(low <= truth <= high)
            cells = [f"{np.mean(np.array(p[u]) <= 0.05):.3f}" for u in p] + [
                f"{np.mean(covered[u]):.3f}" if covered[u] else "— (no interval)" for u in covered]
            print(f"| {name} | {sd} | " + " | ".join(cells) + f" | {time.perf_counter() - start:.0f} |", flush=True)


def premise_coverage(measures, coverage_draws: int, premise_sds=(0.5, 1.0), units=("examples", "premises"),
                     report_every: int = 25) -> None:
    """Coverage of the population value by each measure's 95% bootstrap interval, basic and percentile, on the
    shared-premise design's y = 0.5·x·A + b_p + f (100 premises × 3 hypotheses, d = 20, 200 resamples), rows
    resampled one by one (examples) and whole premises at a time (premises, the stage's cluster bootstrap); for
    measures "auto" may not give an interval yet (the stage's route, :func:`premise_calibration`, shows only the
    chosen one). The population value: :func:`bootstrap.population_value` on a large sample of the design (whole
    premises) or, for the neighbourhood measures, their mean over 1,000 fresh samples of 100 premises: a row's two
    premise-mates are among its 10 nearest in a sample but not among a share-kept neighbourhood of 20,000 rows, so
    the large-sample value is another quantity than the one the sample's k = 10 sees.
    ``python benchmarks/calibration.py --structured --premises --coverage-only --measures … [--coverage-draws 200]``"""
    from bootstrap import NEIGHBOURHOOD, population_value, sample_mean  # benchmarks/bootstrap.py (run as a script)

    from layersim.params.schema import SimilarityParams
    from layersim.similarity.inference.bootstrap import bootstrap_pairs, finish
    from layersim.similarity.results import settings

    mixing = np.random.default_rng(7).normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
    print(f"shared premises: {PREMISES} × {HYPOTHESES} hypotheses, d = {WIDTH}, y = 0.5·x·A + b_p + f; "
          f"{coverage_draws} coverage draws, 200 resamples")
    print("| measure | premise sd | draws | population | mean estimate | resampled | basic | percentile | CPU s |\n"
          "|---|---|---|---|---|---|---|---|---|")
    # The measures and premise sds in turn within each draw (each its own stream, seeded as before, so the samples
    # are those of one measure at a time): a run cut short has as many draws of every measure.
    cases = []
    for name in measures:
        options = settings(SimilarityParams())[0].get(name, {})
        for sd in premise_sds:
            px, py, _ = shared_premise(np.random.default_rng(123), sd, 20_000, 0.5, mixing)

            def fresh(rng, sd=sd):
                return shared_premise(rng, sd, signal=0.5, mixing=mixing)[:2]
            truth = (sample_mean(name, options, fresh, 1_000) if name in NEIGHBOURHOOD
                     else population_value(name, options, px, py, PREMISES * HYPOTHESES))
            cases.append({"name": name, "sd": sd, "options": options, "truth": truth, "seconds": 0.0,
                          "rng": np.random.default_rng(65), "estimates": [],
                          "covered": {unit: {"basic": [], "percentile": []} for unit in units}})
    for k in range(coverage_draws):
        for case in cases:
            start = time.process_time()
            name, sd, truth, covered = case["name"], case["sd"], case["truth"], case["covered"]
            x, y, premise = shared_premise(case["rng"], sd, signal=0.5, mixing=mixing)
            for unit, groups in ((u, premise if u == "premises" else None) for u in units):
                drawn = bootstrap_pairs(name, [x], [y], resamples=200, seed=k, groups=groups, interval="basic",
                                        **case["options"])
                for method, got in covered[unit].items():
                    r = drawn if method == "basic" else finish(name, drawn.estimate, drawn.values, None, 0.95, method)
                    got.append(r.low[0] <= truth <= r.high[0])
            case["estimates"].append(drawn.estimate[0])
            case["seconds"] += time.process_time() - start
            if k + 1 == coverage_draws or (k + 1) % report_every == 0:  # a tally so far (a run cut short keeps it)
                for unit, got in covered.items():
                    cells = [f"{np.mean(got[m]):.3f}" for m in ("basic", "percentile")]
                    print(f"| {name} | {sd} | {k + 1} | {truth:.4f} | {np.mean(case['estimates']):.4f} | {unit} | "
                          + " | ".join(cells) + f" | {case['seconds']:.0f} |", flush=True)


def movable_shares(seed: int = 0) -> None:
    """Word rows (``tokens``) of NLI-like clusters: how many rows a block null can move with examples, then with
    clusters as blocks, and with each block cut to a multiple of 5 or 10 rows (coarser length classes; the rows
    kept). Premises of negative-binomial length (sd = mean / 2) with 1–3 hypotheses each, each example's words its
    premise's and its hypothesis', up to extract.max_tokens' 20,000 words."""
    from layersim.similarity.inference.exchangeability import block_permutations

    rng = np.random.default_rng(seed)

    def lengths(mean, size):
        p = 4 / mean  # negative binomial with variance (mean / 2)²
        return np.maximum(1, rng.negative_binomial(mean * p / (1 - p), p, size))

    print("| design | blocks | rows kept, multiple 1 / 5 / 10 | rows movable, multiple 1 / 5 / 10 |\n|---|---|---|---|")
    for name, premise_words, hypothesis_words in (("MNLI-like", 22, 11), ("QNLI-like", 10, 28)):
        hypotheses = rng.integers(1, 4, 300)
        premise = lengths(premise_words, 300)
        words = np.concatenate([premise[i] + lengths(hypothesis_words, k) for i, k in enumerate(hypotheses)])
        cluster = np.repeat(np.arange(300), hypotheses)
        kept = np.cumsum(words) <= 20_000
        words, cluster = words[kept], cluster[kept]
        for unit, label in (("examples", np.arange(len(words))), ("clusters", cluster)):
            rows = np.repeat(label, words)
            sizes = np.bincount(np.unique(rows, return_inverse=True)[1])
            shares, movable = [], []
            for multiple in (1, 5, 10):
                trimmed = sizes // multiple * multiple
                shares.append(trimmed.sum() / sizes.sum())
                blocks = np.repeat(np.arange(len(sizes)), trimmed)
                movable.append(block_permutations(int(trimmed.sum()), blocks).movable)
            print(f"| {name} | {unit} ({len(sizes)}) | " + " / ".join(f"{v:.2f}" for v in shares) + " | "
                  + " / ".join(f"{v:.2f}" for v in movable) + " |")


def length_class_calibration(draws: int = 200, multiples=(1, 5, 10), seed: int = 0) -> None:
    """similarity.length_classes measured: word rows (``tokens``) of 40 passages of negative-binomial length (mean 40,
    sd 20: few share a length, as multiple-choice examples' words), d = 20, the block null on the rows
    length_class_rows keeps (its observed value there too, as the stage
    does), linear CKA, 199 block permutations, p ≤ 0.05. False positives: x and y independent given what they share
    that a null must keep, each sentence's own component (sd 1) and a component of each word's relative position in
    its sentence (t / length, the same function for x and y: what coarser classes break, since they exchange the 20th
    word of a 23-word sentence with the 20th of a 27-word one). Power: y = 0.1·x·A + its own components."""
    from layersim.similarity.inference.exchangeability import block_permutations, length_class_rows

    rng = np.random.default_rng(seed)
    d, sentences = 20, 40
    position_map = rng.normal(size=(3, d))  # a smooth function of relative position, shared by x and y

    def table(signal: float):
        p = 4 / 40
        lengths = np.maximum(2, rng.negative_binomial(40 * p / (1 - p), p, sentences))
        g = np.repeat(np.arange(sentences), lengths)
        t = np.concatenate([np.arange(n) / n for n in lengths])
        position = np.stack([np.ones_like(t), t, t ** 2], axis=1) @ position_map
        x = rng.normal(size=(sentences, d))[g] + position + rng.normal(size=(len(g), d))
        y = rng.normal(size=(sentences, d))[g] + position + rng.normal(size=(len(g), d))
        if signal:
            y = y + signal * x @ rng.normal(size=(d, d)) / np.sqrt(d)
        return x, y, g

    print("| length classes (multiple) | rows kept | rows movable | false positives | power (0.1) |\n"
          "|---|---|---|---|---|")
    for multiple in multiples:
        start, found = time.perf_counter(), {0.0: [], 0.1: []}
        kept_share, movable = [], []
        for signal in found:
            for k in range(draws):
                x, y, g = table(signal)
                rows = length_class_rows(g, multiple)
                kept_share.append(len(rows) / len(g))
                movable.append(block_permutations(len(rows), g[rows]).movable * len(rows) / len(g))
                found[signal].append(permutation_test("linear_cka", x[rows], y[rows], permutations=199, seed=k,
                                                      groups=g[rows]).p_value)
        print(f"| {multiple} | {np.mean(kept_share):.3f} | {np.mean(movable):.3f} | "
              f"{np.mean(np.array(found[0.0]) <= 0.05):.3f} | {np.mean(np.array(found[0.1]) <= 0.05):.3f} | "
              f"({time.perf_counter() - start:.0f} s)", flush=True)


ATTENTION_MEASURES = ["jensen_shannon", "pearson", "matrix_norm", "linear_cka"]


def planted_attention(rng: np.random.Generator, signal: float = 0.0, clusters: int = 30, per_cluster: int = 2,
                      heads: int = 3, lengths=(4, 5, 6, 7), cluster_sd: float = 1.0):
    """Two layers' attention maps over the same examples: `clusters` premises of `per_cluster` examples each (one
    length per premise, drawn from `lengths`), `heads` heads. Layer x's logits for example e, head h: a positional
    pattern P_h (attend to the key h places on, the same in both layers: what any two encoders share) + the premise's
    own component (sd `cluster_sd`, the layer's own) + the example's (sd 1); layer y's the same with components of
    its own, plus `signal` × x's example component (0: x and y independent given the shared pattern, H0 true).
    Returns the two AttentionMaps and each example's premise (its cluster)."""
    from layersim.similarity.attention import AttentionMaps

    def softmax(z):
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)

    xs, ys, premise = [], [], []
    for c in range(clusters):
        t = int(rng.choice(lengths))
        pattern = 2.0 * np.stack([np.roll(np.eye(t), h, axis=1) for h in range(heads)])
        shared_x, shared_y = (cluster_sd * rng.normal(size=(heads, t, t)) for _ in range(2))
        for _ in range(per_cluster):
            own = rng.normal(size=(heads, t, t))
            xs.append(softmax(pattern + shared_x + own))
            ys.append(softmax(pattern + shared_y + rng.normal(size=(heads, t, t)) + signal * own))
            premise.append(c)
    return AttentionMaps.from_maps(xs), AttentionMaps.from_maps(ys), np.array(premise)


def attention_calibration(draws: int = 200, permutations: int = 99, coverage_draws: int = 200,
                          measures=ATTENTION_MEASURES) -> None:
    """The attention null (layersim.similarity.inference.attention_null) on :func:`planted_attention`: 30 premises × 2
    examples of 4–7 words, 3 heads. False-positive rate at α = 0.05 with the premises as blocks (as the stage) and
    with each example alone (the clusters ignored), power at signal 0.5, 1 (a quarter of the draws); then the
    coverage of the population value (the measure on 5,000 premises) by the 95% bootstrap intervals (basic,
    percentile; premises resampled, 200 resamples) at signal 1.
    ``python benchmarks/calibration.py --attention [--draws 200]``"""
    from layersim.similarity.attention import attention_similarity
    from layersim.similarity.inference.attention_null import attention_bootstrap_pairs, attention_stacked_null

    def p_value(x, y, clusters, seed):
        null = attention_stacked_null(name, {"x": [x], "y": [y]}, permutations=permutations, seed=seed,
                                      cells=np.array([[False, True], [False, False]]), clusters=clusters)
        return float(null.p_value[0, 1])

    print(f"attention maps: 30 premises × 2 examples (4–7 words), 3 heads; {draws} null draws, {permutations} "
          f"permutations, {coverage_draws} coverage draws")
    print("| measure | false positives, premises | false positives, examples | power 0.5 | power 1 | coverage basic "
          "| coverage percentile | s |\n|---|---|---|---|---|---|---|---|")
    for name in measures:
        start, rng = time.perf_counter(), np.random.default_rng(63)
        found = {"premises": [], "examples": [], 0.5: [], 1.0: []}
        for k in range(draws):
            x, y, premise = planted_attention(rng)
            found["premises"].append(p_value(x, y, premise, k))
            found["examples"].append(p_value(x, y, None, k))
            for signal in (0.5, 1.0) if k < draws // 4 else ():  # power: a quarter of the draws
                x, y, premise = planted_attention(rng, signal)
                found[signal].append(p_value(x, y, premise, k))
        x, y, _ = planted_attention(np.random.default_rng(123), 1.0, clusters=5_000)
        truth = attention_similarity(x, y, name)
        covered = {"basic": [], "percentile": []}
        for k in range(coverage_draws):
            x, y, premise = planted_attention(rng, 1.0)
            for method in covered:
                b = attention_bootstrap_pairs(name, [x], [y], resamples=200, seed=k, groups=premise, interval=method)
                covered[method].append(b.low[0] <= truth <= b.high[0])
        cells = [f"{np.mean(np.array(found[key]) <= 0.05):.3f}" for key in found] + [
            f"{np.mean(covered[m]):.3f}" for m in covered]
        print(f"| {name} | " + " | ".join(cells) + f" | {time.perf_counter() - start:.0f} |", flush=True)


def attention_compare_calibration(draws: int = 200, permutations: int = 99, resamples: int = 200,
                                  measures=ATTENTION_MEASURES) -> None:
    """The compare stage's attention heatmap (layersim.similarity.stacked_results.stacked_result with attention maps: the
    attention null on every cell between two models, and the bootstrap of each model's layer k against ORIG's) on
    :func:`planted_attention` stacked as two one-layer models, ORIG (x) and FT (y): the false-positive rate at
    α = 0.05 of FT–ORIG's p-value (H0, `draws` draws), its power at signal 1 and, on those draws, the coverage of the
    population value (the measure on 5,000 premises) by the interval the heatmap reports (the measure's automatic
    method), premises as blocks throughout.
    ``python benchmarks/calibration.py --attention --compare [--draws 200]``"""
    from layersim.similarity.attention import attention_similarity
    from layersim.similarity.results import Uncertainty
    from layersim.similarity.stacked_results import stacked_result

    def heatmap(x, y, premise, seed, bootstrap):
        found = stacked_result({"ORIG": [x], "FT": [y]}, name, attention=True, groups=premise,
                               uncertainty=Uncertainty(permutations, bootstrap, seed))
        return float(found.null.p_value[1, 0]), found

    print(f"compare's attention heatmap: 30 premises × 2 examples (4–7 words), 3 heads; {draws} null draws, "
          f"{permutations} permutations, {draws // 2} signal-1 draws with {resamples} resamples")
    print("| measure | false positives | power 1 | interval | coverage | s |\n|---|---|---|---|---|---|")
    for name in measures:
        start, rng = time.perf_counter(), np.random.default_rng(64)
        null = [heatmap(*planted_attention(rng), k, 0)[0] for k in range(draws)]
        x, y, _ = planted_attention(np.random.default_rng(123), 1.0, clusters=5_000)
        truth = attention_similarity(y, x, name)  # the FT row against the ORIG column
        power, covered, method = [], [], None
        for k in range(draws // 2):
            p_value, found = heatmap(*planted_attention(rng, 1.0), k, resamples)
            power.append(p_value)
            if found.interval is not None:
                method = found.interval_method
                covered.append(found.interval[0][1, 0] <= truth <= found.interval[1][1, 0])
        coverage = f"{np.mean(covered):.3f}" if covered else "no interval"
        print(f"| {name} | {np.mean(np.array(null) <= 0.05):.3f} | {np.mean(np.array(power) <= 0.05):.3f} | "
              f"{method or 'none'} | {coverage} | {time.perf_counter() - start:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--permutations", type=int, default=None)
    parser.add_argument("--sample-share", type=float, default=0.5)
    parser.add_argument("--structured", action="store_true", help="only grouped rows: words, choices (issue 47)")
    parser.add_argument("--streamed", action="store_true", help="with --structured: the streamed route too")
    parser.add_argument("--measures", nargs="+", default=MEASURES, choices=sorted(set(MEASURES) | {
        *ATTENTION_MEASURES, "debiased_cka", "rbf_cka", "procrustes", "shape_metric", "rsa", "knn_jaccard",
        *COVERAGE_MEASURES}))
    parser.add_argument("--compare-probe", action="store_true", help="only the compare stage's 12-task probe")
    parser.add_argument("--premises", action="store_true", help="with --structured: only the shared-premise design "
                        "(100 premises × 3 hypotheses) through the similarity stage's null and bootstrap")
    parser.add_argument("--coverage-draws", type=int, default=200, help="with --premises: coverage repeats")
    parser.add_argument("--coverage-only", action="store_true", help="with --structured --premises: only the "
                        "coverage of basic and percentile intervals, examples and premises resampled")
    parser.add_argument("--premise-sd", type=float, nargs="+", default=[0.5, 1.0], help="with --coverage-only")
    parser.add_argument("--units", nargs="+", default=["examples", "premises"], choices=["examples", "premises"],
                        help="with --coverage-only: rows resampled one by one (examples), whole premises, or both")
    parser.add_argument("--report-every", type=int, default=25, help="with --coverage-only: the tally so far every "
                        "this many draws")
    parser.add_argument("--length-classes", action="store_true", help="with --structured: only the word rows' "
                        "null with coarser length classes (similarity.length_classes): false positives and power")
    parser.add_argument("--attention", action="store_true", help="only the attention maps' null and bootstrap "
                        "(layersim.similarity.inference.attention_null) on planted maps")
    parser.add_argument("--compare", action="store_true", help="with --attention: through the compare stage's "
                        "attention heatmap (null on every cell between models, intervals against ORIG)")
    args = parser.parse_args()
    if args.attention:
        chosen = args.measures if args.measures != MEASURES else ATTENTION_MEASURES
        if args.compare:
            return attention_compare_calibration(args.draws or 200, args.permutations or 99, measures=chosen)
        return attention_calibration(args.draws or 200, args.permutations or 99, args.coverage_draws, chosen)
    if args.structured and args.length_classes:
        return length_class_calibration(args.draws or 200)
    if args.compare_probe:
        chosen = args.measures if args.measures != MEASURES else ("linear_cka", "neuronsim", "svcca")
        return compare_probe(args.draws or (200 if args.quick else 400), args.permutations or 99, chosen)
    if args.structured and args.premises and args.coverage_only:
        return premise_coverage(args.measures if args.measures != MEASURES else COVERAGE_MEASURES, args.coverage_draws,
                                args.premise_sd, args.units, args.report_every)
    if args.structured and args.premises:
        chosen = args.measures if args.measures != MEASURES else STAGE_MEASURES
        movable_shares()
        return premise_calibration(args.draws or 200, chosen, args.coverage_draws)
    if args.structured:
        chosen = args.measures if args.measures != MEASURES else STRUCTURED_MEASURES
        return structured(args.draws or 200, args.permutations or 99, chosen, args.streamed)
    draws = args.draws or (100 if args.quick else 400)
    permutations = args.permutations or 99
    print(f"{draws} draws per cell, {permutations} permutations / rotations; "
          f"streamed sample {args.sample_share:.0%} of the rows")
    print("| measure | data | n × d | memory α=.05 | memory α=.01 | streamed α=.05 | streamed α=.01 | s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.measures:
        for dist in ("gaussian", "t3"):
            for n, d in REGIMES:
                if name == "mixedsim" and n <= d:
                    continue
                start = time.perf_counter()
                rng = np.random.default_rng(1000 * n + d)
                memory, streamed = [], []
                for k in range(draws):
                    x, y = ((rng.standard_t(3, size=(n, d)), rng.standard_t(3, size=(n, d))) if dist == "t3"
                            else (rng.normal(size=(n, d)), rng.normal(size=(n, d))))
                    memory.append(permutation_test(name, x, y, permutations=permutations, seed=k,
                                                   **_options(name)).p_value)
                    streamed.append(_streamed(name, x, y, permutations, k, int(args.sample_share * n)))
                memory, streamed = np.array(memory), np.array(streamed)
                cells = [f"{np.mean(p <= a):.3f}" for p in (memory, streamed) for a in (0.05, 0.01)]
                print(f"| {name} | {dist} | {n} × {d} | " + " | ".join(cells)
                      + f" | {time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
