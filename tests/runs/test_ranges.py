"""One range checker for every config: ranges live in the fields' metadata."""

import math
from dataclasses import dataclass, field

import pytest

from klppo.runs.errors import ConfigError
from klppo.runs.ranges import above, at_least, below, check_ranges, within


@dataclass
class Inner:
    gamma: float = field(default=0.9, metadata=within(0, 1))


@dataclass
class Outer:
    n: int = field(default=1, metadata=at_least(1))
    lr: float = field(default=0.1, metadata=above(0))
    cap: float | None = field(default=None, metadata=above(0))
    seed: int = field(default=0, metadata=below(2**32))
    inner: Inner = field(default_factory=Inner)


@pytest.mark.parametrize("changes, message", [
    ({"n": 0}, "n=0: must be an integer >= 1"),
    ({"n": 2.0}, "n=2.0: must be an integer >= 1"),
    ({"n": True}, "n=True: must be an integer >= 1"),
    ({"lr": 0.0}, "lr=0.0: must be finite and > 0"),
    ({"lr": math.inf}, "lr=inf: must be finite and > 0"),
    ({"lr": math.nan}, "lr=nan: must be finite and > 0"),
    ({"cap": -1.0}, "cap=-1.0: must be finite and > 0 (or unset)"),
    ({"seed": 2**32}, "seed=4294967296: must be an integer in [0, 4.29497e+09)"),
    ({"inner": Inner(gamma=1.5)}, "inner.gamma=1.5: must be in [0, 1]"),
])
def test_a_value_out_of_its_fields_range_is_named(changes, message):
    with pytest.raises(ConfigError) as e:
        check_ranges(Outer(**changes))
    assert str(e.value) == message


def test_values_in_range_and_unset_optionals_pass():
    check_ranges(Outer(n=3, lr=1e-9, cap=None, seed=2**32 - 1, inner=Inner(gamma=0.0)))
