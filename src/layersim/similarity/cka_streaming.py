"""Linear CKA from row batches (:class:`LinearCKAAccumulator`), in memory independent of the number of
examples, for activation tables larger than memory; the same matrix as :func:`layersim.similarity.cka_matrix`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import (CONSTANT_RTOL, as_list, validated)

from layersim.similarity._cka_kernels import (BLOCK_ROWS, PRECISIONS, SCRATCH_BYTES, _add_panel, _normalise,
                                              _panel_hsic, _panels)

# Rows of the uniform sample an accumulator keeps by default: float32, 123 MB for 39 layers of 768.
SAMPLE_ROWS = 1024


class LinearCKAAccumulator:
    """Exact linear CKA between every pair of L layers, from the examples' rows in batches.

    For activation tables larger than memory: feed the rows of all layers batch by batch (the same
    examples in the same order in every layer), then ask for the L x L matrix. It equals
    ``cka_matrix(layers)`` on the concatenated rows (to ~1e-12 with ``precision="float64"``,
    ~1e-7 with float32 products) whatever the batch sizes, and its memory does not grow with the
    number of rows: float64 sums of the cross-products of every pair of layers (the upper triangle
    of ``Zᵀ Z`` for the stacked layers ``Z``, in panels: about ``4·(sum d)²`` bytes, 0.49 GB for 13
    layers of 768, 3.9 GB for 39) plus one block of rows; see :meth:`memory_bytes`.

    Centring needs the mean, which a single pass only knows at the end. So every row is shifted by
    the first batch's means ``s`` (float64) before its products are taken, ``u = x - s``, and the
    sums ``Σ u`` and ``Σ uᵀu`` are kept; at the end ``Zcᵀ Zc = Σ uᵀu - n ū ūᵀ``. Because ``s`` is
    already close to the mean, ``ū`` is small and the subtraction cancels few digits, where the
    textbook ``Σ xᵀx - n x̄ x̄ᵀ`` would lose them all for activations with large means.

    ::

        acc = LinearCKAAccumulator()
        for batch in table.iter_batches(4096):   # each: list of (rows, hidden) arrays, one per layer
            acc.update(batch)
        matrix = acc.matrix()

    Parameters
    ----------
    precision : "auto", "float32" or "float64" — the precision of the products, as for
        :func:`cka_matrix` (shifts and all sums are float64). "auto" (default) is float32 when the
        first batch is float32 (or narrower) and float64 otherwise: the number of rows is not known
        in advance, so unlike cka_matrix it does not look at the size.
    sample_rows : size of a uniform random sample of whole rows (every layer) kept along the pass, for the
        nulls' tails (:meth:`sample`); all rows, in order, while at most this many were seen. 0 keeps none.
    seed : seed of the sample (reservoir sampling, Algorithm R: one draw per row, whatever the batches).
    """

    def __init__(self, *, precision: str = "auto", sample_rows: int = SAMPLE_ROWS, seed: int = 0):
        if precision not in PRECISIONS:
            raise unknown_name("precision", precision, PRECISIONS)
        if isinstance(sample_rows, bool) or not isinstance(sample_rows, (int, np.integer)) or sample_rows < 0:
            raise LayersimError(f"sample_rows must be an integer >= 0, got {sample_rows!r}.")
        self.precision = precision
        self.sample_rows = int(sample_rows)
        self._rng = np.random.default_rng(seed)
        self._sample: np.ndarray | None = None  # (sample_rows, sum d) in the batches' dtype
        self.num_rows = 0
        self._dtype: type | None = None
        self._offsets: np.ndarray | None = None
        self._panels: list[tuple[int, int]] = []
        self._shift: list[np.ndarray] | None = None  # per layer, float64
        self._sums: np.ndarray | None = None  # Σ u over rows, per stacked column
        self._cross: list[np.ndarray] = []  # per panel: Σ u_panelᵀ u[:, panel start:]
        self._part: np.ndarray | None = None  # float32 scratch for the largest panel product

    @property
    def widths(self) -> list[int] | None:
        """The layers' widths, fixed by the first batch (None before it)."""
        return None if self._offsets is None else np.diff(self._offsets).tolist()

    @staticmethod
    def memory_bytes(widths: Sequence[int], batch_rows: int, precision: str = "float64",
                     sample_rows: int = SAMPLE_ROWS) -> int:
        """About how many bytes an accumulator for layers of these widths holds while it is fed
        batches of ``batch_rows`` rows (the batches themselves not counted; the row sample as float32)."""
        offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        sizes = [int(offsets[stop] - offsets[first]) * int(offsets[-1] - offsets[first])
                 for first, stop in _panels(offsets)]
        item = 4 if precision == "float32" else 8
        rows = min(batch_rows, LinearCKAAccumulator._block_rows(int(offsets[-1]), item))
        # The sums, one panel product before it is added, the shifted block of rows.
        return (8 * (sum(sizes) + int(offsets[-1])) + item * max(sizes) + item * rows * int(offsets[-1])
                + 4 * sample_rows * int(offsets[-1]))

    def update(self, layers: Sequence[np.ndarray]) -> None:
        """Add a batch of rows: ``layers[k]`` is a (rows, d_k) array for layer k; every batch has the
        same layers and widths, and the same number of rows in every layer.

        Raises LayersimError for a batch that is not that, or holds NaN/inf (naming the layer).
        """
        named = [(f"layers[{k}]", a) for k, a in enumerate(as_list(layers, "layers"))]
        arrays = [a for _, a in validated(named, "CKA", min_rows=0)]
        if self._offsets is None:
            self._start(arrays)
        else:
            widths = [a.shape[1] for a in arrays]
            if widths != self.widths:
                raise LayersimError(
                    f"this batch has layers of widths {widths}, but the first batch had {self.widths}; "
                    "every batch must hold the same layers."
                )
        rows = arrays[0].shape[0]
        if rows == 0:
            return
        if self._shift is None:
            self._shift = [a.mean(axis=0, dtype=np.float64) for a in arrays]
        self._keep_sample(arrays)
        offsets = self._offsets
        # A block of rows at a time bounds the scratch memory, and the float32 sums (see BLOCK_ROWS).
        block = self._block_rows(int(offsets[-1]), np.dtype(self._dtype).itemsize)
        for start in range(0, rows, block):
            stop = min(start + block, rows)
            u = np.empty((stop - start, int(offsets[-1])), dtype=self._dtype)
            for k, a in enumerate(arrays):
                # Shift in float64, round to the product dtype on the way out.
                np.subtract(a[start:stop], self._shift[k], out=u[:, offsets[k] : offsets[k + 1]],
                            dtype=np.float64, casting="same_kind")
            self._sums += u.sum(axis=0, dtype=np.float64)
            norms = np.stack([np.einsum("ij,ij->i", u[:, offsets[k] : offsets[k + 1]], u[:, offsets[k] : offsets[k + 1]],
                                        dtype=np.float64) for k in range(len(arrays))], axis=1)
            self._norm_products += norms.T @ norms
            self._weighted += norms.T @ u
            for (first, last), cross in zip(self._panels, self._cross):
                _add_panel(cross, u, offsets[first], offsets[last], self._part)
            self.num_rows += stop - start

    def _keep_sample(self, arrays: list[np.ndarray]) -> None:
        """Algorithm R: row t (0-based) replaces slot ``j ~ U{0..t}`` when ``j < sample_rows``."""
        if not self.sample_rows:
            return
        if self._sample is None:
            dtype = np.result_type(*arrays, np.float32)
            self._sample = np.empty((self.sample_rows, int(self._offsets[-1])), dtype=dtype)
        rows, seen = arrays[0].shape[0], self.num_rows
        slots = np.arange(seen, seen + rows)
        late = slots >= self.sample_rows
        slots[late] = self._rng.integers(0, slots[late] + 1)
        take = np.flatnonzero(slots < self.sample_rows)  # in order: a later row overwrites an earlier one
        for k, a in enumerate(arrays):
            self._sample[slots[take], self._offsets[k]:self._offsets[k + 1]] = a[take]

    def sample(self, i: int) -> np.ndarray:
        """Layer i's rows in the uniform random sample (``min(sample_rows, num_rows)`` rows, not centred): all
        rows in their order when the table had at most ``sample_rows``."""
        self._check_rows()
        if not self.sample_rows:
            raise LayersimError("this accumulator keeps no row sample (sample_rows=0).")
        return self._sample[:min(self.sample_rows, self.num_rows), self._offsets[i]:self._offsets[i + 1]]

    @staticmethod
    def _block_rows(columns: int, itemsize: int) -> int:
        # At most BLOCK_ROWS rows and about SCRATCH_BYTES of shifted rows (wide stacks get fewer rows).
        return max(256, min(BLOCK_ROWS, SCRATCH_BYTES // (columns * itemsize)))

    def _start(self, arrays: list[np.ndarray]) -> None:
        widths = [a.shape[1] for a in arrays]
        self._offsets = offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        self._panels = _panels(offsets)
        narrow = all(a.dtype.kind == "f" and a.dtype.itemsize <= 4 for a in arrays)
        float32 = self.precision == "float32" or (self.precision == "auto" and narrow)
        self._dtype = np.float32 if float32 else np.float64
        self._sums = np.zeros(int(offsets[-1]))
        self._norm_products = np.zeros((len(widths), len(widths)))  # [a, b]: Σ ‖u_a‖² ‖u_b‖²
        self._weighted = np.zeros((len(widths), int(offsets[-1])))  # [a, columns of b]: Σ ‖u_a‖² u_b
        self._cross = [np.zeros((offsets[stop] - offsets[first], offsets[-1] - offsets[first]))
                       for first, stop in self._panels]
        if float32:
            self._part = np.empty(max(c.size for c in self._cross), dtype=np.float32)

    def constant_layers(self) -> np.ndarray:
        """Boolean mask of the layers that are constant across the rows seen so far (CKA undefined);
        the same rule as :func:`is_constant`."""
        self._check_rows()
        return self._constant(self._centred())

    def matrix(self, *, constant: str = "raise") -> np.ndarray:
        """The L x L linear CKA matrix of the rows seen so far: symmetric, diagonal exactly 1.

        ``constant="raise"`` (default) raises a LayersimError for a layer that is constant across the
        examples, as :func:`cka_matrix` does; ``constant="nan"`` gives such layers NaN rows and
        columns (diagonal included) instead, as layersim.similarity.comparisons draws them.
        """
        if constant not in ("raise", "nan"):
            raise unknown_name("constant", constant, ("raise", "nan"))
        self._check_rows()
        centred = self._centred()
        hsic = self._hsic(centred)
        is_constant = self._constant(centred)
        if constant == "raise" and is_constant.any():
            k = int(np.argmax(is_constant))
            raise LayersimError(
                f"layers[{k}] is constant across examples (zero variance after centring), so its CKA is "
                "undefined; drop that layer or check how it was extracted."
            )
        defined = np.flatnonzero(~is_constant)
        out = np.full(hsic.shape, np.nan)
        if defined.size:
            sub = hsic[np.ix_(defined, defined)]
            self_terms = np.diag(sub).copy()
            out[np.ix_(defined, defined)] = _normalise(sub, self_terms, self_terms, symmetric=True)
        return out

    def hsic(self) -> np.ndarray:
        """The unnormalised L x L terms ``‖Xc_iᵀ Xc_j‖²_F`` (= ``tr(K_i H K_j H)`` for linear kernels) of the
        rows seen so far, symmetric: for estimators that add terms before normalising (the Nyström
        route of RBF CKA)."""
        self._check_rows()
        hsic = self._hsic(self._centred())
        upper = np.triu_indices(len(hsic), 1)
        hsic[upper[::-1]] = hsic[upper]
        return hsic

    def _hsic(self, centred: list[np.ndarray]) -> np.ndarray:
        """The upper triangle of the HSIC terms from the panels' centred cross-products."""
        num = len(self._offsets) - 1
        hsic = np.zeros((num, num))
        for (first, stop), panel in zip(self._panels, centred):
            _panel_hsic(hsic, panel, self._offsets, first, stop)
        return hsic

    def centred_block(self, i: int, j: int) -> np.ndarray:
        """The centred cross-products ``Xc_iᵀ Xc_j`` of layers i and j (float64, d_i × d_j, a new array) of
        the rows seen so far: what the CCA family, neuronsim and mixedsim need from the data
        (layersim.similarity.moments)."""
        self._check_rows()
        if i > j:
            return self.centred_block(j, i).T.copy()
        offsets, n = self._offsets, self.num_rows
        mean = self._sums / n
        return self._raw_block(i, j) - n * np.outer(mean[offsets[i]:offsets[i + 1]], mean[offsets[j]:offsets[j + 1]])

    def row_norm_products(self) -> tuple[np.ndarray, np.ndarray]:
        """The centred rows' squared norms, summed (``tr K`` per layer) and multiplied across layers
        (``[a, b] = Σ_i ‖xc_a,i‖² ‖xc_b,i‖²``; its diagonal is ``Σ_i K_ii²``), from the sums kept per batch:
        what linear CKA's exact permutation null and debiased CKA need beyond the cross-products.

        With ``u`` the shifted rows, ``ū`` their mean, ``s_i = ‖u_i‖²`` and ``c = ‖ū‖²``, the centred norm is
        ``s_i - 2 u_i·ū + c``, so the products expand into ``Σ s_a s_b - 2 ū_b·Σ s_a u_b - 2 ū_a·Σ s_b u_a
        + 4 ū_aᵀ(Σ u_aᵀ u_b)ū_b + c_b Σ s_a + c_a Σ s_b - 3n c_a c_b``."""
        self._check_rows()
        offsets, n, num = self._offsets, self.num_rows, len(self._offsets) - 1
        means = [self._sums[offsets[i] : offsets[i + 1]] / n for i in range(num)]
        sq_means = np.array([m @ m for m in means])
        sum_sq = np.array([np.trace(self._raw_block(i, i)) for i in range(num)])
        products = np.empty((num, num))
        for a in range(num):
            for b in range(a, num):
                value = (self._norm_products[a, b]
                         - 2.0 * means[b] @ self._weighted[a, offsets[b] : offsets[b + 1]]
                         - 2.0 * means[a] @ self._weighted[b, offsets[a] : offsets[a + 1]]
                         + 4.0 * means[a] @ self._raw_block(a, b) @ means[b]
                         + sq_means[b] * sum_sq[a] + sq_means[a] * sum_sq[b] - 3.0 * n * sq_means[a] * sq_means[b])
                products[a, b] = products[b, a] = value
        return sum_sq - n * sq_means, products

    def _raw_block(self, i: int, j: int) -> np.ndarray:
        """``Σ u_iᵀ u_j`` of the shifted rows (a view; i ≤ j)."""
        offsets = self._offsets
        panel = next(k for k, (first, stop) in enumerate(self._panels) if first <= i < stop)
        base = offsets[self._panels[panel][0]]
        return self._cross[panel][offsets[i] - base : offsets[i + 1] - base, offsets[j] - base : offsets[j + 1] - base]

    def layer_mean(self, i: int) -> np.ndarray:
        """The mean of layer i's neurons over the rows seen so far (float64)."""
        self._check_rows()
        return self._shift[i] + self._sums[self._offsets[i]:self._offsets[i + 1]] / self.num_rows

    def _check_rows(self) -> None:
        if self.num_rows < 2:
            raise LayersimError(f"the accumulator has seen {self.num_rows} rows; CKA needs at least 2 rows (examples).")

    def _centred(self) -> list[np.ndarray]:
        """Each panel's centred cross-products ``Σ uᵀu - n ū ūᵀ`` (new arrays; the sums are kept)."""
        offsets, n = self._offsets, self.num_rows
        mean = self._sums / n
        return [cross - n * np.outer(mean[offsets[first] : offsets[stop]], mean[offsets[first] :])
                for (first, stop), cross in zip(self._panels, self._cross)]

    def _constant(self, centred: list[np.ndarray]) -> np.ndarray:
        """Per layer: whether its centred rows are negligible next to its raw rows (as is_constant),
        from the trace of its own block of centred cross-products."""
        offsets, n = self._offsets, self.num_rows
        mean_u = self._sums / n
        out = []
        for (first, stop), panel in zip(self._panels, centred):
            for i in range(first, stop):
                lo, hi = offsets[i] - offsets[first], offsets[i + 1] - offsets[first]
                centred_sq = max(float(np.trace(panel[lo:hi, lo:hi])), 0.0)  # rounding may leave -tiny
                mean = self._shift[i] + mean_u[offsets[i] : offsets[i + 1]]
                out.append(centred_sq <= CONSTANT_RTOL**2 * (centred_sq + n * float(mean @ mean)))
        return np.array(out)
