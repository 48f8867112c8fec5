"""The report page as HTML: figures, tables and sections rendered into one self-contained document (figures as
PNG data URIs, no script, no external file), so that it renders offline in any browser. What goes on the page is
:mod:`layersim.reporting.page`'s."""

from __future__ import annotations

import base64
import html
import io
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    caption: str
    png: bytes


@dataclass(frozen=True)
class Table:
    title: str
    header: Sequence[str]
    rows: Sequence[Sequence[object]]
    note: str = ""


@dataclass
class Section:
    title: str
    facts: list[str] = field(default_factory=list)   # one sentence each
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


def png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (closed afterwards)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; line-height: 1.4 }
h1 { font-size: 1.6em } h2 { border-bottom: 1px solid #ccc; padding-top: 1em } h3 { font-size: 1.05em }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left } th { background: #f3f3f3 }
figure { display: inline-block; margin: 0.5em 1em 1em 0; vertical-align: top; max-width: 100%; overflow-x: auto }
figure img { max-width: 100%; border: 1px solid #eee; cursor: zoom-in }
figcaption { font-size: 0.85em; color: #555; max-width: 560px }
.zoom { display: none } .zoom:checked + label img { max-width: none; cursor: zoom-out }
.zoom:checked + label + figcaption { max-width: none }
.note { font-size: 0.85em; color: #555 } nav a { margin-right: 1em }
"""


def _table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{html.escape(table.note)}</p>' if table.note else ""
    return f"<h3>{html.escape(table.title)}</h3><table><tr>{head}</tr>{body}</table>{note}"


def _figure(figure: Figure, number: int) -> str:
    """A figure fitted to the page; a click shows it at full size (a grid of heatmaps is wider than the page),
    scrolled sideways in its frame, and a second click fits it again: a checkbox and CSS, no script."""
    data = base64.b64encode(figure.png).decode("ascii")
    caption = html.escape(figure.caption)
    return (f'<figure><input type="checkbox" class="zoom" id="figure-{number}"><label for="figure-{number}" '
            f'title="click: full size / fit to the page"><img src="data:image/png;base64,{data}" alt="{caption}">'
            f'</label><figcaption>{caption} (Click the figure for full size.)</figcaption></figure>')


def _anchor(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower())


def render(title: str, intro: Iterable[str], overview: Table, summary: Iterable[Figure],
           sections: Sequence[Section]) -> str:
    """The whole page as one HTML document."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in intro]
    parts.append("<nav>" + "".join(f'<a href="#{_anchor(s.title)}">{html.escape(s.title)}</a>' for s in sections)
                 + "</nav>")
    parts.append(_table(overview))
    figures = itertools.count(1)
    parts += [_figure(f, next(figures)) for f in summary]
    for section in sections:
        parts.append(f'<h2 id="{_anchor(section.title)}">{html.escape(section.title)}</h2>')
        parts += [f"<p>{html.escape(line)}</p>" for line in section.facts]
        parts += [_table(t) for t in section.tables]
        parts += [_figure(f, next(figures)) for f in section.figures]
    parts.append("</body></html>\n")
    return "\n".join(parts)
