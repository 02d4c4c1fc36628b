"""The wire's record machinery: a Message is a dataclass that crosses between the agent
and the controller, with `from_json` checking exact types down to its leaves (nested
Messages included) and `to_json`. Standard library only, readable by Python 3.8:
annotations use `typing.Optional/List/Dict`, resolved by `typing.get_type_hints`.

`from_json` checks exact types (a bool is not an int, an int is not a str; an int is
accepted where a float is expected, as JSON writes `30` for 30.0 in other producers),
refuses a missing or an unknown field, and raises WireError with one line naming the
field. wire.py declares the requests and results of the ops with it, records.py the
records they carry.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, List, Tuple, Type, TypeVar, Union, get_type_hints

M = TypeVar("M", bound="Message")


class WireError(ValueError):
    """A request or result that is not what this protocol says (one line, names the field).
    `kind` is the error kind the agent answers with (protocol, or usage for an unknown op)."""

    def __init__(self, message: str, kind: str = "protocol") -> None:
        super().__init__(message)
        self.kind = kind


class Message:
    """A dataclass that crosses the wire; subclasses are @dataclass."""

    # What @dataclass gives each subclass, declared (not set) so that the type checker
    # takes a Message for a dataclass (dataclasses.fields, asdict).
    __dataclass_fields__: ClassVar[Dict[str, Any]]

    @classmethod
    def from_json(cls: Type[M], data: Any, where: str = "") -> M:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise WireError(f"{where}: expected a JSON object, got {_kind(data)}")
        hints = _hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        extra = sorted(set(data) - set(names))
        if extra:
            raise WireError(f"{where}: unknown field {extra[0]!r}")
        values = {}
        for name in names:
            if name not in data:
                raise WireError(f"{where}: missing field {name!r}")
            values[name] = _check(data[name], hints[name], f"{where}.{name}")
        return cls(**values)

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` if it is exactly of type `hint`, else WireError naming `where`."""
    origin = getattr(hint, "__origin__", None)
    args: Tuple[Any, ...] = getattr(hint, "__args__", ())
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Message):   # a nested record
        return hint.from_json(value, where)
    if origin is Union:                                   # Optional[X]
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(value, inner[0], where)
    if origin in (list, List):
        if type(value) is not list:
            raise WireError(f"{where}: expected a list, got {_kind(value)}")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] \
            if args else value
    if origin in (dict, Dict):
        if type(value) is not dict:
            raise WireError(f"{where}: expected an object, got {_kind(value)}")
        for key, item in value.items():
            _check(key, args[0], f"{where} key")
            _check(item, args[1], f"{where}[{key!r}]")
        return value
    if hint is float and type(value) is int:
        return float(value)
    if type(value) is not hint:
        raise WireError(f"{where}: expected {hint.__name__}, got {_kind(value)}")
    return value


@dataclasses.dataclass
class Result(Message):
    """An op's successful result (`{"ok": true, ...}` on the wire)."""


@dataclasses.dataclass
class Failure(Message):
    """The one shape of a failed result, for every op (`{"ok": false, "error": ...}`)."""

    kind: str
    message: str
    details: str = ""
