"""How the tables' floating-point values are stored (extract.table_precision), the one place that knows it: float32
as is, or float16 or 24-bit integer residuals about a float32 offset, times a power-of-two scale, per column (a neuron
of an activation table, a head of an attention table) and block of rows; offsets and scales kept in the file's
footer. Every reader gets float32 back. :func:`table_encoding` is the rule that picks the encoding of each table.

Why not plain float16: it spans 6e-8 … 65504 with 11 significant bits, and activations defeat it three ways. A
LayerNorm output with a near-zero gain holds neurons of magnitude 1e-8 that it flushes to exact zeros (all-MiniLM-L6-
v2's last layer has three: neuronsim then correlates a constant); an unnormalised residual stream can exceed 65504;
and a neuron that sits far from zero and varies little across examples (MiniLM's CLS rows: a mean of about 10, an sd
of about 1e-3) keeps none of its variation, which is all a similarity measure sees once it centres the column
(linear CKA moved by 0.03, 22 seed sds, measured). So each column is stored as its block mean (float32) plus
residuals scaled so that their largest magnitude lands just below the stored type's largest: float16 residuals in
[2^14, 2^15) keep 11 significant bits down to 2^-29 of the largest, nothing overflows, and the decoded value is
offset + 2^e × residual in float32 (the scale is a power of two, so scaling is exact). bfloat16 would span the range
without scales but keeps 8 bits, fewer than scaled float16: range is handled by the scales, so it buys nothing here.

Why 24-bit integers for word rows: 11 bits were not enough there. Word rows barely differ between fine-tuning seeds
at the bottom layers (seed sds of 1e-6 in CKA), and float16's rounding moved SVCCA, mean CCA, Procrustes, the shape
metric and kNN Jaccard on them by 0.15–0.83 seed sds (benchmarks/table_precision.py); integer residuals in
[2^22, 2^23), every value kept to 2^-23 of its column's largest (float32's own rounding of the model's output is
2^-24 of each value), move them by at most 0.011 (mixedsim moves with float32's own rounding: no storage holds it).
Three bytes a value where float32 takes four keep the paper configuration within its 150 GB (float32 word rows:
160 GB). docs/paper-configuration.md gives the measured effect on every measure, head and
map."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError

# What a table's values are stored as, and in which Parquet type (int24: three little-endian bytes of a two's-
# complement integer). Values are decoded to float32 on reading, before any arithmetic.
VALUE_TYPES = {"float32": pa.float32(), "float16": pa.float16(), "int24": pa.binary(3)}
BYTES_PER_VALUE = {"float32": 4, "float16": 2, "int24": 3}
# extract.table_precision (layersim.params.vocabulary.TABLE_PRECISIONS spells the names out, checked by a test):
# "auto", the rule of :func:`table_encoding`, or one encoding for every table. int24 is fixed point, each value to
# 2^-23 of its column's largest, which suits activations (residuals about a mean) but not attention weights, whose
# tiny values each need their own significant bits (floating point): under int24 attention tables stay float16.
AUTO = "auto"
TABLE_PRECISIONS = (AUTO, *VALUE_TYPES)
# The rule of "auto", per kind of table (a pooling, or "attention"; any other: DEFAULT_ENCODING), from the measured
# effect of each encoding on every measure the stages run (docs/paper-configuration.md): word rows need more than
# float16's 11 bits; example rows and attention maps do not.
AUTO_ENCODINGS = {"tokens": "int24"}
DEFAULT_ENCODING = "float16"
# The footer entry of a scaled table: rows per block and each block's exponents per column and width.
SCALES_KEY = b"layersim.scales"
# A column's largest magnitude is scaled into [2^(top-1), 2^top): float16's largest finite value is 65504 < 2^16;
# a 24-bit integer's is 2^23 - 1.
TOP_EXPONENT = {"float16": 15, "int24": 23}
INT24_LARGEST = 2 ** 23 - 1
ENCODINGS = {"float32": "float32",
             "float16": "float16 residuals about a float32 offset, times a power-of-two scale, per column and block "
                        "of rows",
             "int24": "24-bit integer residuals about a float32 offset, times a power-of-two scale, per column and "
                      "block of rows",
             "float16 unscaled": "float16 without scales (written before scales; tiny values may be zeros)"}


def table_encoding(precision: str, kind: str) -> str:
    """The encoding (a key of VALUE_TYPES) of a table of `kind` (its pooling, or "attention") under
    extract.table_precision `precision`: under "auto" the measured rule, AUTO_ENCODINGS; else the encoding named
    (attention tables float16 under int24)."""
    if precision == AUTO:
        return AUTO_ENCODINGS.get(kind, DEFAULT_ENCODING)
    if precision not in TABLE_PRECISIONS:
        raise LayersimError(f"table precision {precision!r} is not one of {', '.join(TABLE_PRECISIONS)}.")
    return "float16" if precision == "int24" and kind == "attention" else precision


def offsets(values: np.ndarray) -> np.ndarray:
    """Per column of (rows, width) `values`, the mean of its finite values in float32 (0 for none): the residuals
    about it carry the column's variation across rows, which is what every measure reads."""
    finite = np.isfinite(values)
    total = np.where(finite, values, 0.0).sum(axis=0, dtype=np.float64)
    return (total / np.maximum(finite.sum(axis=0), 1)).astype(np.float32)


def exponents(values: np.ndarray, precision: str = "float16") -> np.ndarray:
    """Per column of (rows, width) `values`, the power of two e such that values / 2^e has its largest finite
    magnitude in [2^(top-1), 2^top) (top: TOP_EXPONENT of `precision`; 0 for a column of zeros), as int16."""
    finite = np.where(np.isfinite(values), np.abs(values), 0.0)
    largest = finite.max(axis=0, initial=0.0) if len(values) else np.zeros(values.shape[1:], np.float32)
    _, power = np.frexp(largest.astype(np.float64))  # largest = m · 2^power, m in [0.5, 1)
    return np.where(largest > 0, power - TOP_EXPONENT[precision], 0).astype(np.int16)


def encode(values: np.ndarray, precision: str, centred: bool = True
           ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """(rows, width) float32 values as stored in `precision`, and the per-column (offsets, exponents) (None:
    float32, stored as is). `centred` False keeps offsets at 0: for attention weights, whose many tiny values must
    stay non-negative (a residual about a mean 0.02 rounds a weight of 1e-6 to ±5e-6), each keeps its own 11 bits."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if precision == "float32":
        return values, None
    offset = offsets(values) if centred else np.zeros(values.shape[1:], np.float32)
    if precision == "int24":  # the residual in float64: its 24 bits are kept, not float32's rounding of it
        residual = values.astype(np.float64) - offset
        power = exponents(residual, precision)
        scaled = np.rint(np.ldexp(residual, -power.astype(np.int32)))
        return np.clip(scaled, -INT24_LARGEST, INT24_LARGEST).astype(np.int32), (offset, power)
    residual = (values.astype(np.float64) - offset).astype(np.float32)
    power = exponents(residual, precision)
    return np.ldexp(residual, -power.astype(np.int32)).astype(np.float16), (offset, power)


def to_arrow(stored: np.ndarray, precision: str) -> pa.Array:
    """Stored values (from :func:`encode`), flattened, as the Parquet column's values: int24 as three bytes each."""
    flat = np.ascontiguousarray(stored).reshape(-1)
    if precision != "int24":
        return pa.array(flat)
    raw = flat.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]  # two's complement: the low three bytes
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(3), len(flat), [None, pa.py_buffer(raw.tobytes())])


def from_arrow(values: pa.Array) -> np.ndarray:
    """A column's flat values as float32, before scales: floats upcast (sums of squares of half-precision numbers
    overflow and lose digits), 24-bit integers exactly (float32 holds every integer below 2^24)."""
    if values.type != pa.binary(3):
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32)
    data = np.frombuffer(values.buffers()[1], np.uint8)[3 * values.offset: 3 * (values.offset + len(values))]
    raw = data.reshape(-1, 3).astype(np.int32)
    unsigned = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
    return ((unsigned ^ 0x800000) - 0x800000).astype(np.float32)  # sign-extended from bit 23


def round_trip(values: np.ndarray, precision: str) -> np.ndarray:
    """`values` as a reader gets them back from a table stored in `precision` (an encoding; their rows as one
    block)."""
    stored, scale = encode(values, precision)
    return decode(from_arrow(to_arrow(stored, precision)).reshape(stored.shape), scale)


def decode(stored: np.ndarray, scale: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Stored values (rows, width) as float32: offset + 2^exponent × value per column (`scale`; None: as stored)."""
    values = np.asarray(stored, dtype=np.float32)
    if scale is None:
        return values
    offset, power = scale
    return (np.ldexp(values, power.astype(np.int32)) + offset).astype(np.float32, copy=False)


class Scales:
    """The offsets and exponents of a scaled table: per block of consecutive rows, one float32 offset and one int16
    exponent per (column, position in the column's list). Written into the footer by the writer that encoded the
    blocks; read back by the table's reader, which decodes any range of rows with :meth:`decode`."""

    def __init__(self, columns: list[str], width: int):
        self.columns, self.width = list(columns), width
        self.rows: list[int] = []
        self.offsets: list[np.ndarray] = []    # (columns, width) float32 each
        self.exponents: list[np.ndarray] = []  # (columns, width) int16 each

    def add(self, rows: int, scales: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.rows.append(int(rows))
        self.offsets.append(np.stack([offset for offset, _ in scales]).astype(np.float32))
        self.exponents.append(np.stack([power for _, power in scales]).astype(np.int16))

    def footer(self) -> dict[bytes, bytes]:
        shape = (len(self.rows), len(self.columns), self.width)
        offsets = np.stack(self.offsets) if self.rows else np.zeros(shape, np.float32)
        powers = np.stack(self.exponents) if self.rows else np.zeros(shape, np.int16)
        return {SCALES_KEY: json.dumps({"columns": self.columns, "width": self.width, "rows": self.rows,
                                        "offsets": base64.b64encode(offsets.astype("<f4").tobytes()).decode(),
                                        "exponents": base64.b64encode(powers.astype("<i2").tobytes()).decode()}
                                       ).encode()}

    @classmethod
    def from_footer(cls, footer: dict, path, columns: list[str], width: int, num_rows: int) -> "Scales":
        """The scales in a table's footer, checked against its columns, width and rows; a LayersimError naming the
        file and the extract stage if they are missing or do not fit."""
        raw = footer.get(SCALES_KEY)
        if raw is None:
            raise LayersimError(f"{path} stores scaled values without their scales in its footer; it is "
                                "corrupt, so re-run the extract stage.")
        try:
            found = json.loads(raw)
            scales = cls(found["columns"], int(found["width"]))
            scales.rows = [int(r) for r in found["rows"]]
            shape = (len(scales.rows), len(scales.columns), scales.width)
            scales.offsets = list(np.frombuffer(base64.b64decode(found["offsets"]), "<f4").astype(np.float32)
                                  .reshape(shape))
            scales.exponents = list(np.frombuffer(base64.b64decode(found["exponents"]), "<i2").astype(np.int16)
                                    .reshape(shape))
        except (ValueError, KeyError, TypeError) as err:
            raise LayersimError(f"{path} holds unreadable scales in its footer ({err}); it is corrupt, so re-run the "
                                "extract stage.") from None
        if scales.columns != list(columns) or scales.width != width or sum(scales.rows) != num_rows:
            raise LayersimError(f"{path} holds scales for {sum(scales.rows)} rows of {len(scales.columns)} columns "
                                f"of width {scales.width}, not its {num_rows} rows of {len(columns)} of width {width}; "
                                "it is corrupt, so re-run the extract stage.")
        scales.starts = np.cumsum([0, *scales.rows])
        return scales

    def decode(self, column: str, stored: np.ndarray, first_row: int = 0) -> np.ndarray:
        """Rows first_row … of `column`, stored (rows, width), as float32 values."""
        c, values = self.columns.index(column), np.asarray(stored, dtype=np.float32).copy()
        last = first_row + len(values)
        for b in range(np.searchsorted(self.starts, first_row, side="right") - 1, len(self.rows)):
            start, stop = max(self.starts[b], first_row), min(self.starts[b + 1], last)
            if start >= last:
                break
            if stop > start:
                rows = slice(start - first_row, stop - first_row)
                values[rows] = decode(values[rows], (self.offsets[b][c], self.exponents[b][c]))
        return values


def encoding(value_type: pa.DataType, scaled: bool) -> str:
    """The key of ENCODINGS for a table's stored value type (and whether it carries scales)."""
    if value_type == pa.float32():
        return "float32"
    if value_type == pa.binary(3):
        return "int24"
    return "float16" if scaled else "float16 unscaled"
