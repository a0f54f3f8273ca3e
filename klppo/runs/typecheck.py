"""Check values read from YAML (or JSON) against a dataclass field's annotation.

YAML's own types are loose for a config: ``yes`` is a bool, ``"0.02"`` a string, ``64`` where a
list is meant. :func:`check_value` accepts exactly what the annotation says (an int for a float,
a list for a tuple) and raises :class:`TypeCheckError` naming the field and the value otherwise.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from klppo.runs.errors import ConfigError

__all__ = ["TypeCheckError", "check_value", "describe", "short_repr"]

#: the longest repr of a value that an error message quotes (a message stays one short line)
REPR_LIMIT = 80


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``...`` (a huge value in a message
    would make its "one line" unreadable)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class TypeCheckError(ConfigError):
    """A value does not have its field's type; the message names the field and the value."""


def describe(ann: Any) -> str:
    """A short human description of an annotation (for error messages)."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is tuple:
        if len(args) > 1 and args[-1] is not Ellipsis:
            return f"a list of {len(args)}: " + ", ".join(describe(a) for a in args)
        return f"a list of: {describe(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping of names to values" if args and args[0] is str else "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(ann, getattr(ann, "__name__", str(ann)))


_NO = object()


def _convert(value: Any, ann: Any) -> Any:
    """The value as the annotation's type, or ``_NO`` when it is not one."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is Any:
        return value
    if ann is type(None):
        return None if value is None else _NO
    if origin is Literal:
        ok = any(value == a and type(value) is type(a) for a in args)
        return value if ok else _NO
    if origin in (typing.Union, types.UnionType):
        for a in args:
            out = _convert(value, a)
            if out is not _NO:
                return out
        return _NO
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return _NO
        if len(args) > 1 and args[-1] is not Ellipsis:  # a fixed length: tuple[float, float]
            if len(value) != len(args):
                return _NO
            items = [_convert(v, t) for v, t in zip(value, args)]
        else:
            elem = args[0] if args else Any
            items = [_convert(v, elem) for v in value]
        return _NO if any(i is _NO for i in items) else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            return _NO
        key = args[0] if args else Any
        pairs = [(_convert(k, key), _convert(v, args[1] if args else Any))
                 for k, v in value.items()]
        return _NO if any(k is _NO or v is _NO for k, v in pairs) else dict(pairs)
    if ann is bool:
        return value if isinstance(value, bool) else _NO
    if ann is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if ann is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _NO
    if ann is str:
        return value if isinstance(value, str) else _NO
    return value  # an annotation this checker does not know: leave it to the validator


def check_value(field_name: str, value: Any, ann: Any) -> Any:
    """``value`` converted to ``ann`` (int -> float, list -> tuple), or :class:`TypeCheckError`."""
    out = _convert(value, ann)
    if out is _NO:
        raise TypeCheckError(f"{field_name}={short_repr(value)}: must be {describe(ann)}")
    return out
