"""A griffe extension for the API reference: Sphinx roles in docstrings (:func:`~layersim.x.f`) become code spans.

The library's docstrings name other objects with Sphinx roles; Markdown would print the role itself. ``~``
keeps the last component, as Sphinx does. mkdocs.yml loads this file; it is not a page (exclude_docs).
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|attr|data|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``:func:`~a.b.c``` -> ```c```, ``:mod:`a.b``` -> ```a.b```."""
    return ROLE.sub(lambda m: f"``{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}``", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
