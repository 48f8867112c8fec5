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
    7: {"experiments"},
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
