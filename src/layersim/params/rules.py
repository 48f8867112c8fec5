"""How a params key is declared (:func:`knob`: default, doc, bounds, names) and how one value is checked.

Every key of params.yaml is declared once, in :mod:`layersim.params.schema`, with what it accepts; the
checks here read those declarations. Values in messages are shortened (:func:`shown`), so that a YAML
alias bomb or a 400-digit integer cannot turn into an endless message.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from layersim.errors import LayersimError

MAX_SEED = 2**32 - 1   # NumPy's legacy seeding (np.random.seed, used by fine-tuning) takes no larger seed


@dataclass(frozen=True)
class Bound:
    """One range rule of a number: `holds(value)`, and what to say when it does not ("a positive {kind}":
    kind is "integer" or "number")."""
    holds: Callable[[float], bool]
    says: str


POSITIVE = Bound(lambda v: v > 0, "a positive {kind}")
NON_NEGATIVE = Bound(lambda v: v >= 0, "a non-negative {kind}")
FRACTION = Bound(lambda v: 0 < v <= 1, "a number in (0, 1]")
TOLERANCE = Bound(lambda v: 0 <= v < 1, "a number in [0, 1) (a score difference on the metrics' 0–1 scale)")
SEED = (NON_NEGATIVE, Bound(lambda v: v <= MAX_SEED, f"an integer from 0 to {MAX_SEED}"))


def at_most(limit: int, why: str) -> Bound:
    """An upper bound far above any real run: a size is allocated or looped over, and a typo
    (`max_steps: 10000000000000`) must fail at once instead of exhausting memory or running for ever."""
    return Bound(lambda v: v <= limit, f"at most {limit:,} ({why})")


def at_least(limit: int, why: str) -> Bound:
    return Bound(lambda v: v >= limit, f"at least {limit} ({why})")


def knob(default: Any, doc: str, *bounds: Bound | tuple[Bound, ...], names: Any = None,
         check: Callable[[str, Any], Any] | None = None) -> Any:
    """A params key: its default, one line of doc, its range rules (numbers), the names it is drawn from
    (a tuple, or a function returning (names, empty list allowed) for a list of names read from a
    registry) or a `check(key, value) -> value` of its own."""
    flat = tuple(b for item in bounds for b in (item if isinstance(item, tuple) else (item,)))
    metadata = {"doc": doc, "bounds": flat, "names": names, "check": check}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def shown(value: Any) -> str:
    """repr of a params value, bounded."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 2, 12, 12, 12
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 100, 100, 40


def fail(key: str, value: Any, allowed: str) -> LayersimError:
    return LayersimError(f"params.yaml: {key} = {shown(value)} is invalid; it must be {allowed}.")


def repeated(items: list) -> Any:
    """The first item of `items` (hashable) that appeared before, or None."""
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def check_number(key: str, value: Any, kind: type, optional: bool, bounds: tuple[Bound, ...] = ()) -> Any:
    """An int or float (`kind`) within `bounds`; None too when `optional`. Booleans are not numbers."""
    if value is None and optional:
        return None
    what = "an integer" if kind is int else "a number"
    if optional:
        what += " or null"
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not (is_int or (kind is float and isinstance(value, float))):
        raise fail(key, value, what)
    if kind is float and not _finite(value):
        raise fail(key, value, "a finite number")
    for bound in bounds:
        if not bound.holds(value):
            raise fail(key, value, bound.says.format(kind="integer" if kind is int else "number"))
    return float(value) if kind is float else value


def check_names(key: str, value: Any, choices: tuple[str, ...], allow_empty: bool = False) -> tuple[str, ...]:
    """A list of distinct names drawn from `choices`."""
    if not isinstance(value, list) or not (value or allow_empty):
        raise fail(key, value, f"a {'' if allow_empty else 'non-empty '}list drawn from {', '.join(choices)}")
    for item in value:
        if not isinstance(item, str) or item not in choices:
            close = difflib.get_close_matches(item, choices, n=1) if isinstance(item, str) else []
            mean = f" (did you mean {close[0]!r}?)" if close else ""
            raise LayersimError(f"params.yaml: {key} has {shown(item)}, which is invalid{mean}; each entry must be "
                                f"one of {', '.join(choices)}.")
    same = repeated(value)
    if same is not None:
        raise fail(key, value, f"a list without repeated names ({same!r} is given twice)")
    return tuple(value)


def check_value(key: str, spec: dataclasses.Field, value: Any) -> Any:
    """`value` of the key `key` as its declaration `spec` (a dataclass field made by knob) accepts it."""
    meta, annotation = spec.metadata, str(spec.type)
    if meta.get("check"):
        return meta["check"](key, value)
    names = meta.get("names")
    if annotation == "bool":
        if not isinstance(value, bool):
            raise fail(key, value, "true or false")
        return value
    if annotation == "str":
        if not isinstance(value, str) or value not in names:
            raise fail(key, value, f"one of {', '.join(names)}")
        return value
    if names is not None:
        choices, allow_empty = names() if callable(names) else (names, False)
        return check_names(key, value, choices, allow_empty)
    kind = float if annotation.startswith("float") else int
    return check_number(key, value, kind, optional="None" in annotation, bounds=meta.get("bounds", ()))


def nested(cls: type) -> Callable[[str, Any], Any]:
    """The check of a key that holds a sub-section (e.g. finetune.lora): a mapping of `cls`'s knobs, each checked as
    declared; a missing or empty mapping takes every default."""

    def check(key: str, value: Any) -> Any:
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise fail(key, value, "a mapping of keys to values")
        fields = {spec.name: spec for spec in dataclasses.fields(cls)}
        unknown = [name for name in value if name not in fields]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), fields, n=1)
            mean = f" (did you mean {key}.{close[0]}?)" if close else ""
            raise LayersimError(f"params.yaml: unknown key '{key}.{str(unknown[0])[:100]}'{mean}; valid keys of {key} "
                                f"are: {', '.join(fields)}.")
        return cls(**{name: check_value(f"{key}.{name}", fields[name], item) for name, item in value.items()})

    return check
