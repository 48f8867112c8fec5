"""dvc.yaml's code deps cover every library file each stage can import, so that a fix to library code
makes `dvc status` report the stages it affects as changed (never a stale result called up to date).

The imports are read with `ast` from each stage script and followed through the library, transitively
(imports inside functions included: they run when the stage calls them); importing `layersim.a.b`
also runs the `__init__` of `layersim` and `layersim.a`.
"""

from __future__ import annotations

import ast
import functools
import shlex
from pathlib import Path

import pytest
import yaml

from dvc_yaml import command, from_root

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def module_file(module: str, src: Path = SRC) -> Path | None:
    """The file that defines `module` (a package's __init__.py), or None if it is not in `src`."""
    base = src.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _imported_modules(path: Path, package: str) -> frozenset[str]:
    """Every `package…` module that the file at `path` imports: `import a.b`, `from a.b import c` (a.b,
    and a.b.c when c is a submodule), each with its parent packages. Parsed once per file and test run: the
    stages share most of the library (parsed anew per stage, this module took 12 CPU-seconds; 6 so)."""
    found = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    # `if TYPE_CHECKING:` blocks never run (layersim/__init__.py names its lazy exports there for type checkers).
    for block in [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]:
        block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == package:
                found.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return frozenset(found)


def library_files(script: Path, src: Path = SRC, package: str = "layersim") -> set[Path]:
    """The library files that running `script` can import, transitively."""
    files: set[Path] = set()
    todo = [script]
    while todo:
        for module in _imported_modules(todo.pop(), package):
            path = module_file(module, src)
            if path is not None and path not in files:
                files.add(path)
                todo.append(path)
    return files


def uncovered(files: set[Path], deps: list[str], root: Path = REPO) -> list[str]:
    """The files (relative to `root`) that no dep names, itself or through a folder that holds it."""
    covered = [root / dep for dep in deps]
    return sorted(str(f.relative_to(root)) for f in files
                  if not any(f == dep or dep in f.parents for dep in covered))


def _stages() -> dict[str, tuple[Path, list[str]]]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    found = {}
    for name, stage in stages.items():
        argv = shlex.split(command(stage))
        assert argv[0] == "python" and argv[1].startswith("stages/"), stage["cmd"]
        found[name] = (REPO / argv[1], [from_root(dep) for dep in stage.get("deps", [])])
    return found


STAGES = _stages()


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_deps_cover_every_library_file_the_stage_imports(stage: str) -> None:
    script, deps = STAGES[stage]
    assert str(script.relative_to(REPO)) in deps, f"{stage}: its own script is not a dep"
    missing = uncovered(library_files(script), deps)
    assert not missing, f"dvc.yaml: stage {stage} imports {', '.join(missing)}, which its deps do not cover"


def test_the_checker_finds_what_a_stage_imports_and_what_deps_miss(tmp_path: Path) -> None:
    """The check itself can fail: a fake library where a stage reaches c.py only through a function-level
    import in b.py, and a package whose __init__ imports a submodule."""
    lib = tmp_path / "src" / "pkg"
    (lib / "sub").mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "a.py").write_text("from pkg import b\n")
    (lib / "b.py").write_text("def f():\n    import pkg.c\n")
    (lib / "c.py").write_text("x = 1\n")
    (lib / "sub" / "__init__.py").write_text("from pkg.sub.d import y\n")
    (lib / "sub" / "d.py").write_text("y = 2\n")
    (lib / "unused.py").write_text("")
    script = tmp_path / "stage.py"
    script.write_text("import pkg.a\nfrom pkg import sub\n")
    files = library_files(script, tmp_path / "src", "pkg")
    names = sorted(str(f.relative_to(tmp_path)) for f in files)
    assert names == ["src/pkg/__init__.py", "src/pkg/a.py", "src/pkg/b.py", "src/pkg/c.py",
                     "src/pkg/sub/__init__.py", "src/pkg/sub/d.py"]
    assert uncovered(files, ["src/pkg/sub", "src/pkg/a.py", "src/pkg/b.py"], tmp_path) == [
        "src/pkg/__init__.py", "src/pkg/c.py"]
    assert uncovered(files, ["src/pkg"], tmp_path) == []
