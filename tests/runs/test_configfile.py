from dataclasses import dataclass
from typing import Literal

import pytest

from klppo.runs.configfile import (
    InputFileError,
    UnknownFieldError,
    overlay,
    parse_yaml,
    read_config_file,
)
from klppo.runs.typecheck import TypeCheckError, check_value


@pytest.mark.parametrize("value, ann, out", [
    (True, bool, True), (3, int, 3), (3, float, 3.0), (2.5, float, 2.5), (None, float | None, None),
    (0.1, float | None, 0.1), ("k1", Literal["k1", "k3"], "k1"), ([1, 2], tuple[int, ...], (1, 2)),
    ("x", str, "x"),
])
def test_check_value_accepts_and_converts(value, ann, out):
    got = check_value("f", value, ann)
    assert got == out and type(got) is type(out)


@pytest.mark.parametrize("value, ann, why", [
    ("yes please", bool, "true or false"), (1, bool, "true or false"),
    (True, int, "an integer"), (2.0, int, "an integer"), (True, float, "a number"),
    ("fast", float, "a number"), ("0.1", float | None, "a number or null"),
    ("k9", Literal["k1", "k3"], "one of 'k1', 'k3'"), (1, Literal[True], "one of True"),
    (64, tuple[int, ...], "a list of: an integer"),
    ([1, "a"], tuple[int, ...], "a list of: an integer"),
    (3, str, "a string"),
])
def test_check_value_names_field_and_value(value, ann, why):
    with pytest.raises(TypeCheckError) as e:
        check_value("field", value, ann)
    assert str(e.value) == f"field={value!r}: must be {why}"


def test_yaml_exponent_floats_are_floats():
    assert parse_yaml("lr: 1e-4\nn: 3E5\nm: -2e+3\ns: 1e-4x\n", "x") == {
        "lr": 1e-4, "n": 3e5, "m": -2000.0, "s": "1e-4x"}


@dataclass
class Small:
    lr: float = 0.1
    flag: bool = False
    horizon: float | None = None


def test_overlay_checks_types_and_names_unknown_fields(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: 1\nhorizon: null\nflag: true\n")
    assert overlay(Small(), read_config_file(tmp_path / "c.yaml")) == Small(1.0, True, None)
    with pytest.raises(UnknownFieldError, match=r"^lrr=0.5: unknown config field; did you"):
        overlay(Small(), {"lrr": 0.5})
    with pytest.raises(TypeCheckError, match="^flag='yes please': must be true or false$"):
        overlay(Small(), {"flag": "yes please"})


@pytest.mark.parametrize("data, why", [
    (None, "no such file"), (b"- 1\n", "must be a mapping of field: value, got a list"),
    (b"a: [1\n", "not valid YAML at line 2"), (b"a: \xff\n", "not UTF-8 text (byte 0xff"),
])
def test_read_config_file_errors_name_the_file(tmp_path, data, why):
    p = tmp_path / "c.yaml"
    if data is not None:
        p.write_bytes(data)
    with pytest.raises(InputFileError) as e:
        read_config_file(p)
    assert str(e.value).startswith(f"config={str(p)!r}: ") and why in str(e.value)
    p.write_bytes(b"")
    assert read_config_file(p) == {}  # an empty file is an empty mapping
