"""Write .dvc/plots/offline.html: the page `dvc plots show/diff` fill in, with Vega, Vega-Lite and
Vega-Embed inlined so that the rendered page works without network (DVC's default page loads them
from a CDN). .dvc/config points `plots.html_template` at it.

Usage: python tools/offline_plots_template.py [--npm-dir DIR]
Without --npm-dir it runs `npm pack` for the pinned versions below into a temporary folder.
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGES = {"vega": "5.33.1", "vega-lite": "5.23.0", "vega-embed": "6.29.0"}  # BSD-3-Clause
OUT = Path(__file__).resolve().parents[1] / ".dvc" / "plots" / "offline.html"

PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>layersim plots</title>
{scripts}
    <style>
        body {{ font-family: sans-serif; }}
        table {{ border-spacing: 15px; }}
        img {{ max-width: 100%; }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def minified_script(tarball: Path, name: str) -> str:
    with tarfile.open(tarball) as tar:
        source = tar.extractfile(f"package/build/{name}.min.js").read().decode("utf-8")
    if "</script" in source:  # would end the inline <script> element early
        raise SystemExit(f"{name}.min.js contains '</script'; it cannot be inlined as is.")
    return f"    <!-- {name} {PACKAGES[name]} (BSD-3-Clause) -->\n    <script>{source}</script>"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npm-dir", type=Path, help="folder holding the `npm pack` tarballs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.npm_dir or Path(tmp)
        if args.npm_dir is None:
            specs = [f"{name}@{version}" for name, version in PACKAGES.items()]
            subprocess.run(["npm", "pack", *specs], cwd=folder, check=True, capture_output=True)
        scripts = "\n".join(minified_script(folder / f"{name}-{version}.tgz", name) for name, version in PACKAGES.items())
        OUT.write_text(PAGE.format(scripts=scripts), encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
