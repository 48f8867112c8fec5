"""The environment a stage ran in, recorded beside its results: `environment/<stage>.json`.

Every stage writes it through :func:`layersim.cli.run_stage` when DVC runs it (``DVC_STAGE`` names the stage,
e.g. ``finetune@rte-1``): the Python and package versions, the commit of the layersim code, the platform, the
CPU model and the GPU the stage could use. Like `timings/`, the folder is no stage's output (a version or a
host name in a hashed output would make every rerun on another machine a change); dvc.yaml lists it under its
top-level `metrics`, which `dvc exp run` commits with each experiment, so `git diff` shows what changed between
two runs.

The file is a JSON list of `[name, value]` pairs, one a line: DVC's metrics reader skips lists, so the record
adds no column to `dvc exp show` or `dvc metrics show` (a JSON object would add one string column per field and
stage), and a changed version is one changed line in `git diff`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from layersim.data.io.atomic import atomic_path

FOLDER = "environment"
STAGE_ENV = "DVC_STAGE"  # set by DVC for every stage command it runs

# The distributions whose version can change a stage's numbers or files, in the order the record lists them.
PACKAGES = ("torch", "transformers", "tokenizers", "huggingface-hub", "safetensors", "datasets",
            "pyarrow", "numpy", "scipy", "scikit-learn", "matplotlib", "dvc", "dvclive")


def record_path(stage: str, root: Path | str = ".") -> Path:
    """`environment/<stage>.json` for a DVC stage name. A stage of a dvc.yaml in a subfolder is named
    `sub/dvc.yaml:name`: only the name after the colon is kept, and any character that is not a letter, digit,
    `@`, `-`, `_` or `.` becomes `_`, so the name can never leave the folder."""
    name = re.sub(r"[^A-Za-z0-9@._-]", "_", stage.rsplit(":", 1)[-1]).lstrip(".") or "stage"
    return Path(root) / FOLDER / f"{name}.json"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _code_commit() -> str | None:
    """The git commit of the layersim code that ran, `+ uncommitted changes` when its files differ from it;
    None outside a git checkout (an installed wheel: its version says it)."""
    package = Path(__file__).resolve().parents[1]
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()

        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit} + uncommitted changes" if dirty else commit


def _cpu_model() -> str:
    try:  # Linux names the model here; platform.processor() gives only the architecture there
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _gpu() -> str:
    """The first CUDA device's name and CUDA version; torch is asked only if the stage imported it (importing
    it here would cost the stages that never load a model seconds, and they use no GPU)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "not used (torch not imported)"
    try:
        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} visible)"
    except Exception as err:  # a broken driver must not fail a stage that finished: say what happened
        return f"unavailable ({type(err).__name__}: {err})"
    return "none (CUDA not available)"


def environment_record(stage: str) -> list[list[str]]:
    """The `[name, value]` pairs of the record, in a fixed order."""
    import layersim  # its own version, also where it runs from a checkout that no pip install registered

    pairs = [["stage", stage], ["python", platform.python_version()], ["layersim", layersim.__version__]]
    pairs += [[name, _version(name)] for name in PACKAGES]
    commit = _code_commit()
    if commit:
        pairs.append(["layersim commit", commit])
    pairs += [["platform", platform.platform()], ["cpu", _cpu_model()], ["cpu count", str(os.cpu_count())],
              ["gpu", _gpu()]]
    return pairs


def write_environment_record(stage: str | None = None, root: Path | str = ".") -> Path | None:
    """Write the record of the stage `DVC_STAGE` names (or `stage`) under `root`; None, writing nothing, when
    the stage was not run by DVC (a script run by hand belongs to no experiment)."""
    stage = stage or os.environ.get(STAGE_ENV)
    if not stage:
        return None
    path = record_path(stage, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(f"  {json.dumps(pair, ensure_ascii=False)}" for pair in environment_record(stage))
    with atomic_path(path) as tmp:
        tmp.write_text(f"[\n{lines}\n]\n", encoding="utf-8")
    return path
