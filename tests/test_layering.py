"""The library's layers (docs/architecture.md): a module imports only from its own layer or lower ones,
and every module has a layer, so a new one must be placed before it can land."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "layersim"

LAYERS = {
    0: {"errors", "compute"},
    1: {"similarity", "align"},
    2: {"models"},
    3: {"data"},
    4: {"params"},
    5: {"training"},
    6: {"reporting"},
    7: {"experiments", "plan"},
    8: {"cli"},
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}


def _top_level_modules() -> list[str]:
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return sorted(names)


def _imports(module: str) -> set[str]:
    path = PACKAGE / module
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    found = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            found |= {name.split(".")[1] for name in names if name.startswith("layersim.")}
    return found - {module}


def test_every_module_has_a_layer():
    assert sorted(set(_top_level_modules()) - set(LAYER_OF)) == []
    assert sorted(set(LAYER_OF) - set(_top_level_modules())) == []


@pytest.mark.parametrize("module", _top_level_modules())
def test_no_module_imports_a_higher_layer(module):
    higher = sorted(name for name in _imports(module) if LAYER_OF.get(name, 99) > LAYER_OF[module])
    assert higher == [], f"layersim.{module} (layer {LAYER_OF[module]}) imports higher layers: {higher}"


def test_the_top_level_is_a_few_packages_named_by_role():
    """At most twelve top-level modules: the pipeline's roles, not a flat list of files."""
    assert len(_top_level_modules()) <= 12, _top_level_modules()


@pytest.mark.parametrize("folder,limit", [("src/layersim", 400), ("src/layersim_launch", 400), ("stages", 80)])
def test_every_file_is_short_enough_to_read(folder, limit):
    """Library files stay at most 400 lines (split a module before it grows past that); stage scripts at most 80,
    since they only parse arguments and wire library calls."""
    root = PACKAGE.parents[1] / folder
    long = {str(f.relative_to(root)): n for f in sorted(root.rglob("*.py"))
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > limit}
    assert long == {}, f"{folder}: files over {limit} lines: {long}"
