"""Load YAML with the line of every key and item, so errors can name file:line: field.

PyYAML's safe_load forgets positions and silently keeps the last of duplicate keys; we
compose the node tree once, construct values from it with the safe constructor, and walk
the same tree to record lines and reject duplicates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from patchset.agent.lib.bounded import field_name
from .errors import ManifestError

Path_ = tuple  # a path into the document: ("series", 0, "tier")


class Located:
    """Parsed YAML data plus the 1-based line of every mapping key and list item."""

    def __init__(self, file: str, data: Any, lines: dict[Path_, int]) -> None:
        self.file, self.data, self.lines = file, data, lines

    def line(self, path: Path_) -> int:
        """Line of `path`, or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def error(self, path: Path_, message: str) -> ManifestError:
        return ManifestError(self.file, self.line(path), field_name(path), message)

    def version(self, expected: int, default: int | None, message: str) -> int:
        """The top-level `version`, which must be the integer `expected` (`default` when
        absent; None: required). Compared by type too: YAML's `true` and `1.0` equal 1
        in Python, and a file that says either was not written for this reader."""
        data = self.data if isinstance(self.data, dict) else {}
        value = data.get("version", default)
        if type(value) is not int or value != expected:
            raise self.error(("version",), message)
        return value


# Bounds on what a document may expand to. The shipped manifest is 6 levels deep and has
# about 900 nodes; an alias bomb (`a: &a [x, x]`, `b: &b [*a, *a]`, ...) expands to
# 2**N nodes from N lines and is refused by counting, before anything is constructed.
MAX_DEPTH = 32
MAX_NODES = 100_000
MAX_INT_DIGITS = 30


# LibYAML's parser when PyYAML has it (its wheels do): the pure-Python scanner is ~80% of
# loading the shipped manifest (80 ms -> 11 ms); the nodes, marks and errors are the same.
if TYPE_CHECKING:               # the stubs declare both; the code uses what they share
    _BASE = yaml.CSafeLoader
else:
    _BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE):
    """SafeLoader whose scalars cannot raise outside YAMLError: a 10**6-digit integer or
    an impossible date (`2026-13-45`) becomes a positioned error, not a traceback."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = str(node.value).replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"integer with {len(digits)} digits (at most {MAX_INT_DIGITS})",
                node.start_mark)
        return super().construct_yaml_int(node)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError, TypeError):
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is not a valid date (quote it to mean text)",
                node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def load(text: str, file: str) -> Located:
    try:
        _check_bounds(text, file)
        loader = _Loader(text)
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
    except (ValueError, OverflowError, TypeError, RecursionError) as exc:
        raise ManifestError(file, None, "(yaml)", f"invalid YAML: {exc}") from None
    lines: dict[Path_, int] = {}
    if node is not None:
        lines[()] = node.start_mark.line + 1
        _walk(node, (), lines, file)
    return Located(file, data, lines)


def _check_bounds(text: str, file: str) -> None:
    """One pass over the parser's events (iterative, so depth cannot overflow the stack):
    nesting depth, and the node count with every alias expanded."""
    sizes: dict[str, int] = {}
    stack: list[list] = [[None, 0]]          # [anchor, nodes so far] per open collection
    total = 0       # the sum of the stack's counts, kept as it changes (not re-summed per event)
    for event in yaml.parse(text, Loader=_BASE):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([event.anchor, 1])
            total += 1
            if len(stack) - 1 > MAX_DEPTH:
                raise _bound(file, event, f"nested deeper than {MAX_DEPTH} levels")
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, count = stack.pop()      # its nodes move to the parent: total unchanged
            if anchor:
                sizes[anchor] = count
            stack[-1][1] += count
        elif isinstance(event, yaml.AliasEvent):
            added = sizes.get(event.anchor or "", 1)       # an alias always names one
            stack[-1][1] += added
            total += added
        elif isinstance(event, yaml.ScalarEvent):
            stack[-1][1] += 1
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
        else:
            continue
        if total > MAX_NODES:
            raise _bound(file, event, f"expands to more than {MAX_NODES} nodes (aliases "
                         "included)")


def _bound(file: str, event: Any, message: str) -> ManifestError:
    return ManifestError(file, event.start_mark.line + 1, "(yaml)", f"refused: {message}")


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ManifestError(file, key_node.start_mark.line + 1, field_name(path),
                                    "a key must be a plain scalar, not a list or mapping")
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
