"""The README and docs/: every relative link and anchor resolves, every layersim module or name they cite
exists, every page is in the site's navigation. Fast, no build: CI also runs `mkdocs build --strict` (.ci/run)."""

from __future__ import annotations

import ast
import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PAGES = sorted((REPO / "docs").rglob("*.md"))
DOCUMENTS = [REPO / "README.md", *PAGES]
README_MAX_LINES = 250  # the front door; the manual is docs/

FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
DOTTED = re.compile(r"(?<![\w./-])layersim(?:\.[A-Za-z_]\w*)+")


def prose(text: str) -> str:
    """The text without code blocks and code spans: links there are examples, not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug_mkdocs(heading: str) -> str:
    """Python-Markdown's toc slug, as the site builds it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def slug_github(heading: str) -> str:
    """GitHub's anchor for a heading, as README readers follow it."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Anchors both renderers give the page's headings (a link must work on GitHub and on the site)."""
    headings = [re.sub(r"[`*]", "", h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))]
    return frozenset(slug_mkdocs(h) for h in headings) & frozenset(slug_github(h) for h in headings)


REFERENCE_LINK = re.compile(r"(?<!\\)\[[^\]\n]*\]\[([^\]\n]+)\]")  # [text][id]: a reference autorefs resolves
DEFINITION = re.compile(r"^ {0,3}\[([^\]\n]+)\]:", re.M)


def undefined_references(page: Path) -> list[str]:
    """`[text][id]` in prose with no `[id]:` definition: mkdocs-autorefs fails the strict build on them (an
    indexing expression such as K[π][:, π] outside a code span reads as one)."""
    text = prose(page.read_text(encoding="utf-8"))
    defined = {d.lower() for d in DEFINITION.findall(text)}
    return [ref for ref in REFERENCE_LINK.findall(text) if ref.lower() not in defined]


@pytest.mark.parametrize("page", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_undefined_reference_links(page):
    assert not undefined_references(page), f"{page.name}: put these in a code span: {undefined_references(page)}"


def test_the_reference_check_sees_an_indexing_expression(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("the gather K[p][:, p] of every kernel, `K[p][:, p]` in code, [a link][ok]\n\n[ok]: x.md\n")
    assert undefined_references(page) == [":, p"]


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not checked offline


@pytest.mark.parametrize("page", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_checker_sees_broken_links(tmp_path):
    """The link check itself: a missing file and a missing anchor are found, code is not read as links."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Sharing results\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#sharing-results) [b](missing.md) [c](other.md#nowhere) `[d](nope.md)`\n"
                    "```\n[e](nope.md)\n```\n[f](https://example.org)\n")
    assert links(page) == ["other.md#sharing-results", "missing.md", "other.md#nowhere"]
    assert "sharing-results" in anchors(tmp_path / "other.md") and "nowhere" not in anchors(tmp_path / "other.md")
    assert slug_mkdocs("GPUs and scale-out") == slug_github("GPUs and scale-out") == "gpus-and-scale-out"


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


@cache
def defined_names(module: Path) -> frozenset[str]:
    """Names a module defines or imports at its top level (also inside top-level if/try blocks)."""
    names: set[str] = set()
    body = list(ast.parse(module.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "handlers", []) + getattr(node, "finalbody", [])
        elif isinstance(node, ast.ExceptHandler):
            body += node.body
    return frozenset(names)


def resolves(dotted: str) -> bool:
    """`layersim.a.b.name`: a module or package path, then (optionally) a name that module defines; what
    follows the name (a method, an attribute) is not checked."""
    path, parts = SRC / "layersim", dotted.split(".")[1:]
    for i, part in enumerate(parts):
        if (path / part / "__init__.py").exists():
            path = path / part
        elif (path / f"{part}.py").exists():
            rest, module = parts[i + 1:], path / f"{part}.py"
            break
        else:
            rest, module = parts[i:], path / "__init__.py"
            break
    else:
        return True
    return not rest or rest[0] in defined_names(module)


@pytest.mark.parametrize("page", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_cited_modules_and_names_exist(page):
    """A moved or renamed module leaves no stale `layersim.x` behind in the docs (e.g. `python -m
    layersim.params.lockfile sync`, `layersim.similarity.permutation_test`)."""
    cited = set(DOTTED.findall(page.read_text(encoding="utf-8")))
    stale = sorted(name for name in cited if not (REPO / name).exists() and not resolves(name))  # layersim.lock
    assert not stale, f"{page.relative_to(REPO)} cites what src/layersim does not hold: {stale}"


def test_the_name_check_sees_stale_names():
    assert resolves("layersim.similarity.permutation_test") and resolves("layersim.params.lockfile")
    assert not resolves("layersim.seed_stats") and not resolves("layersim.similarity.no_such_measure")


def nav_pages(entries) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages |= nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_page_is_in_the_site_and_every_reference_page_names_a_package():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    in_nav = nav_pages(config["nav"])
    on_disk = {str(p.relative_to(REPO / "docs")) for p in PAGES}
    assert in_nav == on_disk, f"nav only: {in_nav - on_disk}; docs/ only (add to mkdocs.yml nav): {on_disk - in_nav}"
    for page in (REPO / "docs" / "api").glob("*.md"):
        targets = re.findall(r"^::: (\S+)", page.read_text(encoding="utf-8"), re.M)
        assert targets and all(resolves(t) for t in targets), (page.name, targets)
