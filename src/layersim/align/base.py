"""What every alignment map shares: input checks, train-row standardisation, the fit/transform API.

A map ``g`` is learnt from paired representations ``X`` (``n x d_x``) and ``Y`` (``n x d_y``) of the
same ``n`` examples, and sends a row of X's space to a row of Y's space (Ren et al. 2023, §3.2).
Every map works in standardised coordinates::

    x_s = (x - mean_x) / std_x          ŷ = g_s(x_s) · std_y + mean_y

with ``mean`` and ``std`` (per column, ``ddof=0``) taken from the rows passed to ``fit`` only, so
held-out rows never influence a fitted map. A column that is constant on the training rows gets
``std = 1`` (it is only centred). ``transform`` returns Y's original units; ``inverse``, where it
exists, maps Y's units back to X's.

Arithmetic is float64 unless a subclass says otherwise (the neural maps train in float32 and
evaluate in float64). Outputs are float32 when the input was float32, float64 otherwise.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from layersim.errors import LayersimError
from layersim.compute.linalg import Standardizer


def as_matrix(a: object, label: str) -> np.ndarray:
    """``a`` as a finite 2-D float64 array; raises naming ``label`` otherwise."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "biuf":
        raise LayersimError(f"{label} must hold real numbers, got dtype {arr.dtype}.")
    if arr.ndim != 2:
        raise LayersimError(f"{label} must be a 2-D (num_examples x hidden) array, got shape {arr.shape}.")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise LayersimError(f"{label} has shape {arr.shape}; it needs at least one row and one column.")
    finite = np.isfinite(arr)
    if not finite.all():
        bad = arr.size - int(np.count_nonzero(finite))
        raise LayersimError(f"{label} contains {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf); "
                            "alignment maps need finite activations.")
    return np.asarray(arr, dtype=np.float64)


def check_pair(x: object, y: object, min_rows: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 copies of a paired (x, y); rows must match and be at least ``min_rows``."""
    x, y = as_matrix(x, "x"), as_matrix(y, "y")
    if x.shape[0] != y.shape[0]:
        raise LayersimError(f"x has {x.shape[0]} rows but y has {y.shape[0]}; "
                            "a map is fitted on paired rows, so the row counts must be equal.")
    if x.shape[0] < min_rows:
        raise LayersimError(f"x and y have {x.shape[0]} rows; fitting a map needs at least {min_rows}.")
    return x, y


def output_dtype(a: object) -> np.dtype:
    """float32 for float32 input, float64 for everything else."""
    return np.dtype(np.float32) if np.asarray(a).dtype == np.float32 else np.dtype(np.float64)


class AlignmentMap:
    """Base class: a map from X's representation space to Y's, fitted on paired rows.

    Subclasses set ``name`` (the registry name) and implement ``_fit(xs, ys)`` — or, for maps fitted in
    groups, ``_group_key`` and ``_fit_group(maps, data)`` — and ``_transform(xs)`` (and ``_inverse(ys)``
    where the map is invertible) on standardised float64 arrays; this class does validation,
    standardisation and units.
    """

    name: ClassVar[str] = ""
    # Whether fitting maps of this class on different pairs together saves time (the neural maps train as one
    # batched network), so that experiments fit a method's maps of every layer at once.
    batched_over_pairs: ClassVar[bool] = False

    # --- public API ---

    def fit(self, x: np.ndarray, y: np.ndarray) -> AlignmentMap:
        """Learn the map from paired training rows.

        Parameters
        ----------
        x : array ``(num_examples x hidden_x)`` — X's representations of the training examples.
        y : array ``(num_examples x hidden_y)`` — Y's representations of the same examples, same order.

        Returns
        -------
        self

        Raises
        ------
        LayersimError
            If an input is not a finite real 2-D array, the row counts differ, there are fewer than
            2 rows, or the widths are not allowed by this map (the INN needs equal widths).
        """
        fit_maps([self], [(x, y)])
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``ŷ = g(x)``: rows of X's space mapped into Y's space, in Y's original units."""
        xs = self._standardised_input(x, "x")
        out = self.y_scaler_.inverse_transform(self._transform(xs))
        return out.astype(output_dtype(x), copy=False)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``x̂ = g⁻¹(y)``: rows of Y's space mapped back into X's space, in X's original units.

        Raises
        ------
        LayersimError
            If the map has no inverse (see the subclass docstring), or the map is not fitted.
        """
        ys = self._standardised_input(y, "y")
        out = self.x_scaler_.inverse_transform(self._inverse(ys))
        return out.astype(output_dtype(y), copy=False)

    def fit_transform(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``fit(x, y)`` then ``transform(x)``."""
        return self.fit(x, y).transform(x)

    # --- hooks for subclasses ---

    def _prepare(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Checked inputs, standardised with their own statistics (kept for transform and inverse)."""
        x, y = check_pair(x, y)
        self._check_widths(x.shape[1], y.shape[1])
        self.x_scaler_ = Standardizer().fit(x)
        self.y_scaler_ = Standardizer().fit(y)
        return self.x_scaler_.transform(x), self.y_scaler_.transform(y)

    @classmethod
    def _group_key(cls) -> type:
        """The class whose ``_fit_group`` fits maps of this class (this class by default)."""
        return cls

    @classmethod
    def _fit_group(cls, maps: Sequence[AlignmentMap], data: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Fit each of `maps` (all of this group) on its standardised (xs, ys); one at a time by default."""
        for fitted, (xs, ys) in zip(maps, data):
            fitted._fit(xs, ys)

    def _check_widths(self, dx: int, dy: int) -> None:
        """Raise if this map cannot go from width ``dx`` to width ``dy``; any widths by default."""

    def _fit(self, xs: np.ndarray, ys: np.ndarray) -> None:
        raise NotImplementedError

    def _transform(self, xs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _inverse(self, ys: np.ndarray) -> np.ndarray:
        raise LayersimError(f"the {self.name!r} map is not invertible; maps with an inverse are: "
                            "cca, inn, linear, pwcca, svcca (the linear ones only when square and full rank).")

    # --- helpers ---

    def _standardised_input(self, a: np.ndarray, label: str) -> np.ndarray:
        """``a`` (rows of X's space for label "x", of Y's for "y") checked and standardised."""
        if not hasattr(self, "dims_"):
            raise LayersimError(f"this {self.name!r} map is not fitted yet; call fit(x_train, y_train) first.")
        side, scaler = (0, self.x_scaler_) if label == "x" else (1, self.y_scaler_)
        a = as_matrix(a, label)
        if a.shape[1] != self.dims_[side]:
            raise LayersimError(f"{label} has {a.shape[1]} columns but the map was fitted with "
                                f"{self.dims_[side]}-wide {label}; pass rows of the same representation.")
        return scaler.transform(a)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    def get_params(self) -> dict[str, object]:
        """The constructor arguments (hyperparameters) of this map, by name."""
        return {k: getattr(self, k) for k in option_names(type(self))}


def fit_maps(maps: Sequence[AlignmentMap], pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[AlignmentMap]:
    """Fit ``maps[k]`` on the paired rows ``pairs[k]`` for every k, with the result of ``maps[k].fit(*pairs[k])``
    (up to rounding): maps that can be fitted together are, e.g. the INN of every layer of a comparison in one
    batched loop, or the linear maps of one layer pair from one SVD per side. Every input is checked before
    any fitting."""
    if len(maps) != len(pairs):
        raise LayersimError(f"{len(maps)} maps but {len(pairs)} (x, y) pairs; give one pair per map.")
    data = [fitted._prepare(x, y) for fitted, (x, y) in zip(maps, pairs)]
    groups: dict[type, list[int]] = {}
    for k, fitted in enumerate(maps):
        groups.setdefault(type(fitted)._group_key(), []).append(k)
    for group, members in groups.items():
        group._fit_group([maps[k] for k in members], [data[k] for k in members])
    for fitted, (xs, ys) in zip(maps, data):
        fitted.dims_ = (xs.shape[1], ys.shape[1])
    return list(maps)


class ArrayMemo:
    """``compute(a)`` once per distinct array ``a`` (equal shape and entries) among those it is called with: the
    maps of one group fitted on the same rows share what is computed from them (each map standardises its own
    copy of the rows, so equal content, not identity, decides)."""

    def __init__(self, compute: Callable[[np.ndarray], object]):
        self._compute = compute
        self._seen: dict[tuple, list[tuple[np.ndarray, object]]] = {}

    def __call__(self, a: np.ndarray) -> object:
        candidates = self._seen.setdefault((a.shape, a.dtype.str, a[:1].tobytes()), [])  # cheap first filter
        for rows, value in candidates:
            if rows is a or np.array_equal(rows, a):
                return value
        value = self._compute(a)
        candidates.append((a, value))
        return value


def option_names(cls: type) -> tuple[str, ...]:
    """The keyword arguments a map's constructor accepts (each stored as an attribute of that name)."""
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p != "self")


# --- constructor option checks (shared by all maps) ---


def _float(name: str, value: object) -> float:
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not numeric or not np.isfinite(value):
        raise LayersimError(f"{name} must be a finite number, got {value!r}.")
    return float(value)


def _non_negative_float(name: str, value: object) -> float:
    out = _float(name, value)
    if out < 0:
        raise LayersimError(f"{name} must be >= 0, got {value!r}.")
    return out


def _positive_float(name: str, value: object) -> float:
    out = _float(name, value)
    if out <= 0:
        raise LayersimError(f"{name} must be > 0, got {value!r}.")
    return out


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise LayersimError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def _optional_positive_int(name: str, value: object) -> int | None:
    return None if value is None else _positive_int(name, value)


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise LayersimError(f"{name} must be True or False, got {value!r}.")
    return bool(value)
