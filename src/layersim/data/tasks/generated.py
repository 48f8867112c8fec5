"""Built-in generated tasks: deterministic, offline, one per task format.

They are for the offline quickstart and the tests. No network and no NumPy: each split is
drawn with a seeded ``random.Random``. Every task is built so that a bag of words cannot
solve it. The label depends on how the words are put together, not on which words appear:

- ``synth-negation`` (single sentence, 2 labels: 0 = negative, 1 = positive). Sentiment where
  negation flips polarity: "the soup was not good" is negative and "it was never a boring film"
  is positive. The label is (adjective is positive) XOR (sentence is negated). Polarity and
  negation are drawn independently at 50/50, so no single word tells you anything about the
  label, and a linear model over word counts cannot compute an XOR.
- ``synth-roles`` (sentence pair, 2 labels: 0 = different, 1 = same). Does sentence b describe the
  same event (who did what to whom) as sentence a? Positives restate a, in the active or the
  passive voice. Most negatives swap the roles, so they have the same bag of words as a
  positive. The rest (20 % of negatives) replace one noun or the verb.
- ``synth-similarity`` (sentence pair regression, score in [0, 5]). Both sentences describe an
  event with four slots: subject adjective, subject, verb, object. Sentence b may be in the
  passive voice. The score is 5 x (slots whose filler matches) / 4. If b swaps the subject and
  the object, it uses the same words as a but gets a lower score.
- ``synth-choice`` (multiple choice, 4 choices). For example "alice gave bob the ball . who has
  the ball now ?". The choices are the two names in the context and two distractors, shuffled.
  Verbs of giving move the object to the second person and verbs of taking to the first. The
  passive voice changes the order of the names, and negation ("did not give", "never took")
  leaves the object where it was. So the answer depends on word order and negation, not on
  which names appear.

Train and validation are disjoint by construction. Each task has a *combination key*:
(noun, adjective) for negation; (verb, unordered pair of participants) for roles and
similarity; (unordered pair of names, object) for choice. A stable hash (CRC-32) reserves
about one key in five for validation. Sentence a or the context always comes from its split's
keys, so no validation (text, text_b) or context can appear in the train split, whatever the
seeds and sizes. Validation therefore also tests new combinations of known words.
"""

from __future__ import annotations

import functools
import random
import zlib
from collections.abc import Callable

from layersim.errors import LayersimError, unknown_name

GENERATED_TASKS: tuple[str, ...] = (
    "synth-negation",
    "synth-roles",
    "synth-similarity",
    "synth-choice",
)

SPLITS: tuple[str, ...] = ("train", "validation")

# One combination key in VALIDATION_EVERY goes to validation; the rest go to train.
VALIDATION_EVERY = 5

# --- vocabulary (lower-case words that the BERT uncased WordPiece vocabulary knows whole) ---

NEGATION_NOUNS: tuple[str, ...] = (
    "soup", "film", "movie", "book", "hotel", "pizza", "show", "game", "meal", "song",
    "service", "room", "coffee", "play", "album", "car", "trip", "party", "class", "cake",
)
POSITIVE_ADJECTIVES: tuple[str, ...] = (
    "good", "great", "nice", "fun", "pleasant", "wonderful", "excellent", "interesting",
    "enjoyable", "lovely",
)
NEGATIVE_ADJECTIVES: tuple[str, ...] = (
    "bad", "boring", "awful", "terrible", "poor", "dull", "horrible", "annoying",
    "disappointing", "ugly",
)
# Each negator flips the polarity of the adjective after it.
NEGATORS: tuple[str, ...] = (
    "not", "never", "hardly", "far from", "by no means", "in no way", "no longer",
)
INTENSIFIERS: tuple[str, ...] = ("very", "really", "quite", "truly", "so")
COPULAS: tuple[str, ...] = ("was", "is", "seemed")
# Neutral filler clauses. They contain no negator and no adjective from the lists above.
PREFIX_FILLERS: tuple[str, ...] = (
    "honestly ,", "to be honest ,", "in my opinion ,", "last night", "this time", "i think",
    "overall ,", "as usual ,",
)
SUFFIX_FILLERS: tuple[str, ...] = (
    ", to be honest", ", in my opinion", "last night", "this time", ", as usual",
    "according to my friend",
)

EVENT_NOUNS: tuple[str, ...] = (
    "dog", "cat", "horse", "boy", "girl", "man", "woman", "teacher", "doctor", "farmer",
    "bird", "lion", "king", "queen",
)
# Regular verbs: the past tense and the past participle are the same word.
EVENT_VERBS: tuple[str, ...] = (
    "chased", "pushed", "followed", "watched", "helped", "kicked", "pulled", "called",
    "visited", "attacked", "hugged", "saved",
)
EVENT_ADJECTIVES: tuple[str, ...] = (
    "big", "small", "old", "young", "happy", "angry", "tall", "little", "brown", "black",
    "white", "red",
)
ROLE_PREFIXES: tuple[str, ...] = ("yesterday ,", "this morning ,", "last week ,", "in the end ,")
ROLE_SUFFIXES: tuple[str, ...] = ("in the park", "near the river", "at night", "again")

NAMES: tuple[str, ...] = (
    "alice", "bob", "carol", "david", "emma", "frank", "grace", "henry", "anna", "john",
    "mary", "peter", "sarah", "tom", "lucy", "mike",
)
OBJECTS: tuple[str, ...] = (
    "ball", "book", "key", "cup", "hat", "pen", "phone", "ticket", "coin", "bag", "box",
    "apple",
)
# (affirmative frame, negated frames, who ends up with the object when it is not negated).
# {x} is the first-named person and {y} the second. "receiver" is the person the object moves
# to. Under negation it stays with the other person. In a passive frame the receiver is named
# first.
CHOICE_FRAMES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("{x} gave {y} the {o} .", ("{x} did not give {y} the {o} .", "{x} never gave {y} the {o} ."), "y"),
    ("{x} gave the {o} to {y} .", ("{x} did not give the {o} to {y} .",), "y"),
    ("{x} handed the {o} to {y} .", ("{x} did not hand the {o} to {y} .",), "y"),
    ("{x} threw the {o} to {y} .", ("{x} did not throw the {o} to {y} .", "{x} never threw the {o} to {y} ."), "y"),
    ("{x} passed the {o} to {y} .", ("{x} did not pass the {o} to {y} .",), "y"),
    ("{x} sold the {o} to {y} .", ("{x} did not sell the {o} to {y} .", "{x} never sold the {o} to {y} ."), "y"),
    ("{x} lent {y} the {o} .", ("{x} did not lend {y} the {o} .",), "y"),
    ("{x} took the {o} from {y} .", ("{x} did not take the {o} from {y} .", "{x} never took the {o} from {y} ."), "x"),
    ("{x} grabbed the {o} from {y} .", ("{x} did not grab the {o} from {y} .",), "x"),
    ("{x} borrowed the {o} from {y} .", ("{x} did not borrow the {o} from {y} .",), "x"),
    ("{x} bought the {o} from {y} .", ("{x} did not buy the {o} from {y} .", "{x} never bought the {o} from {y} ."), "x"),
    ("{x} stole the {o} from {y} .", ("{x} did not steal the {o} from {y} .",), "x"),
    ("{x} received the {o} from {y} .", ("{x} did not receive the {o} from {y} .",), "x"),
    ("the {o} was given to {x} by {y} .", ("the {o} was not given to {x} by {y} .",), "x"),
    ("the {o} was taken from {x} by {y} .", ("the {o} was not taken from {x} by {y} .",), "y"),
)
CHOICE_QUESTIONS: tuple[str, ...] = (
    "who has the {o} now ?", "who has the {o} at the end ?", "who is holding the {o} now ?",
)
CHOICE_FILLERS: tuple[str, ...] = (
    "it was a sunny day .", "the room was quiet .", "it was late .", "they met at school .",
)


# --- split bookkeeping ---


def _is_validation_key(*parts: str) -> bool:
    """Whether a combination key is reserved for validation (stable across runs and platforms)."""
    return zlib.crc32("|".join(parts).encode("utf-8")) % VALIDATION_EVERY == 0


def _keep(split: str, *parts: str) -> bool:
    return _is_validation_key(*parts) == (split == "validation")


@functools.lru_cache(maxsize=None)
def _negation_keys(split: str) -> tuple[tuple[str, str, bool], ...]:
    """(noun, adjective, adjective is positive) combinations that belong to `split`."""
    adjectives = [(a, True) for a in POSITIVE_ADJECTIVES] + [(a, False) for a in NEGATIVE_ADJECTIVES]
    return tuple(
        (noun, adj, positive)
        for noun in NEGATION_NOUNS
        for adj, positive in adjectives
        if _keep(split, noun, adj)
    )


@functools.lru_cache(maxsize=None)
def _event_keys(split: str) -> tuple[tuple[str, str, str], ...]:
    """(verb, noun, noun) with an unordered pair of participants, for `split`."""
    return tuple(
        (verb, n1, n2)
        for verb in EVENT_VERBS
        for i, n1 in enumerate(EVENT_NOUNS)
        for n2 in EVENT_NOUNS[i + 1 :]
        if _keep(split, verb, n1, n2)
    )


@functools.lru_cache(maxsize=None)
def _choice_keys(split: str) -> tuple[tuple[str, str, str], ...]:
    """(name, name, object) with an unordered pair of names, for `split`."""
    return tuple(
        (n1, n2, obj)
        for i, n1 in enumerate(NAMES)
        for n2 in NAMES[i + 1 :]
        for obj in OBJECTS
        if _keep(split, n1, n2, obj)
    )


# --- rendering helpers ---


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _event_sentence(agent: str, verb: str, patient: str, passive: bool, adjective: str = "") -> str:
    agent_phrase = f"the {adjective} {agent}" if adjective else f"the {agent}"
    if passive:
        return f"the {patient} was {verb} by {agent_phrase}"
    return f"{agent_phrase} {verb} the {patient}"


def _with_role_filler(rng: random.Random, sentence: str) -> str:
    roll = rng.random()
    if roll < 0.2:
        sentence = f"{rng.choice(ROLE_PREFIXES)} {sentence}"
    elif roll < 0.4:
        sentence = f"{sentence} {rng.choice(ROLE_SUFFIXES)}"
    return sentence + " ."


def _other(rng: random.Random, pool: tuple[str, ...], exclude: tuple[str, ...]) -> str:
    while True:
        choice = rng.choice(pool)
        if choice not in exclude:
            return choice


# --- the four generators ---


def _negation(rng: random.Random, split: str, n: int) -> dict[str, list]:
    keys = _negation_keys(split)
    texts: list[str] = []
    labels: list[int] = []
    for _ in range(n):
        noun, adj, positive = rng.choice(keys)
        negated = rng.random() < 0.5
        words = []
        if negated:
            words.append(rng.choice(NEGATORS))
        if rng.random() < 0.3:
            words.append(rng.choice(INTENSIFIERS))
        if rng.random() < 0.5:
            predicate = " ".join(words + [adj])
            core = f"the {noun} {rng.choice(COPULAS)} {predicate}"
        else:
            # "it was not a good soup": the negator goes before the article, and the article
            # agrees with the word right after it.
            negator, modifiers = (words[:1], words[1:]) if negated else ([], words)
            article = _article((modifiers + [adj])[0])
            phrase = [article] + modifiers + [adj, noun]
            core = " ".join(["it", rng.choice(COPULAS[:2])] + negator + phrase)
        roll = rng.random()
        if roll < 0.25:
            core = f"{rng.choice(PREFIX_FILLERS)} {core}"
        elif roll < 0.5:
            core = f"{core} {rng.choice(SUFFIX_FILLERS)}"
        texts.append(core + " .")
        labels.append(int(positive != negated))
    return {"text": texts, "label": labels}


def _roles(rng: random.Random, split: str, n: int) -> dict[str, list]:
    keys = _event_keys(split)
    text_a: list[str] = []
    text_b: list[str] = []
    labels: list[int] = []
    for _ in range(n):
        verb, n1, n2 = rng.choice(keys)
        agent, patient = (n1, n2) if rng.random() < 0.5 else (n2, n1)
        a = _with_role_filler(rng, _event_sentence(agent, verb, patient, rng.random() < 0.5))
        same = rng.random() < 0.5
        b_agent, b_verb, b_patient = agent, verb, patient
        if not same:
            roll = rng.random()
            if roll < 0.8:  # roles swapped: the same bag of words as a restatement
                b_agent, b_patient = patient, agent
            elif roll < 0.9:  # one participant replaced by a noun not in the event
                replacement = _other(rng, EVENT_NOUNS, (agent, patient))
                if rng.random() < 0.5:
                    b_agent = replacement
                else:
                    b_patient = replacement
            else:  # the verb replaced
                b_verb = _other(rng, EVENT_VERBS, (verb,))
        b = _with_role_filler(rng, _event_sentence(b_agent, b_verb, b_patient, rng.random() < 0.5))
        text_a.append(a)
        text_b.append(b)
        labels.append(int(same))
    return {"text_a": text_a, "text_b": text_b, "label": labels}


def _similarity(rng: random.Random, split: str, n: int) -> dict[str, list]:
    keys = _event_keys(split)
    text_a: list[str] = []
    text_b: list[str] = []
    labels: list[float] = []
    for _ in range(n):
        verb, n1, n2 = rng.choice(keys)
        subject, obj = (n1, n2) if rng.random() < 0.5 else (n2, n1)
        a_slots = [rng.choice(EVENT_ADJECTIVES), subject, verb, obj]
        b_slots = list(a_slots)
        # The number of matching slots is uniform over 0..4, so the scores cover the range.
        # Half of the pairs that score 2.5 or less get there through a role swap.
        target = rng.randrange(len(a_slots) + 1)
        if target <= 2 and rng.random() < 0.5:
            # Roles swapped. The adjective stays on the subject, so the words are the same as a's.
            b_slots[1], b_slots[3] = obj, subject
            changeable = [0, 2]
        else:
            changeable = [0, 1, 2, 3]
        # Every slot left in `changeable` matches until it is changed.
        for slot in rng.sample(changeable, len(changeable) - target):
            if slot == 0:
                b_slots[0] = _other(rng, EVENT_ADJECTIVES, (a_slots[0],))
            elif slot == 2:
                b_slots[2] = _other(rng, EVENT_VERBS, (a_slots[2],))
            else:
                b_slots[slot] = _other(rng, EVENT_NOUNS, (subject, obj, b_slots[4 - slot]))
        matches = sum(x == y for x, y in zip(a_slots, b_slots))
        a_adj, a_subj, a_verb, a_obj = a_slots
        b_adj, b_subj, b_verb, b_obj = b_slots
        text_a.append(_event_sentence(a_subj, a_verb, a_obj, rng.random() < 0.5, a_adj) + " .")
        text_b.append(_event_sentence(b_subj, b_verb, b_obj, rng.random() < 0.5, b_adj) + " .")
        labels.append(5.0 * matches / len(a_slots))
    return {"text_a": text_a, "text_b": text_b, "label": labels}


def _choice(rng: random.Random, split: str, n: int) -> dict[str, list]:
    keys = _choice_keys(split)
    contexts: list[str] = []
    choices: list[list[str]] = []
    labels: list[int] = []
    for _ in range(n):
        n1, n2, obj = rng.choice(keys)
        x, y = (n1, n2) if rng.random() < 0.5 else (n2, n1)
        affirmative, negations, receiver = rng.choice(CHOICE_FRAMES)
        negated = rng.random() < 0.5
        frame = rng.choice(negations) if negated else affirmative
        holder = receiver if not negated else ("x" if receiver == "y" else "y")
        answer = x if holder == "x" else y
        parts = [frame.format(x=x, y=y, o=obj)]
        if rng.random() < 0.3:
            parts.insert(0, rng.choice(CHOICE_FILLERS))
        parts.append(rng.choice(CHOICE_QUESTIONS).format(o=obj))
        options = [x, y] + rng.sample([m for m in NAMES if m not in (x, y)], 2)
        rng.shuffle(options)
        contexts.append(" ".join(parts))
        choices.append(options)
        labels.append(options.index(answer))
    return {"context": contexts, "choices": choices, "label": labels}


_GENERATORS: dict[str, Callable[[random.Random, str, int], dict[str, list]]] = {
    "synth-negation": _negation,
    "synth-roles": _roles,
    "synth-similarity": _similarity,
    "synth-choice": _choice,
}


def generate(task: str, split: str, num_examples: int, seed: int) -> dict[str, list]:
    """Columns of a normalized task table for `split` ("train" or "validation").

    The output depends only on (task, split, num_examples, seed). A larger `num_examples` with
    the same seed extends the smaller table: it starts with the same rows.
    """
    if task not in _GENERATORS:
        raise unknown_name("task", task, GENERATED_TASKS)
    if split not in SPLITS:
        raise LayersimError(
            f"unknown split {split!r} for generated task {task!r}; valid splits are: "
            f"{', '.join(SPLITS)}."
        )
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise LayersimError(
            f"num_examples must be a positive integer, got {num_examples!r} for generated task {task!r}."
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise LayersimError(f"seed must be an integer, got {seed!r} for generated task {task!r}.")
    # Seeding with a string uses SHA-512 on every Python 3 version, so the result does not
    # depend on PYTHONHASHSEED.
    rng = random.Random(f"layersim|{task}|{split}|{seed}")
    return _GENERATORS[task](rng, split, num_examples)
