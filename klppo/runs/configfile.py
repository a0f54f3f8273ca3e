"""Config files and the dataclass configs they fill, with one-line errors naming file or field.

* :func:`read_text`: a UTF-8 text file, or :class:`InputFileError` (missing, a directory,
  unreadable, not UTF-8).
* :func:`read_config_file`: a YAML mapping of ``field: value``. YAML 1.2 numbers: ``1e-4`` is the
  float 1e-4 (PyYAML's YAML 1.1 rules read it as the string ``"1e-4"``). A key given twice in
  one mapping, aliases that expand to more than :data:`MAX_YAML_NODES` values (a "billion
  laughs" document), a recursive alias and nesting too deep to read are refused.
* :func:`overlay`: a mapping onto a dataclass instance; unknown fields and values of the wrong
  type (:func:`klppo.runs.typecheck.check_value`) are errors naming the field and the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import stat
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from klppo.runs.errors import InputError
from klppo.runs.typecheck import TypeCheckError, check_value, short_repr

__all__ = ["MAX_YAML_NODES", "InputError", "InputFileError", "UnknownFieldError", "read_text",
           "parse_yaml", "read_config_file", "overlay", "field_hints", "check_fields"]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


class InputFileError(InputError):
    """An input file is missing, unreadable or malformed; the message names it."""


class UnknownFieldError(TypeCheckError):
    """A config key that is not a field of the config; the message names it and its value."""


#: the most values (scalars, lists, mappings) a YAML document may hold once its aliases are
#: expanded; a config or sweep spec holds a few hundred, an alias bomb billions
MAX_YAML_NODES = 100_000


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 exponent floats without a dot (``1e-4``, ``3E5``),
    refuses a key given twice in one mapping and a document whose aliases expand beyond
    :data:`MAX_YAML_NODES` values (or into themselves)."""

    def get_single_node(self):  # type: ignore[no-untyped-def]
        node = super().get_single_node()
        if node is not None:
            _check_size(node)
        return node

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, typing.Hashable):
                    continue  # SafeConstructor refuses it with its own words
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {short_repr(key)} (a key may appear once "
                        f"in a mapping)", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_size(root: yaml.Node) -> None:
    """Refuse a node graph that expands to more than MAX_YAML_NODES values, or into itself."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            if sizes[id(node)] < 0:
                raise yaml.composer.ComposerError(None, None, "a recursive alias (a value "
                                                  "that contains itself)", node.start_mark)
            return sizes[id(node)]
        if not isinstance(node, yaml.CollectionNode):
            return 1
        sizes[id(node)] = -1
        items = node.value if isinstance(node, yaml.SequenceNode) else \
            [n for pair in node.value for n in pair]
        total = 1 + sum(size(n) for n in items)
        if total > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"its aliases expand to more than {MAX_YAML_NODES:,} values",
                node.start_mark)
        sizes[id(node)] = total
        return total

    size(root)


# YAML 1.2 core schema for plain scalars (PyYAML implements YAML 1.1, where `010` is 8, `1_024`
# is 1024, `yes`/`On` are true, `1:30` is 90 and `2026-01-01` is a date): only these forms are
# numbers, booleans and null; everything else is a string, which the type checks then refuse.
_CORE = {
    "tag:yaml.org,2002:bool": r"true|True|TRUE|false|False|FALSE",
    "tag:yaml.org,2002:int": r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+",
    "tag:yaml.org,2002:float": r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
    "tag:yaml.org,2002:null": r"~|null|Null|NULL|",
}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _CORE
            and tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _tag, _pattern in _CORE.items():
    _Loader.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"),
                                  list("-+0123456789.tTfFnN~") + [""])


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 integer: decimal (leading zeros allowed), 0o octal or 0x hexadecimal."""
    text = str(loader.construct_scalar(node))
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    base = {"0o": 8, "0x": 16}.get(digits[:2], 10)
    return sign * int(digits[2:] if base != 10 else digits, base)


_Loader.add_constructor("tag:yaml.org,2002:int", _core_int)


#: the largest file klppo reads as a config, spec or status (a config is a few KB)
MAX_INPUT_BYTES = 10 * 2**20


def _read_bounded(p: Path, name: str) -> bytes:
    """The bytes of a regular file of at most MAX_INPUT_BYTES (a device such as /dev/zero or a
    FIFO would never end, a huge file is not a config): InputFileError otherwise."""
    mode = os.stat(p).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(str(p))
    if not stat.S_ISREG(mode):
        raise InputFileError(f"{name}: not a regular file (a device, a pipe or a socket)")
    with open(p, "rb") as f:
        data = f.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise InputFileError(f"{name}: larger than {MAX_INPUT_BYTES // 2**20} MiB; not a "
                             f"config file")
    return data


def read_text(path: str | Path, what: str) -> str:
    """The file's text; :class:`InputFileError` ``{what}='path': why`` otherwise."""
    p = Path(path)
    name = f"{what}={str(p)!r}"
    try:
        data = _read_bounded(p, name)
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
    except RecursionError:
        raise InputError(f"{what}: not valid YAML: nested too deeply to read") from None
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


def overlay(base: T, values: dict[str, Any], prefix: str = "") -> T:
    """``base`` (a dataclass config) with ``values`` replacing its fields, each checked against
    its annotation; a field that is itself a dataclass takes a nested mapping. The one overlay
    of every klppo config (training, RLHF, pretraining).

    Keys may use ``-`` for ``_``. Unknown keys raise :class:`UnknownFieldError`, values of the
    wrong type :class:`TypeCheckError`; both name the field (with ``prefix``) and the value.
    """
    hints = field_hints(type(base))
    changes = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in hints:
            raise UnknownFieldError(f"{prefix}{short_repr(str(key))[1:-1]}={short_repr(value)}: "
                                    f"unknown config field{_known(name, sorted(hints))}")
        if name in changes:  # `batch_size` and `batch-size` both given: which one is meant?
            raise TypeCheckError(f"{prefix}{short_repr(str(key))[1:-1]}={short_repr(value)}: "
                                 f"{prefix}{name} is given twice (with '_' and with '-'); "
                                 f"keep one")
        current = getattr(base, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise TypeCheckError(f"{prefix}{name}={short_repr(value)}: must be a mapping")
            # a config field holds a dataclass instance, never a dataclass class
            changes[name] = overlay(typing.cast("DataclassInstance", current), value,
                                    f"{prefix}{name}.")
        else:
            changes[name] = check_value(prefix + name, value, hints[name])
    return dataclasses.replace(base, **changes)


def check_fields(cfg: Any, skip: tuple[str, ...] = (), prefix: str = "") -> None:
    """Every field of the dataclass config ``cfg`` (and of the dataclasses it holds) of its
    annotated type, as :func:`overlay` checks a config file's values (a config built in code):
    :class:`TypeCheckError` naming the first field that is not, and its value. ``skip``: the
    fields (dotted names) checked elsewhere."""
    cls: type = type(cfg)
    for name, ann in field_hints(cls).items():
        value, dotted = getattr(cfg, name), prefix + name
        if dotted in skip:
            continue
        if isinstance(ann, type) and dataclasses.is_dataclass(ann):
            if not isinstance(value, ann):
                raise TypeCheckError(f"{dotted}={short_repr(value)}: must be a {ann.__name__}")
            check_fields(value, skip, dotted + ".")
        else:
            check_value(dotted, value, ann)


def _known(name: str, known: list[str]) -> str:
    """"; did you mean X?" and, when short, the known names (a message stays one short line)."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    listing = f"; known: {known}"
    return hint + (listing if len(listing) <= 160 else " (--help lists them)")


def merge_nested(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` with ``b`` laid over it, nested mappings merged key by key (neither is changed)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge_nested(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out
