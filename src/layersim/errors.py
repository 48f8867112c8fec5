"""The one error type users see: a single sentence naming the bad value and what is valid."""

from __future__ import annotations

import operator
import os

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


# Hugging Face's switches that forbid asking the hub (quickstart.sh and smallest.sh set both): a download then fails
# with "Couldn't reach ... (OfflineModeIsEnabled)", which names neither the switch nor what to do.
OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def forced_offline() -> list[str]:
    """Those of OFFLINE_SWITCHES set to a true value (1, ON, YES, TRUE, as huggingface_hub reads them)."""
    return [name for name in OFFLINE_SWITCHES if os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}]


def hub_unreachable(kind: str, name: str, err: Exception, offline: Iterable[str],
                    where: str = "the Hugging Face hub", mirror_env: str | None = None,
                    from_hub: bool = True) -> LayersimError:
    """The error for a hub download that failed: which model or dataset, from where and at which
    revision (`where`), why, and what works without network; when it was asked of the hub (not of a mirror folder)
    with the hub switched off (OFFLINE_SWITCHES), the switch, and the variable naming a mirror folder (`mirror_env`)
    where one can stand in for the hub."""
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    switches = forced_offline() if from_hub else []
    cause = ""
    if switches:
        instead = f"unset it to download, or set {mirror_env} to a folder laid out like the hub" if mirror_env else \
            "unset it to download"
        cause = (f"{' and '.join(f'{switch}=1' for switch in switches)} {'is' if len(switches) == 1 else 'are'} set "
                 f"(quickstart.sh and smallest.sh set them), so the hub is never asked: {instead}; ")
    return LayersimError(f"could not download {kind} {name!r} from {where}: {detail}; {cause}"
                         f"without network use an offline {kind}: {', '.join(offline)}.")


def as_int(value: object, what: str, valid: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise LayersimError(f"{what} {value!r} is not an integer; valid values are {valid}.") from None
