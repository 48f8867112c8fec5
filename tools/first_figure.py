"""The first figures of a run, while `dvc exp run` is still running (issue 64): as each seed's fine-tuning run of the
first task finishes, its FT–ORIG heatmap (Phang et al. Fig. 1: linear CKA between every layer of the fine-tuned model
and every layer of the pretrained one, on the head vector of each validation example, as the similarity stage draws it
from extract's tables), on report/first/index.html.

quickstart.sh starts it in the background before `dvc exp run` and stops it when the run ends. The first heatmap comes
a minute or two after the start, where the similarity stage's comes after every seed has trained and extract has run
(most of the run). The page reloads itself; when the run ends, quickstart.sh turns it into a link to the full report
(report/index.html). The numbers are those of the similarity stage's FT[i]–ORIG heatmap up to the tables' float16
rounding (the same examples, tokenization and pooling); the null is the stage's permutations, the intervals are the
full report's.

A seed counts as finished when its run writes its training time (timings/finetune/<task>/seed<k>.json, which the
finetune stage writes after its checkpoint, on every run and only then) after this script started: a checkpoint that
DVC restored from its cache, or one left by an earlier run with other params, is not drawn. The work runs on one torch
thread, beside the fine-tuning of the next seed (which leaves part of a 2-core machine idle).

Usage: python tools/first_figure.py [-S key=value ...] [-- <dvc exp run arguments>]   (the plan's arguments)
       python tools/first_figure.py --done      (the page becomes a link to report/index.html)
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import time
from pathlib import Path

PAGE = Path("report/first/index.html")
POLL_SECONDS = 2.0
FULL_REPORT = "../index.html"


def page(figures: list[tuple[str, str]], waiting: str | None) -> str:
    """The page: the heatmaps drawn so far (file, caption), and what it waits for next (None: the run is over)."""
    if waiting is None:
        head = f'<meta http-equiv="refresh" content="0; url={FULL_REPORT}">'
        status = f'The run is over: the full report is <a href="{FULL_REPORT}">report/index.html</a>.'
    else:
        head = '<meta http-equiv="refresh" content="15">'
        status = (f"The run goes on; this page reloads every 15 s. Next: {html.escape(waiting)}. The full report "
                  f"(every stage, nulls and intervals over seeds) is written at the end: "
                  f'<a href="{FULL_REPORT}">report/index.html</a>.')
    items = "".join(f'<figure><img src="{html.escape(name)}" alt="{html.escape(caption)}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>" for name, caption in figures)
    return (f'<!doctype html><html><head><meta charset="utf-8">{head}<title>layersim: first figures</title>'
            "<style>body{font-family:sans-serif;max-width:1300px;margin:1em auto}figure{display:inline-block;"
            "margin:0 1em 1em 0}img{max-width:420px}</style></head><body><h1>First figures</h1>"
            f"<p>{status}</p>{items}</body></html>\n")


def write_page(text: str) -> None:
    from layersim.data.io import atomic_path

    PAGE.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(PAGE) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def finished(timing: Path, since: float) -> bool:
    """Whether the run that `timing` records ended after `since` (this script's start)."""
    try:
        return timing.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def draw(params, task: str, seed: int, position: int, out: Path) -> str:
    """FT[position]–ORIG's heatmap for `seed` into `out`; returns its caption."""
    import pyarrow.parquet as pq
    import torch

    from layersim import compare_models
    from layersim.data.layout import FinetunedRun, task_tables
    from layersim.data.tasks import get_task
    from layersim.params.model_kind import own_head_pooling
    from layersim.data.io import write_figure

    torch.set_num_threads(1)  # beside the next seed's fine-tuning, on the core it leaves idle
    run = FinetunedRun(params.finetune.method, seed)
    table = pq.read_table(task_tables("data/tasks", task) / "validation.parquet")
    rows = table.num_rows if params.extract.max_examples is None else min(table.num_rows, params.extract.max_examples)
    columns = table.slice(0, rows).to_pydict()
    texts = columns["text"] if get_task(task).format == "single" else list(zip(columns["text_a"], columns["text_b"]))
    pooling = own_head_pooling(params.model)
    label = run.label(position)
    result = compare_models(run.folder(f"data/checkpoints/{task}"),
                            f"data/models/{params.model}/pretrained", texts, ["linear_cka"], pooling,
                            permutations=params.similarity.permutations, bootstrap=0, labels=(label, "ORIG"),
                            device="cpu", max_length=params.finetune.max_length)
    write_figure(result.plot("linear_cka"), out)
    return f"{label}–ORIG, linear CKA of the {pooling.upper()} vectors of {rows} validation examples of {task}"


def main(argv: list[str]) -> int:
    if argv == ["--done"]:
        if PAGE.exists():
            write_page(page([], None))
        return 0
    since = time.time()
    os.environ["TQDM_DISABLE"] = "1"  # no progress bars among dvc exp run's output
    from layersim.data.tasks import get_task
    from layersim.params import parse_params
    from layersim.params.overrides import overridden
    from layersim.plan.__main__ import exp_run_overrides

    own, exp_run = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    params = parse_params(overridden(Path("params.yaml"), exp_run_overrides(own) + exp_run_overrides(exp_run)))
    task, figures = params.tasks[0], []
    if get_task(task).format not in ("single", "pair"):  # a choice task's rows are (example, choice): no page
        print(f"first figures: none for {task} (a multiple-choice task); the full report comes at the end")
        return 0
    for position, seed in enumerate(params.seeds, start=1):
        waiting = f"seed {seed} of {task} (fine-tuning)"
        write_page(page(figures, waiting))
        timing = Path("timings/finetune") / task / f"seed{seed}.json"
        while not finished(timing, since):
            time.sleep(POLL_SECONDS)
        name = f"ft{position}-orig.png"
        try:
            figures.append((name, draw(params, task, seed, position, PAGE.parent / name)))
        except Exception as err:  # a side page: the run goes on, and its similarity stage draws the same heatmap
            print(f"first figures: {task} seed {seed} not drawn ({type(err).__name__}: {err}); the full report "
                  "comes at the end", file=sys.stderr, flush=True)
            return 1
        print(f"first figures: {PAGE} ({figures[-1][1]})", flush=True)
    write_page(page(figures, "the other stages; the full report at the end"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
