"""The registry of alignment maps: names → classes, and :func:`make_map` to build one by name."""

from __future__ import annotations

from layersim.align.base import AlignmentMap, option_names
from layersim.align.linear import CCAMap, LinearRegressionMap, PWCCAMap, SVCCAMap
from layersim.align.neural import INNMap, MLPMap
from layersim.errors import LayersimError, unknown_name

MAPS: dict[str, type[AlignmentMap]] = {
    cls.name: cls for cls in (LinearRegressionMap, CCAMap, SVCCAMap, PWCCAMap, INNMap, MLPMap)
}


def make_map(name: str, **options: object) -> AlignmentMap:
    """An unfitted map by registry name (``linear``, ``cca``, ``svcca``, ``pwcca``, ``inn``, ``mlp``).

    ``options`` are the map's constructor arguments, e.g. ``make_map("inn", steps=200, seed=1)``.

    Raises
    ------
    LayersimError
        For an unknown name, an option the map does not take (the message lists the ones it
        does), or an invalid option value.
    """
    if name not in MAPS:
        raise unknown_name("map", name, MAPS)
    cls = MAPS[name]
    valid = option_names(cls)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise LayersimError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                            f"for the {name!r} map; its options are: {', '.join(valid)}.")
    return cls(**options)
