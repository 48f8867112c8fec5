"""No params value makes DVC remove a user's file: DVC deletes a stage's outputs (and `dvc exp run` resets them)
before any command, the params gate included, can refuse a value, at the paths it makes from `${model}`,
`${item.task}` and `${item.seed}`. Every such path ends in a fixed leaf after its last `${…}`
(layersim.data.layout, docs/params-safety.md), so a value such as `../../user_data` names `user_data/splits`,
never `user_data/` itself; and the path guard (dvc.yaml's wdir through params-guard/) stops DVC for a value that
climbs out of its folder at all, before it removes anything. Checked on dvc.yaml (with a model of DVC's resolution),
with the real commands of issue 49 on untracked user files, and with those of issue 62 on files of the leaves' names
in the project's own folders, a sibling folder and a second layersim clone."""

from __future__ import annotations

import functools
import posixpath
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from dvc_project import dvc, make_project, output, run, tiny_params
from dvc_yaml import GUARD_CD, GUARD_ROOT, from_root

REPO = Path(__file__).resolve().parents[1]
INTERPOLATION = re.compile(r"\$\{[^}]*\}")


def _declared_paths(stage: dict) -> list[str]:
    """Every path DVC removes or resets for a stage: its outs, metrics and plots (each a string or a one-key dict)."""
    return [entry if isinstance(entry, str) else next(iter(entry))
            for kind in ("outs", "metrics", "plots") for entry in stage.get(kind) or ()]


def test_every_output_named_by_a_params_value_ends_in_a_fixed_leaf():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    interpolated = {(name, path) for name, stage in stages.items() for path in _declared_paths(stage)
                    if INTERPOLATION.search(path)}
    assert len(interpolated) > 30  # the matrix stages' outputs: the check below is not vacuous
    # After the last ${…} must come "/" and a whole fixed name: "${item.task}.json" or "seed${item.seed}" would
    # let a value end the path at a user's own file.
    loose = sorted((name, path) for name, path in interpolated
                   if not re.fullmatch(r"/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", INTERPOLATION.split(path)[-1]))
    assert loose == [], f"outputs whose last part holds a params value: {loose}"


# The path guard (dvc.yaml's top comment, docs/params-safety.md): each stage whose outputs hold params values runs
# in a folder of params-guard/, which its wdir reaches through those values, and where DVC must find the stage's
# vars file, MARKER: params-guard/ for matrix values and a registry model, params-guard/owner/ for a model of
# owner/name. Each marker holds the way back to the root, which the stage's command, paths and params file start with.
GUARD = "params-guard"
MARKER = "params-must-be-plain-names.yaml"  # DVC's reason when a value climbs: "'…/<MARKER>' does not exist"
MARKERS = {f"{GUARD}/{MARKER}": "..", f"{GUARD}/owner/{MARKER}": "../.."}
VALUE = re.compile(r"\$\{(?:item\.[a-z]+|model)\}")


def _composite(path: str) -> str | None:
    """The part of a declared path from its first value to its last one (`${model}/${item.task}`)."""
    found = list(VALUE.finditer(path))
    return path[found[0].start():found[-1].end()] if found else None


@functools.cache
def _stages() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _params_files(stage: dict) -> list[str]:
    return [next(iter(entry)) for entry in stage.get("params") or () if isinstance(entry, dict)]


def test_every_value_in_an_output_passes_through_the_path_guard():
    guarded, holding_model = 0, set()
    for name, stage in _stages().items():
        paths = [from_root(path) for path in _declared_paths(stage)]
        composites = {_composite(path) for path in paths} - {None}
        if not composites:
            assert "wdir" not in stage and "vars" not in stage, name
            continue
        # One run of values, the same in every output: the one wdir checks exactly what every path holds (a
        # checkpoint holds its task and seed, not the model, as its metrics do).
        assert len(composites) == 1, f"{name}: outputs hold different runs of values: {composites}"
        (composite,) = composites
        if "${model}" in composite:
            # The model first: params-guard/owner/<model>/… comes back to params-guard/ or params-guard/owner/.
            assert composite.startswith("${model}"), (name, composite)
            ups = "/".join([".."] * (composite.count("/") + 2))
            assert stage.get("wdir") == f"{GUARD}/owner/{composite}/{ups}", name
            holding_model.add(name)
        else:
            ups = "/".join([".."] * (composite.count("/") + 1))
            assert stage.get("wdir") == f"{GUARD}/{composite}/{ups}", name
        assert stage.get("vars") == [MARKER] and stage["cmd"].startswith(GUARD_CD), name
        every = [*_declared_paths(stage), *stage.get("deps", ()), *_params_files(stage)]
        assert all(path.startswith(f"{GUARD_ROOT}/") for path in every), name
        assert all(isinstance(entry, dict) for entry in stage.get("params") or ()), name  # none from the wdir
        for path in paths:
            # Two fixed folders before the values (layersim.data.layout), `${model}` right after them.
            before = path[:path.index("${")]
            assert before.count("/") >= 2 and not before.startswith((".", "/")), (name, path)
            if "${model}" in path:
                assert re.fullmatch(r"[a-z]+/[a-z]+/\$\{model\}/.*", path), (name, path)
        guarded += 1
    assert guarded >= 14 and holding_model == {"download_model", "extract"}
    markers = {str(p.relative_to(REPO)): yaml.safe_load(p.read_text())
               for p in (REPO / GUARD).rglob("*") if p.is_file()}
    assert markers == {marker: {"params_guard": {"root": root}} for marker, root in MARKERS.items()}


# A model of how DVC resolves a stage (dvc/parsing, dvc/output.py): the wdir and every path are joined to the
# project root and normalised lexically; the stage resolves only if its vars file exists from that wdir. Layersim
# projects (which hold params-guard's markers) sit beside the project, one level up, and inside it. The values are
# made of `..`, `.`, empty parts and names, and may start by climbing to the file system's root and naming the way
# back to a project's root (the absolute climb) or by naming a project's folder after a few `..`.
ROOT = "/h/u/w/project"
CLONES = (ROOT, "/h/u/w/clone2", "/h/u/clone3", f"{ROOT}/vendor/clone4")
OWNED = ("data", "metrics", "plots", "dvclive")
PARTS = ["..", "..", "..", ".", "", "sibling", "data", "tasks", "src", "layersim", "models", "user_data", GUARD,
         "owner", "synth-negation", "seed1", "x"]
WAYS_BACK = ["", *("../" * 12 + clone.lstrip("/") for clone in CLONES), "../project", "../../project",
             "../../../w/project", "../../../clone2", "../../../../u/clone3", "../../../project/vendor/clone4"]
value = st.builds(lambda way, parts, absolute: ("/" if absolute else "") + "/".join([way, *parts] if way else parts),
                  st.sampled_from(WAYS_BACK), st.lists(st.sampled_from(PARTS), max_size=12), st.booleans())


def _resolve(template: str, values: dict) -> str:
    for key, text in values.items():
        template = template.replace("${" + key + "}", text)
    return template


def _guard_root(stage: dict, wdir: str) -> str | None:
    """The way back to the root that the stage's vars file gives, as DVC finds it from `wdir`; None where DVC finds
    none and stops ("failed to parse stage …: '…/params-must-be-plain-names.yaml' does not exist")."""
    found = posixpath.normpath(posixpath.join(wdir, *stage["vars"]))
    return next((root for clone in CLONES for marker, root in MARKERS.items() if found == f"{clone}/{marker}"), None)


def _inside_a_guard(path: str) -> bool:
    """Inside a folder named params-guard/ (where a layersim project keeps nothing but its two markers), below it."""
    parts = path.split("/")
    return GUARD in parts[:-1] and path.rsplit("/", 1)[-1] != MARKER


@settings(max_examples=600, deadline=None)
@given(task=value, seed=value, method=value, model=st.one_of(st.sampled_from(["tiny-bert", "owner/name"]), value))
def test_a_value_that_passes_the_guard_names_a_path_inside_a_layersim_folder(task, seed, method, model) -> None:
    values = {"item.task": task, "item.seed": seed, "item.method": method, "model": model}
    for name, stage in _stages().items():
        if "wdir" not in stage:
            continue  # its outputs hold no params value
        wdir = posixpath.normpath(posixpath.join(ROOT, _resolve(stage["wdir"], values)))
        root = _guard_root(stage, wdir)
        if root is None:
            continue  # DVC stops before it removes anything
        for template in _declared_paths(stage):
            named = posixpath.normpath(posixpath.join(wdir, _resolve(template, {**values, "params_guard.root": root})))
            parts = named[len(ROOT) + 1:].split("/") if named.startswith(ROOT + "/") else []
            assert (len(parts) > 2 and parts[0] in OWNED) or _inside_a_guard(named), (name, template, values, named)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("outs-safety")
    env = make_project(root, lambda params: tiny_params(params))
    run(dvc("repro", "download_model"), root, env)  # so that `repro -s` of a later stage finds its deps
    return root, env


USER_FILES = ("user_data/train.csv", "models/notes.txt", "mine/thesis.tex")


def _plant(root: Path) -> None:
    for relative in USER_FILES:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f"the user's own {relative}\n")


@pytest.mark.integration
@pytest.mark.parametrize("changes, command", [
    # The README's way to set params, whole pipeline: before, it deleted user_data/ then stopped at DVC's overlap error.
    ({}, ["exp", "run", "-S", 'tasks=["../../user_data"]']),
    ({}, ["exp", "run", "-S", 'model="../.."', "-S", 'tasks=["mine"]']),
    ({}, ["exp", "run", "-S", 'seeds=["/../../../../../../mine"]']),
    ({"tasks": ["../../user_data"]}, ["repro"]),
    ({"tasks": ["../../user_data"]}, ["repro", "-s", "download_task@../../user_data"]),
    ({"tasks": ["../../models"]}, ["repro", "--single-item", "download_task@../../models"]),
    ({"model": "../..", "tasks": ["mine"]}, ["repro", "-s", "extract@mine"]),
    ({"model": "../..", "tasks": ["mine"]}, ["repro", "--downstream", "extract@mine"]),
])
def test_no_command_with_a_hostile_value_deletes_a_user_file(project, changes, command) -> None:
    root, env = project
    _plant(root)
    before = sorted(str(p.relative_to(root)) for p in (root / "user_data").rglob("*"))
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump({**params, **changes}, sort_keys=False))
    try:
        result = run(dvc(*command), root, env, check=False)
    finally:
        run(["git", "checkout", "--", "params.yaml"], root, env)
    assert result.returncode != 0, output(result)  # refused: by DVC, by the gate or by the stage
    for relative in USER_FILES:
        assert (root / relative).read_text() == f"the user's own {relative}\n", f"{relative} lost: {output(result)}"
    assert sorted(str(p.relative_to(root)) for p in (root / "user_data").rglob("*")) == before  # nothing lost or added


# Issue 62: values that climb (`..`) out of their folder to where a user keeps files of the leaves' names. The
# project sits two folders deep in the test's folder, beside a plain folder and a second layersim clone, so that
# every climb lands inside the test's own folder.
LEAVES = ("splits", "model", "models", "pretrained", "tables", "states", "metrics.json", "values.json")
CLONE_FILES = ("data/checkpoints/tiny-bert/synth-negation/seed1/model/model.safetensors",
               "data/models/tiny-bert/pretrained/config.json",
               "data/tasks/synth-negation/splits/train.parquet",
               "metrics/finetune/synth-negation/seed1/metrics.json",
               "metrics/similarity/synth-negation/metrics.json",
               "plots/details/similarity/synth-negation/values.json")


def _leaf_files(folder: str) -> list[str]:
    """A file or folder of each leaf's name in `folder` (a folder leaf holds one file)."""
    return [f"{folder}/{leaf}" if "." in leaf else f"{folder}/{leaf}/kept.txt" for leaf in LEAVES]


# Relative to the test's folder: the project is outer/inner/project.
PLANTED_UNTRACKED = (*_leaf_files("outer/inner/project/models"), *_leaf_files("outer/inner/project/user_data"),
                     *_leaf_files("outer/inner/project/src"), *_leaf_files("outer/inner/sibling"),
                     "outer/inner/project/models/pretrained/config.json", "outer/inner/project/models/model/config.json",
                     *(f"outer/inner/clone2/{name}.untracked" for name in CLONE_FILES))
CLONE_TRACKED = tuple(f"outer/inner/clone2/{name}" for name in CLONE_FILES)


def _snapshot(base: Path) -> dict[str, bytes]:
    """Every file the climbs aim at: the planted ones, the project's own models/, src/ and user_data/ (tracked:
    src/layersim/models is one), the sibling folder and the second clone."""
    folders = ("outer/inner/project/models", "outer/inner/project/src", "outer/inner/project/user_data",
               "outer/inner/sibling", "outer/inner/clone2")
    return {str(path.relative_to(base)): path.read_bytes() for folder in folders
            for path in sorted((base / folder).rglob("*")) if path.is_file() and ".git" not in path.parts}


def _plant_leaves(base: Path) -> None:
    for relative in (*PLANTED_UNTRACKED, *CLONE_TRACKED):
        (base / relative).parent.mkdir(parents=True, exist_ok=True)
        (base / relative).write_text(f"the user's own {relative}\n")


@pytest.fixture(scope="module")
def climbing(tmp_path_factory) -> tuple[Path, Path, dict]:
    base = tmp_path_factory.mktemp("climb")
    root = base / "outer" / "inner" / "project"
    root.mkdir(parents=True)
    env = make_project(root, lambda params: tiny_params(params, seeds=[1]))
    run(dvc("repro", "download_model", "download_task"), root, env)  # `repro -s` of later stages finds its deps
    run(["git", "commit", "-qam", "downloads"], root, env)  # what each case's cleanup puts back
    _plant_leaves(base)
    clone = base / "outer" / "inner" / "clone2"
    run(["git", "init", "-q", "-b", "main"], clone, env)
    run(["git", "add", *(str(Path(name).relative_to("outer/inner/clone2")) for name in CLONE_TRACKED)], clone, env)
    run(["git", "commit", "-qm", "a second clone's outputs"], clone, env)
    return base, root, env


UP_TO_SIBLING = "../../../sibling"   # from data/<x>/ or metrics/<stage>/ to the project's sibling folder
CLONE = "../../../clone2"            # the same, to the second clone
JUMP = "../" * 24 + "{root}"         # to the file system's root and down again to the project, by its absolute path
CLIMBS = [
    # dvc exp run -S, the README's way to set params: the experiment's checkout resets outputs before any command.
    ({}, ["exp", "run", "-S", 'tasks=["../../.."]']),                        # finetune_pretrained: models/
    ({}, ["exp", "run", "-S", 'tasks=["../../../src/layersim"]']),           # src/layersim/models (tracked)
    ({}, ["exp", "run", "-S", "model='../../models'"]),                      # download_model: models/pretrained
    ({}, ["exp", "run", "-S", "model='../..'", "-S", 'tasks=["models"]']),   # export: models/model
    ({}, ["exp", "run", "-S", 'tasks=["../../user_data"]']),                 # download_task: user_data/splits
    ({}, ["exp", "run", "-S", f'tasks=["{UP_TO_SIBLING}"]']),                # metrics/<stage>/…: sibling/metrics.json
    # Plain dvc repro: the gate runs first.
    ({"tasks": ["../../.."]}, ["repro"]),
    ({"model": "../../models"}, ["repro"]),
    # dvc repro -s / --single-item: no gate; DVC removes the stage's outputs before its command.
    ({"tasks": ["../../user_data"]}, ["repro", "-s", "download_task@../../user_data"]),
    ({"tasks": ["../../../src/layersim"]}, ["repro", "-s", "finetune_pretrained@../../../src/layersim"]),
    ({"tasks": [f"{CLONE}/data/tasks/synth-negation"]},
     ["repro", "--single-item", f"download_task@{CLONE}/data/tasks/synth-negation"]),
    ({"tasks": [UP_TO_SIBLING]}, ["repro", "-s", f"similarity@{UP_TO_SIBLING}"]),               # sibling/metrics.json
    ({"tasks": [f"../{UP_TO_SIBLING}"]}, ["repro", "--single-item", f"similarity@../{UP_TO_SIBLING}"]),  # values.json
    ({"seeds": [f"1/../../../../../../clone2/data/checkpoints/tiny-bert/synth-negation/seed1"]},
     ["repro", "-s", "finetune"]),                                                              # the clone's model
    ({"finetune": {"compare_methods": ["../../../../../clone2/data/checkpoints/tiny-bert/synth-negation"]}},
     ["repro", "--single-item", "finetune_compared"]),                                          # the clone's model
    # `repro -s` resolves only its stage: a stage whose outputs all hold `model` passes it through the guard itself.
    ({"model": "../../models"}, ["repro", "-s", "download_model"]),                                # models/pretrained
    ({"model": UP_TO_SIBLING}, ["repro", "--single-item", "download_model"]),                     # sibling/pretrained
    ({"model": "../..", "tasks": ["models"]}, ["repro", "-s", "extract@models"]),                 # models/tables
    # A stage whose outputs once held the model beside other values (the checkpoint, not the metrics; open before):
    # now none of them holds it, so nothing DVC may remove names the model; it stops at the input the model names
    # (were that there, the stage would refuse the model).
    ({"model": f"{CLONE}/data/checkpoints/tiny-bert"}, ["repro", "-s", "finetune"]),     # the clone's checkpoints
    ({"model": "../..", "tasks": ["models"]}, ["repro", "-s", "export@models"]),            # models/model
    ({"model": f"{CLONE}/data/checkpoints/tiny-bert", "finetune": {"compare_methods": ["lora"]}},
     ["repro", "--single-item", "finetune_compared"]),
    # A value that names its target's absolute path climbs to the file system's root and down again: the guard
    # lands such a wdir in a folder of params-guard/ only if the value ends there, and then so does every output.
    ({"tasks": [JUMP + "/src/layersim"]}, ["repro", "-s", f"finetune_pretrained@{JUMP}/src/layersim"]),  # tracked
    ({"tasks": [JUMP + "/user_data"]}, ["repro", "--single-item", f"download_task@{JUMP}/user_data"]),
    ({"tasks": [JUMP + "/params-guard/x"]}, ["repro", "-s", f"download_task@{JUMP}/params-guard/x"]),
    ({}, ["exp", "run", "-S", f'tasks=["{JUMP}/src/layersim"]']),
    ({"model": JUMP + "/models"}, ["repro", "-s", "download_model"]),                               # models/pretrained
]


def _at(data, root: Path):
    """`data` with {root} in its strings replaced by the project's absolute path, without its leading /."""
    if isinstance(data, dict):
        return {key: _at(value, root) for key, value in data.items()}
    if isinstance(data, list):
        return [_at(value, root) for value in data]
    return data.replace("{root}", str(root).lstrip("/")) if isinstance(data, str) else data


def _merged(params: dict, changes: dict) -> dict:
    return {**params, **{key: ({**params[key], **value} if isinstance(value, dict) else value)
                         for key, value in changes.items()}}


@pytest.mark.integration
@pytest.mark.parametrize("changes, command", [
    pytest.param(*values, marks=getattr(case, "marks", ()), id=" ".join([*values[1], *map(str, values[0].values())]))
    for case in CLIMBS for values in [getattr(case, "values", case)]])
def test_no_value_that_climbs_removes_a_file_outside_layersim_folders(climbing, changes, command) -> None:
    base, root, env = climbing
    changes, command = _at(changes, root), _at(command, root)
    before = _snapshot(base)
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(_merged(params, changes), sort_keys=False))
    try:
        result = run(dvc(*command), root, env, check=False)
    finally:  # put back what a failing case removed, for the next case
        after = _snapshot(base)
        run(["git", "checkout", "--", "."], root, env)
        run(["git", "checkout", "--", "."], base / "outer" / "inner" / "clone2", env)
        _plant_leaves(base)
    lost = sorted(set(before) - set(after))
    changed = sorted(name for name in set(before) & set(after) if before[name] != after[name])
    assert (lost, changed) == ([], []), f"{len(lost)} files removed: {lost[:8]}\n{output(result)}"
    assert result.returncode != 0, output(result)
    assert REFUSED.search(result.stderr), output(result)


# What refuses a climbing value, in one line: DVC when the path guard finds no marker (the stage's name carries a
# matrix value; download_model's wdir holds the model), DVC when an input the value names is not there, or the
# stage's own validation, naming the value.
REFUSED = re.compile(r"^ERROR: failed to parse stage '[^']+' in 'dvc\.yaml': "
                     r"'[^']*params-must-be-plain-names\.yaml' does not exist$"
                     r"|^ERROR: failed to reproduce '[^']+': \[Errno 2\] No such file or directory: '[^']+'$"
                     r"|^error: params\.yaml: (tasks|model|seeds) has '[^']+', .+\.$", re.M)
