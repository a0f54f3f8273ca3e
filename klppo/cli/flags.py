"""Flag parsing shared by the sub-commands: argparse that fails in one line, tyro's config
flags with tyro's error folded into one line, and ``FIELD=VALUE`` items read as YAML."""

from __future__ import annotations

import argparse
import contextlib
import io
import unicodedata
from typing import Any, NoReturn, TypeVar

from klppo.cli.errors import BAD_INPUT, FlagError, say_error

__all__ = ["OneLineParser", "parse_config_flags", "yaml_value", "path_arg", "name_arg", "int_in",
           "MAX_WORKERS", "Once", "RaisingParser"]

T = TypeVar("T")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (``prog: message``), without the usage."""

    def error(self, message: str) -> NoReturn:
        say_error(self.prog.removeprefix("klppo").strip(), message)
        raise SystemExit(BAD_INPUT)


class RaisingParser(argparse.ArgumentParser):
    """argparse that raises :class:`~klppo.cli.errors.FlagError` (for a parser whose caller
    reports errors itself, e.g. ``parse_train``)."""

    def error(self, message: str) -> NoReturn:
        raise FlagError(message)


#: the most worker processes a command starts at once (``--workers`` of sweep, demo, compare)
MAX_WORKERS = 1024


def path_arg(text: str) -> str:
    """An argparse type: a path that names something (not '' or blanks, no NUL byte)."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} names no path")
    return text


def name_arg(text: str) -> str:
    """An argparse type: a name that is not empty."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a name")
    return text


def int_in(low: int, high: int):
    """An argparse type: an integer in ``[low, high]``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in [{low:,}, {high:,}]")
        return value
    parse.__name__ = "integer"
    return parse


class Once(argparse.Action):
    """A flag that may be given once (argparse keeps the last of several without a word)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore
        before = getattr(namespace, self.dest, None)
        if before not in (None, self.default):
            parser.error(f"argument {option_string}: given twice ({before!r} and {values!r}); "
                         f"give it once")
        setattr(namespace, self.dest, values)


def _tyro_error(text: str) -> str:
    """The gist of tyro's boxed error message, on one line (``title: message``)."""
    keep = []
    for line in text.splitlines():
        line = line.strip(" │╭╮╰╯─━┃┏┓┗┛|").strip()
        if set(line) <= {"-"}:  # a separator rule
            continue
        if line.startswith("Argument helptext"):
            break
        if line and not line.startswith(("For full helptext", "Parsing error", "Usage")):
            keep.append(line)
    if not keep:
        return "invalid flags (see --help)"
    title, body = keep[0], " ".join(keep[1:])
    return (body if body.lower().startswith(title.lower()) or not body
            else f"{title}: {body}")[:400] or title


def parse_config_flags(cls: type[T], args: list[str], prog: str, default: T | None = None,
                       description: str | None = None) -> T:
    """tyro's flags for the dataclass ``cls`` over ``default``; :class:`FlagError` (one line)
    when they do not parse. ``--help`` prints tyro's help and exits 0 as usual."""
    import tyro

    _refuse_unicode_numbers(args)
    kw: dict[str, Any] = {"args": args, "prog": prog, "default": default,
                          "description": description}
    if any(a in ("-h", "--help") for a in args):
        return tyro.cli(cls, **kw)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tyro.cli(cls, **kw)
    except SystemExit:
        raise FlagError(_tyro_error(err.getvalue())) from None


def _refuse_unicode_numbers(args: list[str]) -> None:
    """Python reads '１０２４' or '٠.٠٠٣' as numbers; a config file's YAML does not. A value
    that is a number only once its non-ASCII digits are folded is refused (a path or a name
    with such characters is not a number and passes)."""
    for i, text in enumerate(args):
        if text.isascii() or text.startswith("--"):
            continue
        folded = unicodedata.normalize("NFKC", text)
        try:
            float("".join(str(unicodedata.digit(c, c)) if not c.isascii() else c
                          for c in folded))
        except (ValueError, TypeError):
            continue
        flag = args[i - 1] if i and args[i - 1].startswith("--") else "a flag"
        raise FlagError(f"{flag}={text!r}: a number must be written with ASCII digits")


def yaml_value(text: str, what: str) -> Any:
    """A flag's value read as YAML, as a config file's would be (``1e-4`` is a float);
    :class:`~klppo.runs.errors.InputError` naming ``what`` when it is not YAML."""
    from klppo.runs.configfile import parse_yaml

    return parse_yaml(text, what)
