"""Every `pkg.sub` that the library and the stages reach through an attribute is a submodule they import, or
one that a plain `import pkg` gives a fresh interpreter.

The integration tests run the stages in forks of a server that imported scipy.stats, pyarrow.parquet,
matplotlib.pyplot, torch._dynamo, ... already (tests/fork_server.py's PRELOAD): a stage that uses
`pyarrow.parquet.read_table` after only `import pyarrow` passes every one of them and fails for users with
AttributeError. This reads the source instead (every file, every function body, not only what a test runs).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from dvc_project import REPO

SOURCES = sorted([*(REPO / "src").rglob("*.py"), *(REPO / "stages").glob("*.py")])


def _module_name(path: Path) -> str | None:
    """The dotted name of a file under src/ (None for a stage script, which is no package's module)."""
    if REPO / "src" not in path.parents:
        return None
    parts = path.relative_to(REPO / "src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module: str | None) -> tuple[set[str], dict[str, str]]:
    """The modules the file imports (a dotted import loads each parent too) and the names bound to modules."""
    imported, bound = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                imported.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[parts[0]] = parts[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package
                package = (module or "").split(".")
                package = package[:len(package) - node.level + (1 if _is_package(module) else 0)]
                base = ".".join(filter(None, [*package, base]))
            parts = base.split(".")
            imported.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            for alias in node.names:  # `from pkg import sub` imports pkg.sub where it is a submodule
                imported.add(f"{base}.{alias.name}")
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return imported, bound


def _is_package(module: str | None) -> bool:
    return module is not None and (REPO / "src" / module.replace(".", "/") / "__init__.py").is_file()


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain does not start at a plain name."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return [node.id, *reversed(chain)] if isinstance(node, ast.Name) else None


@cache
def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _given_by_plain_imports(uses: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (package, attribute) pairs for which `import package; package.attribute` works in a fresh interpreter
    (a lazy loader, as scipy's and sklearn's, or a package that imports the submodule itself): one interpreter
    per top-level package, parents imported shortest first."""
    given = set()
    for top in sorted({package.split(".")[0] for package, _ in uses}):
        pairs = sorted((package, attribute) for package, attribute in uses if package.split(".")[0] == top)
        code = ("import importlib, sys\n"
                f"for package, attribute in {pairs!r}:\n"
                "    print(hasattr(importlib.import_module(package), attribute))")
        answers = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
        given.update(pair for pair, answer in zip(pairs, answers) if answer == "True")
    return given


def _attribute_uses(path: Path) -> set[tuple[str, str, str, int]]:
    """(package, attribute, file, line) for each submodule the file reaches through an attribute, `package.attribute`,
    without importing it."""
    module = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    imported, bound = _imports(tree, module)
    uses = set()
    for node in ast.walk(tree):
        chain = _attribute_chain(node) if isinstance(node, ast.Attribute) else None
        if not chain or chain[0] not in bound:
            continue
        name = bound[chain[0]]
        for attribute in chain[1:]:
            parent, name = name, f"{name}.{attribute}"
            if name in imported or not _is_submodule(name):
                break
            uses.add((parent, attribute, str(path.relative_to(REPO)), node.lineno))
    return uses


def unimported_submodules(paths: list[Path]) -> list[str]:
    """`file:line: package.sub` for each submodule the files use that neither they nor a plain `import package` load."""
    uses = {use for path in paths for use in _attribute_uses(path)}
    given = _given_by_plain_imports({(package, attribute) for package, attribute, _, _ in uses})
    return sorted(f"{file}:{line}: {package}.{attribute} (import it)"
                  for package, attribute, file, line in uses if (package, attribute) not in given)


def test_the_library_and_the_stages_import_every_submodule_they_use():
    found = unimported_submodules(SOURCES)
    assert not found, "used after only importing its parent package:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("import pyarrow\npyarrow.parquet.read_table('t')\n", ["pyarrow.parquet"]),  # AttributeError in a fresh run
    ("import matplotlib\ndef f():\n    matplotlib.pyplot.figure()\n", ["matplotlib.pyplot"]),  # in a function too
    ("import pyarrow.parquet\npyarrow.parquet.read_table('t')\n", []),
    ("import pyarrow.parquet as pq\npq.read_table('t')\n", []),
    ("from pyarrow import parquet\nparquet.read_table('t')\n", []),
    ("import scipy\nscipy.stats.norm.cdf(0)\n", []),  # scipy loads its submodules lazily: this works for users
    ("import os\nos.path.join('a')\n", []),  # os imports os.path itself
])
def test_a_submodule_used_after_only_its_parent_s_import_is_found(tmp_path, source, expected):
    stage = REPO / "stages" / "_planted_submodule_use.py"  # a stage script's place: no package module name
    stage.write_text(source)
    try:
        found = unimported_submodules([stage])
    finally:
        stage.unlink()
    assert [line.split(": ")[1].split()[0] for line in found] == expected, found
