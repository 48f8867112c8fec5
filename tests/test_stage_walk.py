"""A stage's data walks down the library's layers (docs/architecture.md): the orchestration module of a stage
(layersim.experiments.<stage>) reads, computes through layersim.similarity, hands plain results to
layersim.reporting, and returns; nothing calls back up. Checked on the source by AST, with no import."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "layersim"

# Experiment modules that others may import, and why: each is a stage's work that another stage reuses
# as is, not orchestration of its own.
SHARED_EXPERIMENTS = {
    "extract": "encodes a task with a model and pools its layers (Pooled, pooled_layers, extract_attention): "
               "compare encodes its probe, and align its tables, the same way the extract stage does",
    "truncation": "scores a model cut at a layer (primary_score, span_logits, full_score): export, injection "
                  "and align score the same way",
    "injection": "scores a representation injected into a model's upper layers: align scores its maps so",
    "compare_inputs": "checks compare_models' arguments and batches (one sentence each, before any model runs), "
                      "apart from the comparison itself so that either reads in one screen",
    "similarity_inputs": "reads the runs' activation tables of a pooling and builds their stacked layers, matrices "
                         "and nulls (layer_sources): the similarity stage and the grounding stage, which recomputes "
                         "every run's matrices, read them the same way",
    "pruning_states": "sums the layer-pruning measures' rows during extraction (PruningStates) and reads them back "
                      "(read_pruning_record): extract writes the record that similarity and skip read",
}

# What only layersim.similarity computes: reporting modules summarise results and never call these.
COMPUTING = {"stacked_matrix", "stacked_null", "diagonal_intervals", "permutation_matrix", "bootstrap_pairs",
             "localization", "seed_spread", "seed_pair_spreads", "over_seed_pairs", "rotated_update_counts",
             "phang_result", "stacked_result", "find_blocks", "stability",
             "layer_blocks", "adjusted_p_values", "at_chance", "moments_stacked_matrix", "moments_stacked_null"}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every import in `module`'s file, those inside functions and under
    TYPE_CHECKING included (each still ties the files together)."""
    found = []
    for node in ast.walk(ast.parse(FILES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _edges(module: str) -> set[str]:
    """The files of layersim that `module` names in an import: `from X import n` names X (a package: its
    __init__) and X.n when that is a submodule; `import X.Y` names X.Y only (its parents run first in any
    import of X.Y, and a package's __init__ may import its submodules)."""
    edges = set()
    for name, names in _imports(module):
        edges |= {name} | {f"{name}.{n}" for n in names}
    return {edge for edge in edges & set(FILES) if edge != module}


def test_reporting_imports_no_experiment_and_computes_nothing():
    for module in (m for m in FILES if m.startswith("layersim.reporting")):
        for name, names in _imports(module):
            assert not name.startswith("layersim.experiments"), f"{module} imports {name}"
            if name.startswith("layersim.similarity"):
                assert not COMPUTING & set(names), f"{module} computes: {sorted(COMPUTING & set(names))} from {name}"


def test_reporting_of_similarity_takes_no_callbacks():
    """Results in, figures, rows and metrics out: no parameter of layersim.reporting.similarity is a callable."""
    tree = ast.parse(FILES["layersim.reporting.similarity"].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs:
                assert "Callable" not in ast.unparse(arg.annotation or ast.Constant(None)), (node.name, arg.arg)


def test_experiments_import_only_shared_experiments():
    assert {f"layersim.experiments.{name}" for name in SHARED_EXPERIMENTS} <= set(FILES)
    for module in (m for m in FILES if m.startswith("layersim.experiments.")):
        others = {edge.split(".")[2] for edge in _edges(module) if edge.startswith("layersim.experiments.")}
        assert others <= set(SHARED_EXPERIMENTS), f"{module} imports experiments {sorted(others - set(SHARED_EXPERIMENTS))}"


def test_compare_and_similarity_orchestrate_apart():
    assert "layersim.experiments.similarity" not in _edges("layersim.experiments.compare")
    assert "layersim.experiments.compare" not in _edges("layersim.experiments.similarity")


def test_no_import_cycle_between_files():
    """No file reaches itself through imports, a package's __init__ and the submodules it imports included:
    import from the defining submodule, not from the package."""
    graph = {module: _edges(module) for module in FILES}
    done, path = set(), []

    def visit(module):  # depth-first; a module met again on the current path closes a cycle
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for edge in sorted(graph[module]):
            visit(edge)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
