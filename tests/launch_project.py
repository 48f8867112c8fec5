"""A DVC project of this pipeline's shape whose "fine-tunes" wait instead of computing, for `layersim launch`
tests and benchmarks/scaleout.py: one download, a matrix of train items that each sleep (so more workers than
cores still run in parallel) and record the CUDA_VISIBLE_DEVICES they saw, one extract per item and a
compare over all of them. Marker files make a node fail, or kill the Ray worker running it, once."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from dvc_project import REPO, dvc, project_env, run

WORK = '''"""Stage commands of the launch test project."""
import json, os, sys, time
from pathlib import Path

step, item = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
Path("logs").mkdir(exist_ok=True)
seconds = float(Path("sleep.txt").read_text())
if step == "download":
    Path("data").mkdir(exist_ok=True)
    Path("data/corpus.txt").write_text("corpus\\n")
elif step == "train":
    if Path(f"fail-{item}").exists():
        sys.exit(f"train {item}: told to fail")
    if Path(f"kill-{item}").exists() and not Path(f"killed-{item}").exists():
        import psutil  # the Ray worker running this node: the ancestor whose command line names Ray's worker
        Path(f"killed-{item}").write_text("")
        for parent in psutil.Process().parents():
            if "default_worker" in " ".join(parent.cmdline()) or parent.name().startswith("ray::"):
                parent.kill()
                sys.exit(f"train {item}: killed its Ray worker")
        sys.exit(f"train {item}: no Ray worker above this process")
    start = time.time()
    time.sleep(seconds)
    Path(f"logs/train-{item}.json").write_text(json.dumps(
        {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time()}))
    Path("data/train").mkdir(parents=True, exist_ok=True)
    Path(f"data/train/{item}.txt").write_text(Path("data/corpus.txt").read_text() + f"trained {item}\\n")
elif step == "extract":
    Path("data/extract").mkdir(parents=True, exist_ok=True)
    Path(f"data/extract/{item}.txt").write_text(Path(f"data/train/{item}.txt").read_text().upper())
elif step == "compare":
    Path("data/compare.txt").write_text("".join(sorted(p.read_text() for p in Path("data/extract").glob("*.txt"))))
'''


def make_launch_project(dest: Path, items: list[str], seconds: float) -> dict:
    """The project in `dest` (a committed git repository with DVC initialised); returns its environment."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "work.py").write_text(WORK)
    (dest / "sleep.txt").write_text(f"{seconds}\n")
    shutil.copy2(REPO / "params.yaml", dest / "params.yaml")  # `layersim launch` reads its `launch` section
    (dest / ".gitignore").write_text("/data/\n/logs/\n/fail-*\n/kill-*\n/killed-*\n")
    stages = {
        "download": {"cmd": "python work.py download", "deps": ["work.py"], "outs": ["data/corpus.txt"]},
        "finetune": {"matrix": {"name": items}, "cmd": "python work.py train ${item.name}",
                     "deps": ["work.py", "sleep.txt", "data/corpus.txt"], "outs": ["data/train/${item.name}.txt"]},
        "extract": {"matrix": {"name": items}, "cmd": "python work.py extract ${item.name}",
                    "deps": ["work.py", "data/train/${item.name}.txt"], "outs": ["data/extract/${item.name}.txt"]},
        "compare": {"cmd": "python work.py compare",
                    "deps": ["work.py", *[f"data/extract/{item}.txt" for item in items]],
                    "outs": ["data/compare.txt"]},
    }
    (dest / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    env = project_env(dest)
    env["PYTHONPATH"] = str(REPO / "src")
    run(["git", "init", "-q", "-b", "main"], dest, env)
    run(dvc("init", "-q"), dest, env)
    run(dvc("config", "core.autostage", "false"), dest, env)
    run(["git", "add", "-A"], dest, env)
    run(["git", "commit", "-qm", "launch test project"], dest, env)
    return env


def parsed_lock(root: Path) -> dict:
    """dvc.lock's stages as a dict (order-free: shared mode writes them in the order nodes finish)."""
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]
