#!/usr/bin/env bash
# The smallest run: every stage of the pipeline on a tiny random-init BERT (no download) and one built-in task,
# two seeds and a handful of steps. It checks that a setup works end to end; its numbers mean nothing
# (a random-init model at 6 steps does not converge: the stages warn and flag it, as they should).
set -euo pipefail
cd "$(dirname "$0")"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

params=(
  -S model=tiny-bert
  -S 'tasks=[synth-similarity]'
  -S 'seeds=[1,2]'
  -S download.generated_train_examples=200
  -S download.generated_validation_examples=60
  -S finetune.batch_size=8 -S finetune.learning_rate=1e-3 -S finetune.warmup_steps=2
  -S finetune.max_steps=6 -S finetune.eval_every=3 -S finetune.max_length=32
  -S extract.max_train_examples=100 -S extract.max_tokens=300 -S extract.attention_examples=20
  -S similarity.permutations=20 -S similarity.bootstrap=20
  -S compare.probe_examples=20
  -S truncate.head_epochs=2
  -S align.steps=20 -S align.matrix_steps=5 -S align.synthetic_steps=20 -S align.synthetic_rows=200
  -S align.inn_hidden=16 -S align.mlp_hidden=16 -S align.batch_size=32
  -S 'freeze.seeds=[1]' -S 'freeze.layers=[6]'
  -S export.selection_examples=100 -S export.timing_examples=8 -S export.timing_repeats=1
)

# What these params will cost, per stage, before anything runs (docs/paper-configuration.md); the -S among this
# script's own arguments apply to the plan too.
python -m layersim.plan --warm-starts "${params[@]}" -- "$@"
echo

# No output edited in place through its link into DVC's cache (docs/experiments.md, "Sharing results").
python -m layersim_launch.dvc_cache
# `dvc exp run`, less DVC's warning for each output no run has made yet (a fresh clone's first run), its stages forked
# from an interpreter that imported torch & co. once (tools/exp_run.py).
python tools/exp_run.py "${params[@]}" "$@"
