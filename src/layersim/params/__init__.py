"""params.yaml: one dataclass per section, every key declared once, validated before any stage does
expensive work. Reading it imports no torch.

Every stage loads the whole file through :func:`load_params` (in :func:`layersim.cli.run_stage`, before
it reads or writes anything), so a mistyped key anywhere is caught at the first stage that runs,
before any download or training. By module:

- :mod:`~layersim.params.yaml_file` — the file: UTF-8 YAML read exactly as DVC reads it (YAML 1.2: `010`
  is 10, `yes` and `1:00` are strings), so that a stage runs with the values `dvc params diff` shows;
  unreadable, nested hundreds deep, or with integers of thousands of digits: one line; no key given twice;
- :mod:`~layersim.params.schema` — each key's type, default, range, allowed names and doc (`knob`):
  no booleans or strings for numbers, positive sizes, fractions in (0, 1], tolerances in [0, 1) as
  metrics are on a 0–1 scale, seeds NumPy can take, an upper bound on every size far above any real
  run, at least MIN_EXAMPLES examples;
- :mod:`~layersim.params.rules` — how one value is checked against its declaration; values in messages
  are shortened (an alias bomb's expansion is never printed);
- :mod:`~layersim.params.names` — model, tasks and compare.models from their registries;
- :mod:`~layersim.params.validate` — the shape (known sections and keys, with a did-you-mean) and the
  rules across keys: warm-up shorter than training, evaluation within it, the poolings that
  similarity and align use extracted, attention measures only with attention maps, compare.models
  not repeating `model`, finetune.max_length within the position embeddings of every offline model,
  (:mod:`layersim.params.measure_sizes`, run by the check_params stage: measures that can run on the sizes params
  fix).

No parameter names a layer index, and none depends on a model's depth or number of heads.
Errors name the key, the bad value and what is allowed.
"""

from layersim.params.docs import describe
from layersim.params.rules import MAX_SEED
from layersim.params.vocabulary import (ALIGN_METHODS, DEFAULT_MEASURES, EXAMPLE_POOLINGS, LOCALIZATIONS,
                                        MIN_EXAMPLES, MIN_MAX_LENGTH, POOLINGS)
from layersim.params.schema import (AlignParams, CompareParams, DownloadParams, ExportParams,
                                    ExtractParams, FinetuneParams, Params, SimilarityParams, SkipParams, TruncateParams)
from layersim.params.pairs import aligned_pairs, pair_member, paired_models, pretraining_pairs
from layersim.params.validate import MODEL_HIDDEN_SIZE, MODEL_MAX_LENGTH, parse_params
from layersim.params.yaml_file import load_params, parse_yaml

__all__ = ["ALIGN_METHODS", "DEFAULT_MEASURES", "EXAMPLE_POOLINGS", "LOCALIZATIONS", "MAX_SEED", "MIN_EXAMPLES",
           "MIN_MAX_LENGTH", "MODEL_HIDDEN_SIZE", "MODEL_MAX_LENGTH", "POOLINGS", "AlignParams", "CompareParams",
           "DownloadParams", "ExportParams", "ExtractParams", "FinetuneParams", "Params", "SimilarityParams", "SkipParams",
           "TruncateParams", "aligned_pairs", "describe", "load_params", "pair_member", "paired_models", "parse_params", "parse_yaml",
           "pretraining_pairs"]
