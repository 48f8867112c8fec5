"""The one error type users see: a single sentence naming the bad value and what is valid."""

from __future__ import annotations

import operator

from collections.abc import Iterable


class LayersimError(Exception):
    """A user-facing error; stage scripts print its message and exit non-zero."""


def unknown_name(kind: str, name: object, valid: Iterable[str], hint: str = "") -> LayersimError:
    """Build the error for a name that is not in a registry, listing the valid names."""
    choices = ", ".join(sorted(valid))
    message = f"unknown {kind} {name!r}; valid {kind}s are: {choices}"
    if hint:
        message += f" ({hint})"
    return LayersimError(message + ".")


def hub_unreachable(kind: str, name: str, err: Exception, offline: Iterable[str],
                    where: str = "the Hugging Face hub") -> LayersimError:
    """The error for a hub download that failed: which model or dataset, from where and at which
    revision (`where`), why, and what works without network."""
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return LayersimError(f"could not download {kind} {name!r} from {where}: {detail}; "
                         f"without network use an offline {kind}: {', '.join(offline)}.")


def as_int(value: object, what: str, valid: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise LayersimError(f"{what} {value!r} is not an integer; valid values are {valid}.") from None
