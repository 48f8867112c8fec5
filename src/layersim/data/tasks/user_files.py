"""Reading a user task's file (CSV, TSV, JSON Lines, Parquet) into columns of Python values.

Each problem is one sentence naming the file, where (``line N`` of the file for what breaks parsing,
``row N`` for a value: data rows counted from 1, the header excluded) and what to do. Nothing is written
here: :mod:`layersim.data.tasks.user` checks the values and builds the task tables.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from layersim.errors import LayersimError

FILE_TYPES = {".csv": "CSV", ".tsv": "TSV", ".jsonl": "JSON Lines", ".parquet": "Parquet"}
# A text field longer than this is a file read wrongly (an unclosed quote swallows the rows after it)
# far more often than a real input: a model reads at most finetune.max_length tokens of it anyway.
MAX_FIELD_CHARS = 100_000
_BLOCK = 16 << 20  # pyarrow's CSV block: a row must fit in one


def read_columns(path: Path, columns: Sequence[str], key: str) -> dict[str, list]:
    """The values of `columns` in the file at `path` (declared by the params key `key`), one list per
    column, in file order: strings for CSV and TSV, JSON's and Parquet's own types otherwise (None where a
    JSON object lacks the key)."""
    if not path.is_file():
        raise LayersimError(f"{key}: the file {path} does not exist; put it there (inside user_data/) or fix the "
                            "path in params.yaml.")
    if path.stat().st_size == 0:
        raise LayersimError(f"{path} is empty (0 bytes); it needs a header and rows ({key}).")
    kind = path.suffix
    if kind == ".parquet":
        values = _parquet(path, columns)
    else:
        _check_utf8(path)
        delimiter = "\t" if kind == ".tsv" else ","
        values = _jsonl(path, columns) if kind == ".jsonl" else _delimited(path, columns, delimiter)
    for name, column in values.items():
        for row, value in enumerate(column, 1):
            if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
                raise LayersimError(f"{path} row {row} column {name!r} holds {len(value):,} characters, more than "
                                    f"{MAX_FIELD_CHARS:,}; an unclosed quote before it? Fix the row or shorten it.")
    return values


def _missing_columns(path: Path, found: Sequence[str], wanted: Sequence[str]) -> None:
    missing = [name for name in wanted if name not in found]
    if missing:
        shown = ", ".join(map(repr, list(found)[:30])) or "none"
        raise LayersimError(f"{path} has no column {missing[0]!r}; its columns are {shown}: rename the column or "
                            "name one of those in params.yaml (text / label / group).")


def _check_utf8(path: Path) -> None:
    """Refuse a text file that is not UTF-8, naming the first bad line (a BOM is fine)."""
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise LayersimError(f"{path} is not UTF-8: line {line_number} has the byte "
                                    f"0x{line[err.start]:02x} at position {err.start + 1}; save the file as "
                                    "UTF-8.") from None


def _delimited(path: Path, columns: Sequence[str], delimiter: str) -> dict[str, list]:
    import pyarrow.csv as pcsv

    with open(path, encoding="utf-8-sig", newline="") as f:
        header = next(csv.reader(f, delimiter=delimiter), None) if delimiter == "," else f.readline().rstrip(
            "\r\n").split("\t")
    if not header or header == [""]:
        raise LayersimError(f"{path} has no header line; its first line must name the columns.")
    twice = [name for k, name in enumerate(header) if name in header[:k]]
    if twice:
        raise LayersimError(f"{path} names the column {twice[0]!r} twice in its header; give each column its own "
                            "name.")
    _missing_columns(path, header, columns)
    bad = []

    def invalid(row) -> str:  # pyarrow's row.number is the line number (the header is line 1)
        bad.append(row)
        return "skip"

    # TSV has no quoting (as GLUE's files): a quote is text. CSV quotes may hold newlines.
    parse = pcsv.ParseOptions(delimiter=delimiter, quote_char='"' if delimiter == "," else False,
                              newlines_in_values=delimiter == ",", invalid_row_handler=invalid)
    convert = pcsv.ConvertOptions(column_types={name: pa.string() for name in header}, include_columns=list(columns),
                                  strings_can_be_null=False, quoted_strings_can_be_null=False)
    try:
        table = pcsv.read_csv(path, read_options=pcsv.ReadOptions(block_size=_BLOCK, use_threads=False),
                              parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid as err:
        detail = str(err).splitlines()[0]
        if "straddling" in detail or "block" in detail:
            raise LayersimError(f"{path} has a row longer than {_BLOCK >> 20} MiB; an unclosed quote? Fix the file "
                                "(each row on its own line, quotes closed).") from None
        raise LayersimError(f"{path} could not be read as {FILE_TYPES[path.suffix]}: {detail}; fix the file.") from None
    if bad:
        row = bad[0]
        where = f"line {row.number}" if row.number is not None else "a line"
        raise LayersimError(f"{path} {where} has {row.actual_columns} field(s), the header {row.expected_columns}; "
                            f"fix that row (a {'tab' if delimiter != ',' else 'comma or quote'} too many or too "
                            "few?).")
    return {name: table.column(name).to_pylist() for name in columns}


def _jsonl(path: Path, columns: Sequence[str]) -> dict[str, list]:
    """JSON Lines: one object per line (blank lines skipped); read in Python so that a bad line is named."""
    values: dict[str, list] = {name: [] for name in columns}
    seen: set[str] = set()
    with open(path, encoding="utf-8-sig") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise LayersimError(f"{path} line {line_number} is not valid JSON ({err.msg} at column {err.colno}); "
                                    "fix that line (one JSON object per line).") from None
            if not isinstance(row, dict):
                raise LayersimError(f"{path} line {line_number} holds a JSON {type(row).__name__}, not an object; "
                                    "write one object per line, e.g. {\"text\": \"…\", \"label\": 1}.")
            seen.update(row)
            for name in columns:
                values[name].append(row.get(name))
    _missing_columns(path, sorted(seen), columns if seen else ())
    return values


def _parquet(path: Path, columns: Sequence[str]) -> dict[str, list]:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        _missing_columns(path, schema.names, columns)
        table = pq.read_table(path, columns=list(columns))
    except (pa.ArrowInvalid, OSError) as err:
        raise LayersimError(f"{path} is not a readable Parquet file ({str(err).splitlines()[0]}); write it again "
                            "or use CSV.") from None
    return {name: table.column(name).to_pylist() for name in columns}
