"""Load YAML with the line of every key and item, so errors can name file:line: field.

PyYAML's safe_load forgets positions and silently keeps the last of duplicate keys; we
compose the node tree once, construct values from it with the safe constructor, and walk
the same tree to record lines and reject duplicates.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import ManifestError

Path_ = tuple  # a path into the document: ("series", 0, "tier")


class Located:
    """Parsed YAML data plus the 1-based line of every mapping key and list item."""

    def __init__(self, file: str, data: Any, lines: dict[Path_, int]) -> None:
        self.file, self.data, self.lines = file, data, lines

    def line(self, path: Path_) -> int | None:
        """Line of `path`, or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def error(self, path: Path_, message: str) -> ManifestError:
        return ManifestError(self.file, self.line(path), field_name(path), message)


def field_name(path: Path_) -> str:
    """`("series", 2, "tier")` -> `series[2].tier`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def load(text: str, file: str) -> Located:
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(file, line, "(yaml)", f"invalid YAML: {problem}") from None
    lines: dict[Path_, int] = {}
    if node is not None:
        lines[()] = node.start_mark.line + 1
        _walk(node, (), lines, file)
    return Located(file, data, lines)


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            child = path + (key,)
            if key in seen:
                raise ManifestError(file, key_node.start_mark.line + 1, field_name(child),
                                    "duplicate key")
            seen.add(key)
            lines[child] = key_node.start_mark.line + 1
            _walk(value_node, child, lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = path + (index,)
            lines[child] = item.start_mark.line + 1
            _walk(item, child, lines, file)
