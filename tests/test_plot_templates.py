"""The Vega-Lite templates `dvc plots show` fills in (.dvc/plots/): what keeps their pages readable as an experiment
grows (issue 64: past 10 series the curves repeated their 10 colours; a row of 8 heatmap panels was 1,989 px wide, over
a 1,400 px page). tests/test_browser.py renders them in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / ".dvc" / "plots"
PAGE_WIDTH = 1400
# Vega's default point shapes (circle, square, cross, diamond, four triangles) and the colours of each scheme used.
SHAPES = 8
SCHEME_COLOURS = {"tableau20": 20, "category20": 20, "tableau10": 10, "category10": 10}


def _template(name: str) -> dict:
    return json.loads((TEMPLATES / f"{name}.json").read_text(encoding="utf-8"))


def test_curves_stay_distinct_well_past_ten_series():
    encoding = _template("layer_series")["encoding"]
    colours = SCHEME_COLOURS[encoding["color"].get("scale", {}).get("scheme", "tableau10")]
    shapes = SHAPES if encoding.get("shape", {}).get("field") == encoding["color"]["field"] else 1
    # Colour and shape cycle through their ranges together: series i gets colour i mod 20 and shape i mod 8.
    distinct = len({(i % colours, i % shapes) for i in range(100)})
    assert distinct >= 40, f"{distinct} distinguishable series"


def test_heatmap_panels_wrap_within_the_page():
    spec = _template("layer_heatmap")
    width = spec["spec"]["width"]
    assert "column" not in spec["facet"] and "row" not in spec["facet"], "a row/column grid grows with the comparisons"
    axis_and_padding = 100  # measured: 4 columns of 140 px panels render 1,032 px wide (node, Vega 5)
    assert spec["columns"] * (width + axis_and_padding) + 100 <= PAGE_WIDTH
    # Phang et al.'s four comparisons first, in their order; the others after them.
    transform = json.dumps(spec["transform"], ensure_ascii=False)
    assert "['ORIG–ORIG', 'FT–ORIG', 'FT–FT', 'FT[1]–FT[2]']" in transform
