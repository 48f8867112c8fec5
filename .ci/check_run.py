"""After a user's run in CI (`bash smallest.sh`: `dvc exp run`, each stage a fresh interpreter with its own hash seed and
default threads): every stage and matrix item of the pipeline ran (dvc.lock holds each one `dvc stage list` names),
every declared output exists, `dvc status` is clean, and the report page names the task.

    python .ci/check_run.py synth-similarity
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from layersim_launch.dvc_cache import from_root  # dvc.lock paths are relative to each stage's wdir


def dvc(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "dvc", *args], capture_output=True, text=True, check=True).stdout


def main(task: str) -> int:
    stages = set(dvc("stage", "list", "--name-only").split())
    lock = yaml.safe_load(Path("dvc.lock").read_text())["stages"]
    problems = [f"stage {name} never ran (no dvc.lock entry)" for name in sorted(stages - set(lock))]
    for name, entry in lock.items():
        problems += [f"{name}: output {from_root(out['path'])} is missing" for out in entry.get("outs", [])
                     if not Path(from_root(out["path"])).exists()]
    status = json.loads(dvc("status", "--json") or "{}")
    if status:
        problems.append(f"dvc status is not clean: {sorted(status)[:5]}")
    page = Path("report/index.html")
    if not page.is_file() or task not in page.read_text(encoding="utf-8"):
        problems.append(f"report/index.html does not name the task {task!r}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    print(f"{len(stages)} stages and matrix items ran, every output there, dvc status clean" if not problems else
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
