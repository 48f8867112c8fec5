"""Which bootstrap interval ``interval="auto"`` gives each measure: the method whose 95 % interval covered the
measure's population value, as measured (benchmarks/bootstrap.py --coverage, benchmarks/calibration.py;
docs/reading-the-numbers.md, "Interval coverage"), or none, with the reason in the note
(:mod:`layersim.similarity.inference.bootstrap` reads it).
"""

from __future__ import annotations

COVERED = (0.85, 0.99)
NOMINAL = 0.95


# Measured coverage of the population value by the 95% basic and percentile intervals (the fraction of samples
# whose interval contained it), for the measures added by issue 65, per design: "review", benchmarks/bootstrap.py
# --coverage on the review's population (n = 200 for the neighbourhood and distance measures, 300 for the others),
# and where measured "premises", benchmarks/calibration.py --structured --premises --coverage-only (100 premises × 3
# hypotheses resampled premise by premise, the stage's cluster bootstrap; the neighbourhood measures' since a row's
# cluster drawn again is left out of its neighbours, layersim.similarity.neighbours.Copies); 200 resamples. The
# repeats, dates and commands are in docs/reading-the-numbers.md, "Interval coverage". "auto" takes
# :func:`covering_method`'s pick; where it picks none, these numbers are the note's reason. ``draws``: the samples
# the coverage is over (fewer than CLAIM_DRAWS: a first look, enough to show a failure, not to grant a method).
MEASURED_COVERAGE: dict[str, dict[str, dict[str, float]]] = {
    "mutual_knn": {"review": {"basic": 0.93, "percentile": 0.945, "draws": 200},
                   "premises": {"basic": 0.96, "percentile": 0.995, "draws": 200}},
    "cknna": {"review": {"basic": 0.935, "percentile": 0.945, "draws": 200},
              "premises": {"basic": 0.975, "percentile": 0.99, "draws": 200}},
    # Its resamples sit above its estimate (a neighbour's rank counts the draws of the rows ahead of it, more spread
    # than a fresh sample's, and its rank weights are convex: benchmarks/rank_bias.py, the docs): no copy rule mends it.
    "rank_similarity": {"review": {"basic": 0.945, "percentile": 0.995, "draws": 200},
                        "premises": {"basic": 0.81, "percentile": 0.815, "draws": 200}},
    "distance_correlation": {"review": {"basic": 0.075, "percentile": 0.0, "draws": 200}},
    "second_order_cosine": {"review": {"basic": 0.935, "percentile": 0.94, "draws": 200},
                            "premises": {"basic": 0.975, "percentile": 0.98, "draws": 200}},
    "rsm_norm": {"review": {"basic": 0.925, "percentile": 0.91, "draws": 200},
                 "premises": {"basic": 0.925, "percentile": 0.935, "draws": 200}},
    "linear_regression": {"review": {"basic": 0.6, "percentile": 0.0, "draws": 50}},
    "aligned_cosine": {"review": {"basic": 0.16, "percentile": 0.0, "draws": 25}},
    "hard_correlation_match": {"review": {"basic": 0.32, "percentile": 0.0, "draws": 25}},
    "soft_correlation_match": {"review": {"basic": 0.32, "percentile": 0.0, "draws": 25}},
    "size_and_shape": {"review": {"basic": 0.2, "percentile": 0.0, "draws": 25}},
    "gulp": {"review": {"basic": 0.16, "percentile": 0.0, "draws": 25}},
    "eigenspace_overlap": {"review": {"basic": 0.16, "percentile": 0.0, "draws": 25}},
}
CLAIM_DRAWS = 200


def covering_method(coverage: dict[str, dict[str, float]]) -> str | None:
    """Of the methods whose measured coverage lies within :data:`COVERED` in every design measured, over at least
    :data:`CLAIM_DRAWS` draws each, the one nearest :data:`NOMINAL` in the worst design (basic on a tie); else None."""
    if any(c["draws"] < CLAIM_DRAWS for c in coverage.values()):
        return None
    worst = {m: max((c[m] for c in coverage.values()), key=lambda v: abs(v - NOMINAL)) for m in ("basic", "percentile")}
    within = [m for m in ("basic", "percentile") if all(COVERED[0] <= c[m] <= COVERED[1] for c in coverage.values())]
    return min(within, key=lambda m: abs(worst[m] - NOMINAL), default=None)


def _coverage_text(coverage: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{design}: basic {c['basic']:.3f}, percentile {c['percentile']:.3f} over {c['draws']:.0f} draws"
                     for design, c in coverage.items())


# Measures of issue 65 whose intervals' coverage benchmarks/bootstrap.py --coverage has not measured yet: "auto"
# gives them no interval either, and says so.
NOT_MEASURED = frozenset({"distance_correlation", "rsm_norm", "mutual_knn", "rank_similarity", "second_order_cosine",
                          "cknna", "linear_regression", "size_and_shape", "aligned_cosine", "hard_correlation_match",
                          "soft_correlation_match", "gulp", "eigenspace_overlap"}) - set(MEASURED_COVERAGE)

# What "auto" is for each measure: the method whose 95% interval covered the population value within COVERED
# in benchmarks/bootstrap.py --coverage (the table in layersim.similarity.inference.bootstrap's docstring); None
# where no method did: no interval.
AUTO_INTERVAL: dict[str, str | None] = {
    "linear_cka": "basic", "debiased_cka": "percentile", "rbf_cka": None, "svcca": None, "pwcca": None,
    "mean_cca": None, "neuronsim": None, "mixedsim": None, "procrustes": None, "shape_metric": None,
    "rsa": "basic", "knn_jaccard": "basic",
    # ReSi's measures and mutual k-NN / CKNNA (issue 65): from MEASURED_COVERAGE (None where not measured yet).
    **{name: None for name in NOT_MEASURED},
    **{name: covering_method(coverage) for name, coverage in MEASURED_COVERAGE.items()},
    # The difference statistics: no interval at all (Measure.no_null: one number per layer, nothing to resample).
    "magnitude_difference": None, "concentricity_difference": None, "uniformity_difference": None,
    # Attention maps' head-level measures (layersim.similarity.attention; whole examples resampled), measured on
    # planted maps (benchmarks/calibration.py --attention: 60 examples, 200 repeats): Jensen–Shannon basic 0.920,
    # percentile 0.935; Pearson 0.925 and 0.925; the matrix norm 0.930 and 0.940.
    "jensen_shannon": "percentile", "pearson": "percentile", "matrix_norm": "percentile",
}


def chosen_interval(name: str, interval: str) -> str | None:
    """"auto": the measured method of :data:`AUTO_INTERVAL` (None: no interval is shown); else ``interval``."""
    return AUTO_INTERVAL[name] if interval == "auto" else interval


def no_interval_note(name: str) -> str:
    """Why "auto" gives ``name`` no interval (:data:`AUTO_INTERVAL`; the measured coverage, where there is one)."""
    regardless = "interval='percentile' or 'basic' gives one regardless"
    if name in NOT_MEASURED:
        return (f"no interval: no bootstrap interval of {name} has had its coverage measured yet "
                f"(benchmarks/bootstrap.py --coverage); {regardless}")
    measured = MEASURED_COVERAGE.get(name)
    found = "" if measured is None else f" (measured, {_coverage_text(measured)})"
    return (f"no interval: no bootstrap interval (95%) of {name} covered its population value within "
            f"{COVERED[0]:.2f}–{COVERED[1]:.2f} of the time over at least {CLAIM_DRAWS} draws in "
            f"benchmarks/bootstrap.py --coverage{found} (see "
            f"docs/reading-the-numbers.md, \"Interval coverage\"); {regardless}")
