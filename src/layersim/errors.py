"""The one error type users see: a single sentence naming the bad value and what is valid."""

from __future__ import annotations

import difflib
import operator
import os
import re

from collections.abc import Iterable


class LayersimError(Exception):
    """A user-facing error; stage scripts print its message and exit non-zero."""


class DiskFullError(LayersimError):
    """No space left while writing `path`. `atomic`: an atomic write (layersim.data.io), which removed its partial
    file and replaces nothing until it succeeds; `after` says what else holds (default: that earlier outputs are
    intact, as they are outside DVC; a stage under DVC says otherwise: layersim.cli.run_stage)."""

    def __init__(self, path: object, atomic: bool = True, after: str = "earlier outputs are intact"):
        self.path, self.atomic = path, atomic
        where = f" while writing {path}" if path else ""
        left = "the partial file was removed" if atomic else "a file it was writing may be cut short"
        super().__init__(f"no space left on the device{where}; free some space and run the stage again ({left}, "
                         f"{after}).")


def unknown_name(kind: str, name: object, valid: Iterable[str], hint: str = "") -> LayersimError:
    """Build the error for a name that is not in a registry: a close valid name if there is one, and every valid
    name (a numbered family written as its range)."""
    valid = list(valid)
    message = f"unknown {kind} {name!r}{did_you_mean(name, valid)}; valid {kind}s are: {', '.join(compact(valid))}"
    if hint:
        message += f" ({hint})"
    return LayersimError(message + ".")


# Hugging Face's switches that forbid asking the hub (quickstart.sh and smallest.sh set both): a download then fails
# with "Couldn't reach ... (OfflineModeIsEnabled)", which names neither the switch nor what to do.
OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def forced_offline() -> list[str]:
    """Those of OFFLINE_SWITCHES set to a true value (1, ON, YES, TRUE, as huggingface_hub reads them)."""
    return [name for name in OFFLINE_SWITCHES if os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}]


def did_you_mean(name: object, valid: Iterable[str]) -> str:
    """' (did you mean …?)' with the valid name closest to a mistyped `name`, or '': difflib's closest at a ratio of
    0.75 or more, a slip of a letter or two ('tiny-brt'), not another name that shares a part ('cka': rbf_cka?)."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.75) if isinstance(name, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def compact(names: Iterable[str]) -> list[str]:
    """Sorted names, a numbered family of three or more (multiberts-0 … multiberts-24) written as its range."""
    names = list(names)
    numbered: dict[str, list[int]] = {}
    for name in names:
        match = re.fullmatch(r"(.*-)([0-9]+)", name)
        if match:
            numbered.setdefault(match.group(1), []).append(int(match.group(2)))
    families = {prefix: sorted(n) for prefix, n in numbered.items() if len(n) >= 3}
    shown_names = [name for name in names if not any(name.startswith(p) and name[len(p):].isdigit() for p in families)]
    shown_names += [f"{p}{n[0]} … {p}{n[-1]}" for p, n in families.items()]
    return sorted(shown_names)


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
