"""Reading params.yaml: the bytes as UTF-8, the YAML exactly as DVC parses it, every failure one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from layersim.errors import LayersimError
from layersim.params.schema import Params
from layersim.params.validate import parse_params


# params.yaml is read exactly as DVC reads it (ruamel.yaml's safe loader, YAML 1.2): `010` is 10, `1:00`,
# `yes` and `on` are strings. PyYAML follows YAML 1.1 (`010` = 8, `1:00` = 60, `yes` = true), so a run
# would train for another number of steps than `dvc params diff` shows.
def _yaml():
    from ruamel.yaml import YAML

    return YAML(typ="safe")


def _repeated_key(node: Any, path: tuple[str, ...] = (), seen: set[int] | None = None) -> str | None:
    """Describe the first key that a mapping of the YAML node tree gives twice, with its path and both
    lines, or None."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, MappingNode):
        first: dict[str, tuple[Node, Node]] = {}

        def at(key_node: Node, value_node: Node) -> str:
            shown = f" = {value_node.value}" if isinstance(value_node, ScalarNode) else ""
            return f"line {key_node.start_mark.line + 1}{shown}"

        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, ScalarNode) else None
            if key is not None and key != "<<":
                if key in first:
                    return (f"{'.'.join((*path, key))} is given twice ({at(*first[key])}, "
                            f"{at(key_node, value_node)}); each key may appear only once")
                first[key] = (key_node, value_node)
            found = _repeated_key(value_node, (*path, key or "?"), seen)
            if found:
                return found
    elif isinstance(node, SequenceNode):
        for item in node.value:
            found = _repeated_key(item, path, seen)
            if found:
                return found
    return None


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError as err:
        raise LayersimError(f"{path} does not exist; run stages from the repository root.") from err
    except IsADirectoryError as err:
        raise LayersimError(f"{path} is a folder, not a file; the params must be one YAML file.") from err
    except OSError as err:
        raise LayersimError(f"{path} cannot be read ({err.strerror or err}); check its permissions.") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise LayersimError(f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); "
                            "save it as UTF-8.") from err


MAX_DEPTH = 100  # params.yaml needs three levels; YAML's C parser crashes (no exception) on ~100,000


def _check_depth(path: Path, text: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH before any parser sees it: flow collections ([ {) counted
    outside quotes and comments, block nesting by indentation."""
    depth = deepest = 0
    quote = None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        deepest = max(deepest, indent // 2)
        for char in line:
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "#":
                break
            elif char in "[{":
                depth += 1
                deepest = max(deepest, depth)
            elif char in "]}":
                depth = max(depth - 1, 0)
        if deepest > MAX_DEPTH:
            raise LayersimError(f"{path} nests more than {MAX_DEPTH} levels deep; params.yaml needs at most three "
                                "(section, key, list).")


def parse_yaml(path: Path, text: str) -> Any:
    """The document as DVC parses it, with repeated keys refused (DVC's parser refuses them too, in a
    message without the key's path)."""
    from ruamel.yaml import YAMLError

    _check_depth(path, text)
    try:
        repeated = _repeated_key(_yaml().compose(text))
        if repeated:
            raise LayersimError(f"{path}: {repeated}.")
        return _yaml().load(text)
    except YAMLError as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = problem or str(err).splitlines()[0]
        raise LayersimError(f"{path} is not valid YAML ({detail}{where}).") from err
    except RecursionError as err:
        raise LayersimError(f"{path} nests too deeply to read (hundreds of levels); params.yaml needs at most "
                            "three (section, key, list).") from err
    except ValueError as err:  # an integer of more than 4,300 digits: Python's int conversion limit
        detail = "an integer with thousands of digits" if "digits" in str(err) else str(err).splitlines()[0]
        raise LayersimError(f"{path} has a value that cannot be read ({detail}); no params value needs more "
                            "than a few digits.") from err


def read_yaml(path: str | Path) -> Any:
    """params.yaml's document as DVC parses it; a missing, unreadable or invalid file is one sentence."""
    return parse_yaml(Path(path), _read_text(Path(path)))


def load_params(path: str | Path = "params.yaml", parse: Callable[[Any], Any] = parse_params) -> Params:
    """Read and validate params.yaml (with `parse`: validate.parse_sources checks only what it names to read)."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        return parse(raw)
    except LayersimError as err:
        # parse_params knows no file name; name the file actually read (`--params other.yaml`).
        message = str(err)
        if path.name != "params.yaml" and message.startswith("params.yaml"):
            raise LayersimError(f"{path}{message[len('params.yaml'):]}") from None
        raise
    except RecursionError as err:
        raise LayersimError(f"{path} nests too deeply to check (hundreds of levels); params.yaml needs at most "
                            "three (section, key, list).") from err
