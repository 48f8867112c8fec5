"""The convergence check (layersim.training.convergence): planted runs that learned nothing or fell far below their
seeds are flagged, converged runs are not, and finetune.require_convergence turns the warning into an error."""

from __future__ import annotations

import itertools
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest

from layersim.data.tasks import get_task
from layersim.training import train
from layersim.training import convergence
from layersim.training.convergence import (Convergence, Predictions, check_run, enforce, final_loss, marked,
                                           metrics_record, paired_p_value, run_flags, score_p_value, seed_outliers,
                                           title_note, trivial_loss)
from layersim.training.evaluate import METRICS
from layersim.errors import LayersimError

FINETUNE = SimpleNamespace(max_steps=120, learning_rate=1e-4, warmup_steps=20, require_convergence=False, method="full",
                           lora=SimpleNamespace(learning_rate=None))


def _regression_labels(n=2000, seed=0):
    """Scores in [0, 5] with the quickstart's label variance, about 3.125."""
    return np.random.default_rng(seed).uniform(0.0, 5.0, n) * math.sqrt(3.125 / (25 / 12))


def test_trivial_loss_is_the_label_entropy_or_variance():
    assert trivial_loss(np.array([0, 1, 0, 1]), regression=False) == pytest.approx(math.log(2))
    assert trivial_loss(np.array([0, 0, 0, 1]), regression=False) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert trivial_loss(np.array([2, 2, 2]), regression=False) == 0.0
    assert trivial_loss(np.array([0.0, 1.0, 2.0, 3.0]), regression=True) == pytest.approx(1.25)
    with pytest.raises(LayersimError, match="train split is empty"):
        trivial_loss(np.array([]), regression=True)


def test_final_loss_averages_the_last_tenth_of_the_logged_losses():
    assert final_loss([]) is None
    assert final_loss([5.0, 4.0, 3.0]) == 3.0                   # at least one value
    assert final_loss(list(range(20, 0, -1))) == pytest.approx(1.5)   # the last 2 of 20
    assert final_loss([9.0] * 108 + [1.0] * 12) == pytest.approx(1.0)  # the last 12 of 120 steps


def test_a_mean_predictor_is_flagged_by_its_loss_and_its_score():
    labels = _regression_labels()
    variance = trivial_loss(labels, regression=True)
    assert variance == pytest.approx(3.125, rel=0.05)
    check = check_run("pearson", 0.0, 0.0, final_train_loss=variance * 1.002, trivial=variance)
    assert not check.converged
    assert "final training loss" in check.reason and "validation pearson 0.000" in check.reason


def test_the_quickstart_runs_stuck_seed_flagged_the_converged_ones_not():
    """The review's measurements: seed 1 kept a loss of about 3.1 (label variance 3.125) and scored Pearson
    0.369; the converged recipe scored 0.780/0.798/0.815 with the training loss well below the variance."""
    stuck = check_run("pearson", 0.369, 0.0, final_train_loss=3.1, trivial=3.125)
    assert not stuck.converged and "99% of the trivial predictor's 3.125" in stuck.reason
    assert "validation" not in stuck.reason  # 0.369 clears the score check: the loss is what gives it away
    for score, loss in ((0.780, 0.9), (0.798, 0.7), (0.815, 0.6)):
        assert check_run("pearson", score, 0.0, final_train_loss=loss, trivial=3.125).converged


def test_a_score_at_the_majority_class_is_flagged():
    # RTE: 277 validation examples, majority 0.527; the binomial test asks for 161 correct (0.581)
    check = check_run("accuracy", 0.53, 0.527, final_train_loss=0.2, trivial=0.69, n=277)
    assert not check.converged and check.reason.startswith("its validation accuracy 0.530 is not significantly above")
    assert not check_run("accuracy", 160 / 277, 0.527, 0.2, 0.69, n=277).converged
    assert check_run("accuracy", 161 / 277, 0.527, 0.2, 0.69, n=277).converged
    assert check_run("accuracy", 0.66, 0.527, final_train_loss=0.2, trivial=0.69, n=277).converged
    assert not check_run("accuracy", float("nan"), 0.5, final_train_loss=0.2, trivial=0.69, n=277).converged
    # without n only "above the baseline" is asked; at the baseline a run is flagged either way
    assert check_run("accuracy", 0.53, 0.527, 0.2, 0.69).converged
    assert not check_run("accuracy", 0.527, 0.527, 0.2, 0.69).converged
    # no logged loss (or labels all alike): only the score decides
    assert check_run("mcc", 0.4, 0.0, final_train_loss=None, trivial=None, n=1043).converged


def test_an_always_positive_run_on_a_qqp_like_f1_task_is_flagged():
    """Review §5a: 37 % duplicates; predicting "duplicate" everywhere scores F1 0.538, the best constant's
    score, while the majority constant scores 0. The run's training loss looks learned; the score gives it away."""
    train_labels = np.array([0] * 63 + [1] * 37)
    validation = np.array([0] * 630 + [1] * 370)
    baseline = train.trivial_score(get_task("qqp"), train_labels, validation)
    always_positive = METRICS["f1"](validation, np.ones_like(validation))
    assert baseline == always_positive == pytest.approx(2 * 0.37 / 1.37)
    check = check_run("f1", always_positive, baseline, final_train_loss=0.3, trivial=trivial_loss(train_labels, False),
                      n=len(validation))
    assert not check.converged and "not above the best constant predictor's 0.540" in check.reason
    assert "training loss" not in check.reason
    # a run that does learn clears it: F1 0.75 is far above 0.54 at n = 1,000
    assert check_run("f1", 0.75, baseline, 0.3, 0.66, n=len(validation)).converged


def test_the_unpaired_test_treats_the_majority_rate_as_known():
    """For a caller with only the score and n (no predictions): a run at 0.97 over a 96 % majority passes at 2,000
    examples (binomial P(X ≥ 1,940 | 2,000, 0.96) = 0.011) and not at 1,000 (p = 0.058): the sample majority's own
    noise is charged to the run. The pipeline has the predictions and pairs them (the next tests)."""
    trivial = trivial_loss(np.array([0] * 96 + [1] * 4), regression=False)
    assert trivial == pytest.approx(0.168, abs=5e-4)
    check = check_run("accuracy", 0.97, 0.96, 0.05, trivial, n=2000)
    assert check.converged and check.p_value == pytest.approx(0.0106, abs=5e-4) and check.test == "unpaired"
    small = check_run("accuracy", 0.97, 0.96, 0.05, trivial, n=1000)
    assert not small.converged and "p = 0.058" in small.reason


def _accuracy_check(labels, predictions, n_train=100):
    """check_run as the pipeline calls it: the best constant found on the sample (train.best_constant) and paired
    with the run's predictions; the training loss is a learned one, so the score test decides."""
    constant, baseline = train.best_constant(get_task("sst2"), labels[:n_train], labels)
    return check_run("accuracy", float(np.mean(predictions == labels)), baseline, 0.05, 0.168, sample=
                     Predictions(labels, predictions, constant))


def _planted_runs(rng, n, minority_right, majority_wrong, minority=0.04):
    """The fidelity review's (2026-11-28 §2) imbalanced design: a 4 % minority class 1; the run says 1 on
    `minority_right` of the minority and `majority_wrong` of the majority examples, at random."""
    labels = (rng.random(n) < minority).astype(np.int64)
    says_minority = rng.random(n) < np.where(labels == 1, minority_right, majority_wrong)
    return labels, says_minority.astype(np.int64)


def test_the_baseline_is_the_samples_own_best_constant():
    labels = np.array([0] * 950 + [1] * 50)
    assert train.best_constant(get_task("sst2"), np.array([1, 1, 0]), labels) == (0, 0.95)  # not the train majority
    assert train.best_constant(get_task("mrpc"), np.array([0, 0, 1]), labels)[0] == 1        # always positive
    # the constant run itself: every example concordant, p = 1
    check = _accuracy_check(labels, np.zeros(1000, np.int64))
    assert not check.converged and check.p_value == 1.0 and check.test == "McNemar exact"


def test_mcnemar_counts_only_the_examples_where_run_and_constant_disagree():
    labels = np.array([0] * 90 + [1] * 10)
    predictions = np.zeros(100, np.int64)
    predictions[90:96] = 1     # 6 minority examples right
    predictions[:1] = 1        # 1 majority example wrong
    check = _accuracy_check(labels, predictions)
    assert check.p_value == pytest.approx(8 / 128)   # P(Bin(7, ½) ≥ 6) = (7 + 1)/128
    assert check.n == 100 and check.score == pytest.approx(0.95) and check.baseline == pytest.approx(0.9)


@pytest.mark.parametrize("n, minority_right, majority_wrong, least", [(1000, 0.25, 0.0, 0.90), (2000, 0.40, 0.006, 0.85)])
def test_a_learned_run_over_a_96_percent_majority_passes_the_paired_test(n, minority_right, majority_wrong, least):
    """Review §2, runs A and B (population accuracy 0.970 over a 96 % majority): the paired test passes A in at
    least 90 % of 1,000-example validation sets (the unpaired test: about 42 %), and passes each run more often
    than the unpaired test does."""
    rng = np.random.default_rng(3)
    paired = unpaired = 0
    draws = 400
    for _ in range(draws):
        labels, predictions = _planted_runs(rng, n, minority_right, majority_wrong)
        check = _accuracy_check(labels, predictions)
        paired += check.converged
        unpaired += check_run("accuracy", check.score, check.baseline, 0.05, 0.168, n=n).converged
    assert paired / draws >= least and paired > unpaired, (paired / draws, unpaired / draws)


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_the_paired_test_holds_its_level_for_runs_without_skill():
    """Calibration on the pipeline's null: the constant scores exactly the sample's best (not a population rate,
    as this test formerly assumed, a null the pipeline never meets: there the constant cannot pass). Accuracy:
    the review's no-skill run (the minority said on 2 % of examples at random) and, at the test's boundary, a run
    that leaves the constant on 30 % of an exactly balanced sample's examples at random (right there half
    the time). F1
    (37 % positives): runs guessing positive at random at rates 0.5–0.99, the last nearly the always-positive
    constant. MCC and Pearson: predictions independent of the labels."""
    rng = np.random.default_rng(0)
    n, draws = 400, 1000
    rates = {"no skill": np.mean([_accuracy_check(*_planted_runs(rng, 1000, 0.02, 0.02)).converged
                                  for _ in range(draws)])}
    boundary = []
    for _ in range(draws):
        labels = rng.permutation(np.arange(n) % 2)   # exactly balanced: both constants score ½
        constant = 0
        predictions = np.where(rng.random(n) < 0.3, 1 - constant, constant)
        boundary.append(paired_p_value("accuracy", float(np.mean(predictions == labels)),
                                       Predictions(labels, predictions, constant)) <= 0.05)
    rates["boundary"] = np.mean(boundary)
    # McNemar's own level, where each disagreement is a fair coin: i.i.d. balanced labels, the constant 0
    coins = []
    for _ in range(draws):
        labels, predictions = (rng.random(n) < 0.5).astype(np.int64), (rng.random(n) < 0.3).astype(np.int64)
        coins.append(paired_p_value("accuracy", float(np.mean(predictions == labels)),
                                    Predictions(labels, predictions, 0)) <= 0.05)
    level = np.mean(coins)
    for guess in (0.5, 0.9, 0.99):
        passed = []
        for _ in range(draws // 4):
            labels = (rng.random(n) < 0.37).astype(np.int64)
            predictions = (rng.random(n) < guess).astype(np.int64)
            sample = Predictions(labels, predictions, 1)
            passed.append(paired_p_value("f1", _f1_score(labels, predictions), sample, draws=999) <= 0.05)
        rates[f"f1 {guess}"] = np.mean(passed)
    positives = (rng.random((draws, n)) < 0.37).astype(int)
    guesses = (rng.random((draws, n)) < 0.2).astype(int)
    rates["mcc"] = np.mean([score_p_value("mcc", METRICS["mcc"](y, g), 0.0, n) <= 0.05 for y, g in zip(positives, guesses)])
    rates["pearson"] = np.mean([score_p_value("pearson", METRICS["pearson"](rng.normal(size=n), rng.normal(size=n)),
                                              0.0, n) <= 0.05 for _ in range(draws)])
    assert all(rate <= 0.05 for key, rate in rates.items() if key not in ("mcc", "pearson")), rates
    assert all(0.03 <= rates[m] <= 0.07 for m in ("mcc", "pearson")), rates
    assert 0.02 <= level <= 0.06, level


def _f1_score(labels, predictions):
    true_pos = np.count_nonzero((labels == 1) & (predictions == 1))
    return 2 * true_pos / (2 * true_pos + np.count_nonzero(labels != predictions))


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_a_learned_f1_run_passes_the_paired_test_where_the_unpaired_one_misses_it():
    """QQP-like, 37 % positives, n = 400: a run that says positive except on 15 % of the negatives and 2 % of the
    positives (F1 about 0.57 against always positive's 0.54) passes the paired test in ≥ 90 % of samples; the
    unpaired test, which charges the constant's own noise to the run, in far fewer."""
    rng = np.random.default_rng(4)
    n, draws, paired, unpaired = 400, 200, 0, 0
    for _ in range(draws):
        labels = (rng.random(n) < 0.37).astype(np.int64)
        predictions = np.where(labels == 1, rng.random(n) > 0.02, rng.random(n) > 0.15).astype(np.int64)
        constant, baseline = train.best_constant(get_task("qqp"), labels, labels)
        score = _f1_score(labels, predictions)
        paired += paired_p_value("f1", score, Predictions(labels, predictions, constant), draws=999) <= 0.05
        unpaired += score > baseline and score_p_value("f1", score, baseline, n) <= 0.05
    assert paired / draws >= 0.9 and unpaired / draws < 0.5, (paired / draws, unpaired / draws)


def test_the_f1_randomization_test_matches_every_swap_enumerated():
    rng = np.random.default_rng(5)
    labels, predictions = (rng.random(12) < 0.4).astype(int), (rng.random(12) < 0.7).astype(int)
    disagree = np.flatnonzero(predictions != 1)
    observed = _f1_score(labels, predictions) - _f1_score(labels, np.ones(12, int))
    extreme = []
    for swaps in itertools.product([False, True], repeat=disagree.size):
        run, other = predictions.copy(), np.ones(12, int)
        run[disagree[list(swaps)]], other[disagree[list(swaps)]] = 1, predictions[disagree[list(swaps)]]
        extreme.append(_f1_score(labels, run) - _f1_score(labels, other) >= observed - 1e-12)
    assert convergence._paired_f1_randomization(labels, predictions, 1, 200_000, 0) == pytest.approx(
        np.mean(extreme), abs=0.005)
    with pytest.raises(LayersimError, match="one prediction per validation label"):
        Predictions(labels, predictions[:5], 1)


def test_a_multiple_choice_runs_trivial_loss_is_that_of_tied_answers():
    # a content-blind scorer ties every answer whatever the positions' frequencies (review §5e)
    assert trivial_loss(np.array([0, 0, 0, 1]), regression=False, choices=4) == pytest.approx(math.log(4))


def test_the_record_keeps_the_numbers_and_the_reason_only_when_flagged():
    good = check_run("accuracy", 0.8, 0.5, 0.1234567891, 0.69).record()
    assert good == {"converged": True, "metric": "accuracy", "score": 0.8, "baseline": 0.5,
                    "final_train_loss": 0.123457, "trivial_loss": 0.69}
    tested = check_run("accuracy", 0.8, 0.5, 0.1, 0.69, n=10).record()
    assert tested["n"] == 10 and tested["p_value"] == pytest.approx(56 / 1024, abs=1e-6)  # P(Bin(10, ½) ≥ 8)
    bad = check_run("accuracy", 0.5, 0.5, 0.69, 0.69).record()
    assert bad["converged"] is False and bad["reason"]


def test_a_seed_far_below_its_siblings_is_flagged():
    flags = seed_outliers({1: 0.80, 2: 0.79, 3: 0.35})
    assert list(flags) == [3] and "0.445 below the median 0.795" in flags[3]
    assert list(seed_outliers({1: 0.369, 2: 0.768})) == [1]   # the quickstart's two seeds
    assert seed_outliers({1: 0.80, 2: 0.79, 3: 0.78}) == {}
    assert seed_outliers({1: 0.72, 2: 0.65}) == {}            # 0.07 apart: seed noise, not a failed run
    assert seed_outliers({1: 0.8}) == {}                      # one seed: nothing to compare with
    # the gap widens with the other seeds' own spread: 0.2 below a median whose seeds spread by 0.1 is not far
    assert seed_outliers({1: 0.60, 2: 0.90, 3: 0.70, 4: 0.80}) == {}


@pytest.mark.parametrize("seed", range(20))
def test_seed_outliers_do_not_depend_on_the_order_or_a_shift_of_the_scores(seed):
    rng = np.random.default_rng(seed)
    scores = dict(enumerate(rng.uniform(0.3, 0.9, rng.integers(2, 7)).round(3)))
    flags = set(seed_outliers(scores))
    shuffled = dict(sorted(scores.items(), key=lambda kv: rng.random()))
    assert set(seed_outliers(shuffled)) == flags
    assert set(seed_outliers({k: v + 0.05 for k, v in scores.items()})) == flags
    # a flagged seed is below every unflagged one
    assert all(scores[f] < scores[k] for f in flags for k in scores if k not in flags)


def test_run_flags_join_each_runs_check_with_the_seed_check():
    stuck = check_run("pearson", 0.369, 0.0, 3.1, 3.125).record()
    fine = check_run("pearson", 0.768, 0.0, 0.9, 3.125).record()
    flags = run_flags({"seed1": stuck, "seed2": fine})
    assert list(flags) == ["seed1"] and "training loss" in flags["seed1"] and "median 0.768" in flags["seed1"]
    # metrics files written before the check: only their scores, only the seed check
    old = {1: metrics_record({"accuracy": 0.80}, "accuracy"), 2: metrics_record({"accuracy": 0.79}, "accuracy"),
           3: metrics_record({"accuracy": 0.35}, "accuracy"), 4: metrics_record(None, "accuracy")}
    assert list(run_flags(old)) == [3]
    assert run_flags({1: fine}) == {}


def test_labels_and_titles_name_the_flagged_runs():
    assert marked("FT[1]", True) == "FT[1] (not converged)" and marked("FT[2]", False) == "FT[2]"
    assert title_note(["FT[1]"]) == " — FT[1] not converged" and title_note([]) == ""


def test_enforce_warns_by_default_and_raises_when_convergence_is_required(caplog):
    stuck = Convergence(False, "pearson", 0.369, 0.0, 3.1, 3.125, "its final training loss 3.1 is 99% of 3.125")
    with caplog.at_level(logging.WARNING, logger="layersim"):
        enforce(stuck, "fine-tuning synth-similarity seed 1", FINETUNE, logging.getLogger("layersim"))
    assert "fine-tuning synth-similarity seed 1 did not converge" in caplog.text
    assert "finetune.max_steps = 120, e.g. 240" in caplog.text and "finetune.learning_rate (now 0.0001" in caplog.text
    required = SimpleNamespace(**{**vars(FINETUNE), "require_convergence": True})
    with pytest.raises(LayersimError, match=r"^fine-tuning synth-similarity seed 1 did not converge: its final "
                                            r"training loss .*finetune\.warmup_steps = 20\)\.$"):
        enforce(stuck, "fine-tuning synth-similarity seed 1", required, logging.getLogger("layersim"))
    enforce(check_run("pearson", 0.8, 0.0, 0.5, 3.125), "x", required, logging.getLogger("layersim"))  # no error


@pytest.mark.parametrize("own_rate, expected", [(1e-3, "finetune.lora.learning_rate (now 0.001; "),
                                                (None, "finetune.lora.learning_rate (now null: "
                                                       "finetune.learning_rate's 0.0001; ")])
def test_a_lora_runs_advice_names_its_own_learning_rate(caplog, own_rate, expected):
    """A LoRA run (finetune.method: lora, or a run of finetune.compare_methods) trains at finetune.lora.learning_rate
    when set: the advice names that key, its value and half of it, not finetune.learning_rate's."""
    stuck = Convergence(False, "pearson", 0.369, 0.0, 3.1, 3.125, "its final training loss 3.1 is 99% of 3.125")
    lora = SimpleNamespace(**{**vars(FINETUNE), "method": "lora", "lora": SimpleNamespace(learning_rate=own_rate)})
    with caplog.at_level(logging.WARNING, logger="layersim"):
        enforce(stuck, "fine-tuning synth-similarity seed 1 with LoRA", lora, logging.getLogger("layersim"))
    assert expected in caplog.text and f"e.g. {(own_rate or 1e-4) / 2:g}" in caplog.text
    assert "try another finetune.learning_rate" not in caplog.text


def test_the_learning_rate_a_run_trains_at_is_named_by_its_own_key():
    """One place says which key sets a run's rate (the optimizer, the divergence hint and the advice read it)."""
    from layersim.training.convergence import learning_rate_setting

    lora = lambda own: SimpleNamespace(**{**vars(FINETUNE), "method": "lora",  # noqa: E731
                                          "lora": SimpleNamespace(learning_rate=own)})
    assert learning_rate_setting(FINETUNE) == ("finetune.learning_rate", 1e-4)
    assert learning_rate_setting(lora(None)) == ("finetune.lora.learning_rate", 1e-4)
    assert learning_rate_setting(lora(1e-3)) == ("finetune.lora.learning_rate", 1e-3)
