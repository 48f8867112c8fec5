"""docs/outputs.md's table of headline metrics, read as data: which keys each metrics file may hold, and what stands
beside each (a null or interval key, or "descriptive"). Used by tests/test_headline_docs.py on the headline
functions and by tests/test_pipeline.py on the metrics files a real run wrote."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

OUTPUTS = Path(__file__).resolve().parents[1] / "docs" / "outputs.md"
HEADER = "| file | keys | meaning | uncertainty |"
CODE = re.compile(r"`([^`]+)`")
# The uncertainty cell's words for a key with nothing beside it, and for a key that is itself a null or interval.
DESCRIPTIVE, ITSELF, AS_ABOVE = "descriptive", "itself", "as above"


@dataclass(frozen=True)
class Row:
    files: tuple[str, ...]   # metrics file paths, with <placeholders>
    keys: tuple[str, ...]    # key paths, with <placeholders> and … (anything)
    uncertainty: str         # the cell as written

    def named(self) -> list[str]:
        """The keys the uncertainty cell names (in code spans)."""
        return CODE.findall(self.uncertainty)


@cache
def table() -> tuple[Row, ...]:
    """The rows of the table (a row with an empty file cell continues the file above)."""
    lines = OUTPUTS.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    rows, files = [], ()
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"docs/outputs.md's headline table: a row of {len(cells)} cells: {line}"
        files = tuple(CODE.findall(cells[0])) or files
        rows.append(Row(files, tuple(CODE.findall(cells[1])), cells[3]))
    return tuple(rows)


def _pattern(text: str, separator: str) -> re.Pattern:
    """A documented path as a regular expression: <placeholder> is one path part, … anything."""
    parts = re.split(r"(<[^>]+>|…)", text)
    return re.compile("".join(f"[^{re.escape(separator)}]+" if p.startswith("<") else ".*" if p == "…"
                              else re.escape(p) for p in parts))


def rows_of(file: str) -> list[Row]:
    """The rows documenting the metrics file `file` (a path relative to the project, e.g.
    metrics/similarity/rte/metrics.json)."""
    return [row for row in table() if any(_pattern(f, "/").fullmatch(file) for f in row.files)]


def leaves(metrics: Mapping, path: tuple[str, ...] = ()) -> list[str]:
    """Every key path of a metrics file's nested dict, joined with "."."""
    found = []
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            found += leaves(value, (*path, str(key)))
        else:
            found.append(".".join((*path, str(key))))
    return found


def undocumented(file: str, metrics: Mapping) -> list[str]:
    """The key paths of `metrics` (the file `file`'s contents) that no row of the table documents."""
    patterns = [_pattern(key, ".") for row in rows_of(file) for key in row.keys]
    return [key for key in leaves(metrics) if not any(p.fullmatch(key) for p in patterns)]
