"""Did a fine-tuning run learn the task? A run that ends where the trivial predictor starts (the majority
class, or the mean for regression) or far below its sibling seeds is no fine-tuned model: every comparison
made with it (FT–ORIG, FT[1]–FT[2], truncation, freezing) measures the failed run, not fine-tuning.

Per run (:func:`check_run`, recorded in the run's metrics file and checkpoint info):

- **training loss**: the mean of the last 10 % of the logged training losses must fall below
  ``LOSS_RATIO`` × the trivial predictor's loss on the train split — the entropy of the label
  distribution (cross-entropy of always predicting the label frequencies), or the label variance for
  regression (squared error of always predicting the mean). A run that predicts the mean sits at ratio ≈ 1.
- **validation score**: the primary metric must beat the best constant predictor's validation score (the
  highest over every constant class or answer position: accuracy the majority rate, F1 always predicting the
  positive class — QQP's 0.538, not the majority's 0 —, MCC and the correlations 0, undefined for a constant)
  by a one-sided test at level ``SCORE_ALPHA``. The baseline is scored on the same validation examples as the
  run, so the pipeline's test is paired (:func:`paired_p_value`, given the run's predictions): accuracy by
  McNemar's exact test, a binomial on the discordant examples (those the run gets right and the constant wrong,
  against the reverse); F1 by a paired randomization test of F1(run) − F1(constant) (each example's two
  predictions swapped at random, Yeh 2000) together with Fisher's exact test of the run's skill, p the larger of
  the two (a paired bootstrap of the difference passed a run without skill in 8 % of samples, on a handful of
  disagreements; the randomization test alone in 8 % too, where the constant is right on fewer than half of
  them);
  MCC, Pearson and Spearman by z = score·√(n − 1), since the constant's value is 0 on every sample, so that
  pairing changes nothing, and a predictor independent of the labels has mean 0 and variance exactly 1/(n − 1)
  under permutation. Why paired: treating the sample's majority rate b̂ as a known population rate charges the
  run for b̂'s own sampling noise, which the constant shares with it example for example. A run at 0.97 over a
  96 % majority (right on a quarter of the minority, never wrong on the majority) passed the unpaired binomial
  in 42 % of 1,000-example validation sets and passes McNemar in ≥ 90 %; a run without skill still passes in
  ≤ α (tests/test_convergence.py, fidelity review 2026-11-28 §2). Why a test, not a fixed margin: an additive
  margin (formerly 0.05) cannot be met at a 96 % majority and is trivially met by a correlation; the test's
  margin shrinks where the metric is precise. A caller with the score and n but no predictions gets the
  unpaired test (:func:`score_p_value`): accuracy the exact binomial tail P(Bin(n, b) ≥ score·n); F1 a normal
  tail with the best constant's own sampling sd 2/(1 + π)²·√(π(1 − π)/n), π = b/(2 − b); the correlations as
  above. Without n either, the score must merely exceed the baseline.

Across seeds (:func:`run_flags`, where the runs meet: the report, the summary, the freeze stage), a seed is
flagged when its score is more than ``max(SEED_GAP, SEED_SPREADS × s)`` below the median of the *other*
seeds, s their robust sd (1.4826 × MAD). Seed-to-seed sds of fine-tuned BERT-size models on GLUE are a few
points (Dodge et al. 2020; Mosbach et al. 2021, whose failed runs sit at the majority class), so 0.1 is far
outside seed noise; the spread term widens the gap where the other seeds themselves disagree; leaving the
run out of its own median and spread keeps one failed run from hiding itself (3 seeds 0.80, 0.79, 0.35:
0.35 is 0.445 below the others' median 0.795).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from layersim.errors import LayersimError
from layersim.models.registry import model_info
from layersim.data.layout import as_runs, run_labels

LOSS_SHARE = 0.1       # the tail of logged training losses averaged into the final loss
LOSS_RATIO = 0.9       # final loss at or above this share of the trivial loss: nothing learned
SCORE_ALPHA = 0.05     # the one-sided level at which the validation score must beat the best constant's
SEED_GAP = 0.1         # a seed this far (or SEED_SPREADS robust sds) below the others' median is flagged
SEED_SPREADS = 3.0
PAIRED_DRAWS = 9_999  # swapped samples of the paired F1 test (p resolution 1e-4)
NOT_CONVERGED = "not converged"


@dataclass(frozen=True)
class Convergence:
    """One run's check: ``converged`` and why not (``reason``, empty when converged), with its numbers."""

    converged: bool
    metric: str
    score: float
    baseline: float
    final_train_loss: float | None
    trivial_loss: float | None
    reason: str = ""
    n: int | None = None            # validation examples the score test used
    p_value: float | None = None    # of the score against the best constant's (None without n)
    test: str | None = None         # which test gave p_value (TESTS)

    def record(self) -> dict:
        """What the run's metrics file and checkpoint info keep (numbers rounded to 6 places)."""
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()
                if not (k == "reason" and not v) and not (k in ("n", "p_value", "test") and v is None)}


@dataclass(frozen=True)
class Predictions:
    """What the paired score test compares, example for example: the validation `labels`, the run's
    `predictions` of them (a class, an answer position or a regression value each) and the best constant's
    prediction `constant` (layersim.training.train.best_constant)."""

    labels: np.ndarray
    predictions: np.ndarray
    constant: float

    def __post_init__(self):
        if len(self.labels) != len(self.predictions):
            raise LayersimError(f"the paired score test needs one prediction per validation label; got "
                                f"{len(self.predictions)} predictions for {len(self.labels)} labels.")


def trivial_loss(train_labels: np.ndarray, regression: bool, choices: int | None = None) -> float:
    """The training loss of the best constant predictor: the label variance (squared error of the mean) for
    regression, else the entropy in nats of the label frequencies (cross-entropy of predicting them). For
    multiple choice (`choices` answers, each scored by the same network, which never sees its position) a
    content-blind scorer ties every answer: ln(choices)."""
    labels = np.asarray(train_labels)
    if labels.size == 0:
        raise LayersimError("the convergence check needs training labels; the train split is empty.")
    if regression:
        return float(np.var(labels.astype(np.float64)))
    if choices:
        return math.log(choices)
    counts = np.unique(labels, return_counts=True)[1] / labels.size
    return float(-(counts * np.log(counts)).sum())


def final_loss(losses: Sequence[float], share: float = LOSS_SHARE) -> float | None:
    """Mean of the last `share` of the logged training losses (at least one); None if none were logged."""
    if not losses:
        return None
    tail = max(1, math.ceil(share * len(losses)))
    return float(np.mean(losses[-tail:]))


TESTS = {"accuracy": "McNemar exact", "f1": "paired randomization and Fisher exact", "mcc": "permutation",
         "pearson": "permutation", "spearman": "permutation"}  # the paired test of each metric (module docstring)


def paired_p_value(metric: str, score: float, sample: Predictions, draws: int = PAIRED_DRAWS,
                   seed: int = 0) -> float:
    """One-sided p-value of the run's validation `score` (its `metric` on `sample`) against the best constant's
    on the same examples, by the paired test of `metric` (``TESTS``, module docstring): small when the run is
    above the constant by more than the examples' sampling noise explains."""
    from scipy import stats

    labels, predictions = np.asarray(sample.labels), np.asarray(sample.predictions)
    n = len(labels)
    if n < 2:
        return 1.0
    if metric == "accuracy":
        run_right, constant_right = predictions == labels, labels == sample.constant
        wins = int(np.count_nonzero(run_right & ~constant_right))
        discordant = wins + int(np.count_nonzero(~run_right & constant_right))
        return float(stats.binom.sf(wins - 1, discordant, 0.5)) if discordant else 1.0
    if metric == "f1":  # an intersection-union test: both must reject, so p is the larger
        return max(_paired_f1_randomization(labels, predictions, sample.constant, draws, seed),
                   _skill_p_value(labels, predictions))
    return score_p_value(metric, score, 0.0, n)  # a correlation: the constant's is 0 on every sample


def _paired_f1_randomization(labels: np.ndarray, predictions: np.ndarray, constant: float, draws: int,
                             seed: int) -> float:
    """Approximate randomization (Noreen 1989; Yeh 2000, the paired test for F-score differences): under the null
    that the run's and the constant's predictions are exchangeable example by example, each example's two
    predictions are swapped with probability ½; p is the share of `draws` swapped samples whose
    F1(run) − F1(constant) is at least the observed, (1 + #)/(1 + draws). Swapping matters only where the two
    disagree, and both F1s depend only on how many of those disagreements, by label, the run's side predicts
    positive: two binomial draws per sample. It assumes each disagreement is as likely to favour either side;
    where they are not (always positive at 37 % positives against a run saying negative on 1 % of random
    examples, which wins 63 % of them yet loses F1) it passed that run without skill in 8 % of samples, hence
    :func:`_skill_p_value` beside it."""
    positive_label, positive_run = labels == 1, predictions == 1
    positive_constant = constant == 1
    agree = positive_run == positive_constant
    # counts where both predict alike, and the disagreements by label
    true_pos = np.count_nonzero(agree & positive_label & positive_run)
    false_pos = np.count_nonzero(agree & ~positive_label & positive_run)
    false_neg = np.count_nonzero(agree & positive_label & ~positive_run)
    split_pos, split_neg = np.count_nonzero(~agree & positive_label), np.count_nonzero(~agree & ~positive_label)

    def difference(run_pos_of_pos, run_pos_of_neg):
        """F1(run) − F1(constant) when the run's side predicts positive on these many disagreements per label."""
        run = _f1(true_pos + run_pos_of_pos, false_pos + run_pos_of_neg, false_neg + split_pos - run_pos_of_pos)
        other = _f1(true_pos + split_pos - run_pos_of_pos, false_pos + split_neg - run_pos_of_neg,
                    false_neg + run_pos_of_pos)
        return run - other

    observed = difference(0, 0) if positive_constant else difference(split_pos, split_neg)
    rng = np.random.default_rng(seed)
    swapped = difference(rng.binomial(split_pos, 0.5, draws), rng.binomial(split_neg, 0.5, draws))
    return float((1 + np.count_nonzero(swapped >= observed - 1e-12)) / (1 + draws))


def _skill_p_value(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Fisher's one-sided exact test of a binary run's skill: the share of relabellings (the run's predictions
    permuted over the examples) with at least its true positives, a hypergeometric tail. With the numbers of
    positive labels and predictions fixed, F1 rises with the true positives, so this is F1's exact permutation null
    for a run whose predictions are independent of the labels."""
    from scipy import stats

    positive_label, positive_run = labels == 1, predictions == 1
    true_pos = int(np.count_nonzero(positive_label & positive_run))
    return float(stats.hypergeom.sf(true_pos - 1, len(labels), int(np.count_nonzero(positive_label)),
                                    int(np.count_nonzero(positive_run))))


def _f1(true_pos, false_pos, false_neg):
    """F1 from counts (arrays or numbers); 0 where nothing is predicted or labelled positive, as METRICS gives."""
    denominator = np.asarray(2 * true_pos + false_pos + false_neg, dtype=np.float64)
    return np.divide(2 * np.asarray(true_pos, dtype=np.float64), denominator, out=np.zeros_like(denominator),
                     where=denominator > 0)


def score_p_value(metric: str, score: float, baseline: float, n: int) -> float:
    """One-sided p-value of a validation `score` on `n` examples against the best constant's `baseline`, for a
    caller without the run's predictions (unpaired: accuracy and F1 treat `baseline` as a known rate; module
    docstring): small when the score is above what a predictor without skill reaches at n."""
    from scipy import stats

    if not math.isfinite(score) or n < 2:
        return 1.0
    if metric == "accuracy":
        return float(stats.binom.sf(round(score * n) - 1, n, baseline))
    if metric == "f1":
        positive = baseline / (2 - baseline)
        sd = 2 / (1 + positive) ** 2 * math.sqrt(positive * (1 - positive) / n)
    else:  # mcc, pearson, spearman: a correlation, whose permutation null has variance 1/(n - 1)
        sd = 1 / math.sqrt(n - 1)
    if sd == 0:
        return 0.0 if score > baseline else 1.0
    return float(stats.norm.sf((score - baseline) / sd))


def check_run(metric: str, score: float, baseline: float, final_train_loss: float | None,
              trivial: float | None, n: int | None = None, alpha: float = SCORE_ALPHA,
              sample: Predictions | None = None) -> Convergence:
    """The per-run check (module docstring): flagged when the final training loss is at least LOSS_RATIO of
    the trivial loss, or the validation score is not above the best constant's `baseline` at one-sided level
    `alpha`: by the paired test on the run's `sample` when given (its n the sample's), else by the unpaired test
    on `n` examples, else by the score alone."""
    reasons = []
    if final_train_loss is not None and trivial and final_train_loss >= LOSS_RATIO * trivial:
        reasons.append(f"its final training loss {final_train_loss:.4g} is {final_train_loss / trivial:.0%} of the "
                       f"trivial predictor's {trivial:.4g} (must be below {LOSS_RATIO:.0%})")
    if sample is not None:
        n, p_value, test = len(sample.labels), paired_p_value(metric, score, sample), TESTS[metric]
    else:
        p_value = None if n is None else score_p_value(metric, score, baseline, n)
        test = None if n is None else "unpaired"
    if not score > baseline:  # NaN fails too
        reasons.append(f"its validation {metric} {score:.3f} is not above the best constant predictor's {baseline:.3f}")
    elif p_value is not None and p_value > alpha:
        reasons.append(f"its validation {metric} {score:.3f} is not significantly above the best constant "
                       f"predictor's {baseline:.3f} at {n} examples ({test} one-sided p = {p_value:.3g} > {alpha:g})")
    return Convergence(not reasons, metric, float(score), float(baseline), final_train_loss, trivial,
                       " and ".join(reasons), n, p_value, test)


def learning_rate_setting(finetune) -> tuple[str, float]:
    """The params.yaml key that sets a run's learning rate (FinetuneParams `finetune`; a run of
    finetune.compare_methods has its method's), and the rate the run trains at: under LoRA
    finetune.lora.learning_rate, or finetune.learning_rate's when that is null."""
    if finetune.method != "lora":
        return "finetune.learning_rate", finetune.learning_rate
    own = finetune.lora.learning_rate
    return "finetune.lora.learning_rate", finetune.learning_rate if own is None else own


def advice(finetune) -> str:
    """What to change in params.yaml for a run of `finetune` (:func:`learning_rate_setting`), with the values now
    set."""
    max_steps, warmup_steps = finetune.max_steps, finetune.warmup_steps
    name, rate = learning_rate_setting(finetune)
    fallback = finetune.method == "lora" and finetune.lora.learning_rate is None
    now = f"now null: finetune.learning_rate's {rate:g}" if fallback else f"now {rate:g}"
    return (f"train longer (finetune.max_steps = {max_steps}, e.g. {2 * max_steps}) or try another "
            f"{name} ({now}; a loss stuck at the trivial predictor's often needs a "
            f"lower rate, e.g. {rate / 2:g}, with a longer warm-up than finetune.warmup_steps = "
            f"{warmup_steps})")


def seed_outliers(scores: Mapping[object, float]) -> dict[object, str]:
    """Runs whose score is far below the other seeds' (module docstring), each with the reason."""
    flagged = {}
    for key, score in scores.items():
        others = [v for k, v in scores.items() if k != key and v is not None and not math.isnan(v)]
        if not others or score is None or math.isnan(score):
            continue
        median = statistics.median(others)
        spread = 1.4826 * statistics.median(abs(v - median) for v in others)
        gap = max(SEED_GAP, SEED_SPREADS * spread)
        if score < median - gap:
            flagged[key] = (f"its score {score:.3f} is {median - score:.3f} below the median {median:.3f} of the other "
                            f"seeds (more than {gap:.3f})")
    return flagged


def run_flags(records: Mapping[object, Mapping | None]) -> dict[object, str]:
    """Run key → why it is flagged, for the runs of one task and configuration: each run's own check
    (a convergence record, :meth:`Convergence.record`) and the cross-seed check on their scores. A run
    without a record (written before the check existed) gets only the cross-seed check, when it has a score."""
    flags = {key: record.get("reason") or NOT_CONVERGED for key, record in records.items()
             if record and record.get("converged") is False}
    scores = {key: float(record["score"]) for key, record in records.items()
              if record and isinstance(record.get("score"), (int, float))}
    for key, reason in seed_outliers(scores).items():
        flags[key] = f"{flags[key]}; {reason}" if key in flags else reason
    return {key: flags[key] for key in records if key in flags}


def metrics_record(metrics: Mapping | None, metric: str) -> dict | None:
    """The convergence record of a finetune metrics file; for one written before the check, just its score."""
    if not metrics:
        return None
    record = metrics.get("convergence")
    if isinstance(record, Mapping):
        return dict(record)
    return {"score": metrics[metric]} if isinstance(metrics.get(metric), (int, float)) else None


def marked(label: str, flagged: bool) -> str:
    """A run's label in figures and tables, e.g. "FT[1] (not converged)"."""
    return f"{label} ({NOT_CONVERGED})" if flagged else label


def title_note(labels: Sequence[str]) -> str:
    """A figure title's suffix naming its flagged runs ("" when none), e.g. " — FT[1] not converged"."""
    return f" — {', '.join(labels)} {NOT_CONVERGED}" if labels else ""


def checkpoint_flags(checkpoints, seeds: Sequence) -> dict[str, str]:
    """Figure label FT[i] (i-th seed; LoRA[i] for a compared method's run) → reason, for the flagged runs among the
    checkpoints of `seeds` (seeds or layersim.data.layout.FinetunedRun: ``checkpoints/seed<k>/model/``; their info
    files, see :func:`run_flags`): for stages that draw fine-tuned runs."""
    found = as_runs(seeds)
    records = {label: model_info(run.folder(checkpoints)).get("convergence")
               for run, label in zip(found, run_labels(found).values())}
    return run_flags(records)


def flagged_seeds(checkpoints, seeds: Sequence[int]) -> list[int]:
    """The seeds whose checkpoint run is flagged (:func:`checkpoint_flags`, by seed rather than figure label)."""
    flags = checkpoint_flags(checkpoints, seeds)
    return [seed for i, seed in enumerate(seeds, start=1) if f"FT[{i}]" in flags]


def checkpoint_note(checkpoints, seeds: Sequence[int]) -> str:
    """The title suffix of a figure drawn from the checkpoints' runs: names those that did not converge."""
    return title_note(list(checkpoint_flags(checkpoints, seeds)))


def enforce(check: Convergence, what: str, finetune, log) -> None:
    """Warn about a run that did not converge, naming it and what to change in params.yaml; with
    ``finetune.require_convergence`` raise instead (before the stage writes anything)."""
    if check.converged:
        return
    message = (f"{what} did not converge: {check.reason}; "
               f"{advice(finetune)}")
    if finetune.require_convergence:
        raise LayersimError(f"{message}.")
    log.warning("%s (finetune.require_convergence: true makes this an error)", message)


def checked_convergence(check: Convergence, task: str, seed: int, pretrained: str | Path, finetune, log) -> dict:
    """`check`'s record for the checkpoint and metrics, once :func:`enforce` has passed the run, which it names by
    task, seed and base model, and by method unless it is full fine-tuning (the advice then names that method's
    params)."""
    method = "" if finetune.method == "full" else f" with {finetune.method}"
    enforce(check, f"fine-tuning {task} seed {seed} from {pretrained}{method}", finetune, log)
    return check.record()
