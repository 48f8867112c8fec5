"""The alignment experiments of Ren et al. 2023 as pure functions on arrays (the stage does the I/O).

* :func:`alignment_errors` — per layer and method, fit ``g: X_l → Y_l`` on the training rows and
  report held-out (and training) errors (Ren Table 4, Figure 2).
* :func:`synthetic_recovery` — ``Y = f(X)`` for a random invertible network ``f``; how well each
  method recovers ``f`` from paired rows (Ren §4.3, Table 3).
* :func:`layer_alignment_matrix` — held-out error of mapping every layer onto every layer
  (Ren Figure 3).
* :func:`map_representations` — fit on model 1 → model 2 training rows and map other rows, e.g.
  the validation representations that the layer-injection experiment feeds into model 2's head
  (Ren §4.5, Table 5).

Only the rows named by ``train_idx`` are ever passed to a map's ``fit`` (its standardisation
included); ``test_idx`` rows are only transformed and scored; rows in neither are never read.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm
import torch

from layersim.align.base import AlignmentMap, as_matrix, fit_maps
from layersim.align.maps import MAPS, make_map
from layersim.align.metrics import mse, relative_error, train_test_split_rows
from layersim.align.flows import random_flow
from layersim.errors import LayersimError, unknown_name
from layersim.compute.linalg import Standardizer, blas_on_calling_thread

METRICS = ("mse", "relative_error")
DEFAULT_METHODS = ("linear", "cca", "svcca", "pwcca", "inn", "mlp")


def alignment_errors(x_layers: Sequence[np.ndarray], y_layers: Sequence[np.ndarray], methods: Iterable[str],
                     train_idx: np.ndarray, test_idx: np.ndarray,
                     **options: Mapping[str, object]) -> list[dict[str, object]]:
    """Fit every method on every layer pair (``x_layers[l] → y_layers[l]``) and score it.

    Parameters
    ----------
    x_layers, y_layers : sequences of the same length of ``(num_examples x hidden)`` arrays, e.g.
        model 1's and model 2's representations at each layer; rows are examples, aligned across
        all arrays. Widths may differ (except for ``inn``).
    methods : registry names (see :data:`layersim.align.MAPS`).
    train_idx, test_idx : disjoint integer row indices; maps are fitted on ``train_idx`` rows only.
    **options : per-method constructor options, keyed by method name, e.g.
        ``inn={"steps": 300}``; methods without an entry use their defaults.

    Returns
    -------
    One dict per (layer, method), layer-major: ``layer`` (int), ``method`` (str), ``mse`` and
    ``relative_error`` on the test rows, ``train_mse`` and ``train_relative_error`` on the
    training rows (floats).

    Raises
    ------
    LayersimError
        For an unknown method or option, options for a method not in ``methods``, mismatched
        layer counts or row counts, or bad indices (out of range, overlapping, empty, repeated).
    """
    methods = _methods(methods)
    for key in options:
        if key not in methods:
            raise LayersimError(f"options were given for {key!r}, which is not among the methods "
                                f"{', '.join(methods)}; pass options keyed by one of those.")
    x_layers, y_layers = _layer_lists(x_layers, "x_layers"), _layer_lists(y_layers, "y_layers")
    if len(x_layers) != len(y_layers):
        raise LayersimError(f"x_layers has {len(x_layers)} layers but y_layers has {len(y_layers)}; "
                            "each x layer is mapped onto the y layer at the same position.")
    train_idx, test_idx = _split(train_idx, test_idx, _num_rows(x_layers + y_layers))
    for name in methods:  # reject bad options before any (slow) fitting
        make_map(name, **dict(options.get(name, {})))
    # What is fitted together: a neural method's maps of every layer (one batched network), and the other
    # methods of one layer pair (the linear ones from one SVD per side).
    batched = [name for name in methods if MAPS[name].batched_over_pairs]
    per_layer = [name for name in methods if name not in batched]
    fits = ([(per_layer, [layer]) for layer in range(len(x_layers)) if per_layer]
            + [([name], range(len(x_layers))) for name in batched])
    scores = {}
    for names, layers in tqdm(fits, desc="align layers", leave=False, mininterval=2):
        cells = list(itertools.product(names, layers))
        fitted = [make_map(name, **dict(options.get(name, {}))) for name, _ in cells]
        rows = _fit_and_score_all(fitted, [x_layers[layer] for _, layer in cells],
                                  [y_layers[layer] for _, layer in cells], train_idx, test_idx)
        scores.update({(layer, name): row for (name, layer), row in zip(cells, rows)})
    return [{"layer": layer, "method": name, **scores[layer, name]}
            for layer in range(len(x_layers)) for name in methods]


def synthetic_recovery(x: np.ndarray, methods: Iterable[str] = DEFAULT_METHODS, seed: int = 0, *,
                       test_fraction: float = 0.2, depth: int = 4, hidden: int = 64, scale: float = 0.5,
                       clamp: float = 2.0, rows: int | None = None, **options: Mapping[str, object]) -> dict[str, object]:
    """Ren §4.3: can a method recover a known non-linear bijection ``f`` from paired rows?

    ``X`` is standardised with its training rows' statistics and ``Y = f(X_s)``, with ``f`` a
    random, untrained :func:`~layersim.align.flows.random_flow` (a random rotation then ``depth``
    affine coupling blocks with random weights of size ``scale``; drawn from ``seed + 1``). Every
    method is fitted on the training rows of ``(X, Y)`` and scored on the held-out rows.

    What decides whether the INN recovers ``f`` held out (measured on 20,000 MiniLM sentence vectors,
    width 384, and on Gaussian rows of width 768; see docs/performance.md): the number of rows against
    ``f``'s complexity — ``hidden`` random units per coupling block are as many non-linear directions
    to identify, so 64 (the default) is recovered from 16,000 training rows where 256 is not — and
    the training budget (thousands of steps at a learning rate of about 2e-3: 1e-3 is too slow, 3e-3
    faster at width 384 but at 768 its loss jumped after ~2,100 steps and never recovered, 1e-2 is
    worse, 3e-2 diverges). With a few thousand rows every neural map overfits whatever the steps.

    Parameters
    ----------
    x : ``(num_examples x hidden)`` representation (real activations, or structured random data).
    methods : registry names to compare; default all six.
    seed : the row sample, the split (``train_test_split_rows(n, test_fraction, seed)``) and ``f``.
    depth, hidden, scale, clamp : the ground-truth ``f`` (see :func:`~layersim.align.flows.random_flow`).
        ``scale`` sets how non-linear ``f`` is; the ``linear`` row of the result shows how far
        a linear map gets.
    rows : use a seeded sample of at most this many rows of ``x`` (None: all).
    **options : per-method constructor options keyed by method name, as in :func:`alignment_errors`.

    Returns
    -------
    dict with ``rows`` (one dict per method: ``method``, ``mse``, ``relative_error``,
    ``train_mse``, ``train_relative_error``), ``train_idx`` and ``test_idx`` (index arrays into the
    rows used), ``y`` (the generated ``f(X_s)``, float64) and ``num_rows`` (rows used).
    """
    x = as_matrix(x, "x")
    if rows is not None:
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 3:
            raise LayersimError(f"rows must be an integer >= 3 or None (all rows), got {rows!r}.")
        if x.shape[0] > rows:
            x = x[np.sort(np.random.default_rng(seed).choice(x.shape[0], rows, replace=False))]
    train_idx, test_idx = train_test_split_rows(x.shape[0], test_fraction, seed)
    x_s = Standardizer().fit(x[train_idx]).transform(x)
    f = random_flow(x.shape[1], depth=depth, hidden=hidden, clamp=clamp, scale=scale, seed=seed + 1)
    with torch.no_grad():
        y = f(torch.from_numpy(x_s)).numpy()
    scores = alignment_errors([x], [y], methods, train_idx, test_idx, **options)
    for row in scores:
        del row["layer"]
    return {"rows": scores, "train_idx": train_idx, "test_idx": test_idx, "y": y, "num_rows": int(x.shape[0])}


def layer_alignment_matrix(x_layers: Sequence[np.ndarray], y_layers: Sequence[np.ndarray] | None = None,
                           method: str = "inn", *, train_idx: np.ndarray, test_idx: np.ndarray,
                           metric: str = "relative_error", **options: object) -> np.ndarray:
    """Ren Figure 3: entry ``[i, j]`` is the held-out error of a map fitted from ``x_layers[i]`` to
    ``y_layers[j]`` on the training rows.

    Parameters
    ----------
    x_layers : sequence of ``(num_examples x hidden)`` arrays.
    y_layers : the same for the target model, or None to map ``x_layers`` onto themselves
        (the matrix is then not symmetric in general: ``i → j`` and ``j → i`` are different fits).
    method : registry name, default ``"inn"``.
    train_idx, test_idx : as in :func:`alignment_errors`.
    metric : ``"relative_error"`` (default) or ``"mse"``, on the test rows.
    **options : constructor options of ``method``; for the INN, fewer ``steps`` (e.g. 200) make the
        ``L²`` fits affordable.

    Returns
    -------
    float64 array of shape ``(len(x_layers), len(y_layers))``.
    """
    if metric not in METRICS:
        raise unknown_name("metric", metric, METRICS)
    x_layers = _layer_lists(x_layers, "x_layers")
    y_layers = x_layers if y_layers is None else _layer_lists(y_layers, "y_layers")
    train_idx, test_idx = _split(train_idx, test_idx, _num_rows(x_layers + y_layers))
    make_map(method, **options)  # reject a bad method or option before any fitting
    out = np.empty((len(x_layers), len(y_layers)))
    for i, x in enumerate(tqdm(x_layers, desc=f"{method} layer x layer", leave=False, mininterval=2)):
        # A row of the matrix at a time: its maps fitted together, memory bounded by one row's rows.
        fitted = [make_map(method, **options) for _ in y_layers]
        scores = _fit_and_score_all(fitted, [x] * len(y_layers), y_layers, train_idx, test_idx, train_errors=False)
        out[i] = [row[metric] for row in scores]
    return out


def map_representations(x_train: np.ndarray, y_train: np.ndarray, x_apply: np.ndarray, method: str = "inn",
                        **options: object) -> tuple[np.ndarray, AlignmentMap]:
    """Fit ``method`` on paired training rows (model 1 → model 2) and map ``x_apply`` (model 1's
    representations of other examples, e.g. the validation set) into model 2's space.

    Returns ``(g(x_apply), fitted map)``; ``g(x_apply)`` has ``y_train``'s width and float dtype.
    """
    fitted = make_map(method, **options).fit(x_train, y_train)
    return fitted.transform(x_apply), fitted


def mean_sd_over_pairs(per_pair: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, dict[str, object]]:
    """Per method, over pairs of models (each a mapping method → error per layer, every pair the same methods and
    layers): the mean and sd (ddof 1; 0 for one pair) at each layer, and of the errors averaged over layers
    (``layer_mean``, ``layer_mean_sd``; Ren Table 4's "mean ± sd")."""
    if not per_pair:
        raise LayersimError("no pairs were given to average over; give one or more.")
    out = {}
    ddof = 1 if len(per_pair) > 1 else 0
    for method in per_pair[0]:
        curves = np.array([pair[method] for pair in per_pair], dtype=float)  # pairs × layers
        out[method] = {"mean": curves.mean(axis=0).tolist(), "sd": curves.std(axis=0, ddof=ddof).tolist(),
                       "layer_mean": float(curves.mean()), "layer_mean_sd": float(curves.mean(axis=1).std(ddof=ddof))}
    return out


def example_split(example_ids: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, test) of points keyed by `example_ids`, split by example (a seeded
    ``train_test_split_rows`` of the distinct ids), so that no example has points on both sides."""
    example_ids = np.asarray(example_ids)
    distinct = np.unique(example_ids)
    train, test = train_test_split_rows(len(distinct), test_fraction, seed)
    return tuple(np.flatnonzero(np.isin(example_ids, distinct[chosen])) for chosen in (train, test))


# --- helpers ---


def _fit_and_score_all(maps: list[AlignmentMap], xs: Sequence[np.ndarray], ys: Sequence[np.ndarray],
                       train_idx: np.ndarray, test_idx: np.ndarray, train_errors: bool = True
                       ) -> list[dict[str, float]]:
    """Fit ``maps[k]`` from ``xs[k]`` to ``ys[k]`` on the training rows only (all together, see
    :func:`~layersim.align.base.fit_maps`), then each one's errors on the test rows (and the training rows).

    NumPy's BLAS stays on the calling thread throughout: scoring's NumPy calls between the neural maps' torch
    passes would otherwise wake its worker threads, which then spin on the cores torch needs
    (:func:`~layersim.compute.linalg.blas_on_calling_thread`)."""
    with blas_on_calling_thread():
        fit_maps(maps, [(x[train_idx], y[train_idx]) for x, y in zip(xs, ys)])
        return [_errors(fitted, x, y, test_idx, "test") | (_errors(fitted, x, y, train_idx, "train") if train_errors
                                                             else {}) for fitted, x, y in zip(maps, xs, ys)]


def _errors(fitted: AlignmentMap, x: np.ndarray, y: np.ndarray, rows: np.ndarray, split: str) -> dict[str, float]:
    """A fitted map's mse and relative error on `rows` of `split` (test: "mse", …; train: "train_mse", …)."""
    y_hat, y_rows = fitted.transform(x[rows]), as_matrix(y[rows], f"y ({split} rows)")
    prefix = "" if split == "test" else f"{split}_"
    return {f"{prefix}mse": mse(y_hat, y_rows), f"{prefix}relative_error": relative_error(y_hat, y_rows)}


def _methods(methods: Iterable[str]) -> list[str]:
    if isinstance(methods, str):
        methods = [methods]
    out = list(methods)
    if not out:
        raise LayersimError(f"methods is empty; pass one or more of: {', '.join(MAPS)}.")
    for name in out:
        if name not in MAPS:
            raise unknown_name("map", name, MAPS)
    if len(set(out)) != len(out):
        raise LayersimError(f"methods {out} repeat a name; list each method once.")
    return out


def _layer_lists(layers: Sequence[np.ndarray], label: str) -> list[np.ndarray]:
    if isinstance(layers, np.ndarray) and layers.ndim == 2:
        raise LayersimError(f"{label} must be a sequence of (num_examples x hidden) arrays, got a single array "
                            f"of shape {layers.shape}; wrap one layer in a list.")
    out = [np.asarray(a) for a in layers]
    if not out:
        raise LayersimError(f"{label} is empty; pass at least one (num_examples x hidden) array.")
    for k, a in enumerate(out):
        if a.ndim != 2:
            raise LayersimError(f"{label}[{k}] must be a 2-D (num_examples x hidden) array, got shape {a.shape}.")
    return out


def _num_rows(layers: list[np.ndarray]) -> int:
    n = layers[0].shape[0]
    for a in layers[1:]:
        if a.shape[0] != n:
            raise LayersimError(f"layers have {n} and {a.shape[0]} rows; every layer must hold the same examples "
                                "(the same number of rows, in the same order).")
    return n


def _split(train_idx: np.ndarray, test_idx: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Validated integer index arrays: non-empty, in range, no repeats, disjoint."""
    checked = []
    for label, idx in (("train_idx", train_idx), ("test_idx", test_idx)):
        idx = np.asarray(idx)
        if idx.ndim != 1 or idx.size == 0 or idx.dtype.kind not in "iu":
            raise LayersimError(f"{label} must be a non-empty 1-D array of integer row indices, got "
                                f"{idx.dtype} of shape {idx.shape}.")
        if idx.min() < 0 or idx.max() >= num_rows:
            raise LayersimError(f"{label} holds indices outside 0..{num_rows - 1} (min {idx.min()}, max {idx.max()}).")
        if np.unique(idx).size != idx.size:
            raise LayersimError(f"{label} repeats row indices; each row may appear once.")
        checked.append(idx.astype(np.intp))
    overlap = np.intersect1d(*checked)
    if overlap.size:
        raise LayersimError(f"train_idx and test_idx share {overlap.size} rows (e.g. {int(overlap[0])}); "
                            "held-out rows must not be used for fitting.")
    if checked[0].size < 2:
        raise LayersimError(f"train_idx has {checked[0].size} row; fitting a map needs at least 2.")
    return checked[0], checked[1]
