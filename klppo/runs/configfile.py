"""Config files and the dataclass configs they fill, with one-line errors naming file or field.

* :func:`read_text`: a UTF-8 text file, or :class:`InputFileError` (missing, a directory,
  unreadable, not UTF-8).
* :func:`read_config_file`: a YAML mapping of ``field: value``. YAML 1.2 numbers: ``1e-4`` is the
  float 1e-4 (PyYAML's YAML 1.1 rules read it as the string ``"1e-4"``).
* :func:`overlay`: a mapping onto a dataclass instance; unknown fields and values of the wrong
  type (:func:`klppo.runs.typecheck.check_value`) are errors naming the field and the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from klppo.runs.typecheck import TypeCheckError, check_value

__all__ = ["InputError", "InputFileError", "UnknownFieldError", "read_text", "parse_yaml",
           "read_config_file", "overlay", "field_hints"]

T = TypeVar("T")


class InputError(ValueError):
    """Bad input; the message names what (a field, a flag, a file) and its value."""


class InputFileError(InputError):
    """An input file is missing, unreadable or malformed; the message names it."""


class UnknownFieldError(TypeCheckError):
    """A config key that is not a field of the config; the message names it and its value."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 exponent floats without a dot (``1e-4``, ``3E5``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def read_text(path: str | Path, what: str) -> str:
    """The file's text; :class:`InputFileError` ``{what}='path': why`` otherwise."""
    p = Path(path)
    name = f"{what}={str(p)!r}"
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{name}: is a directory, not a file") from None
    except OSError as e:
        raise InputFileError(f"{name}: cannot be read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{name}: not UTF-8 text (byte {data[e.start]:#04x} at offset "
                             f"{e.start})") from None


def parse_yaml(text: str, what: str) -> Any:
    """YAML text (safe types; YAML 1.2 exponent floats); :class:`InputError` ``{what}: not
    valid YAML at line L, column C: problem`` otherwise."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{what}: not valid YAML{where}: {problem}") from None


def read_config_file(path: str | Path, what: str = "config") -> dict[str, Any]:
    """A YAML file holding a mapping ``field: value`` (an empty file is an empty mapping)."""
    name = f"{what}={str(path)!r}"
    try:
        data = parse_yaml(read_text(path, what), name)
    except InputError as e:
        raise InputFileError(str(e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputFileError(f"{name}: must be a mapping of field: value, got a "
                             f"{type(data).__name__}")
    return data


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields (``from __future__`` strings too)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


def overlay(base: T, values: dict[str, Any]) -> T:
    """``base`` with ``values`` replacing its fields, each checked against its annotation.

    Keys may use ``-`` for ``_``. Unknown keys raise :class:`UnknownFieldError`, values of the
    wrong type :class:`TypeCheckError`; both name the field and the value.
    """
    hints = field_hints(type(base))
    changes = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in hints:
            close = difflib.get_close_matches(name, list(hints), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UnknownFieldError(f"{key}={value!r}: unknown field of "
                                    f"{type(base).__name__}{hint}")
        changes[name] = check_value(name, value, hints[name])
    return dataclasses.replace(base, **changes)


def merge_nested(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` with ``b`` laid over it, nested mappings merged key by key (neither is changed)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge_nested(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out
