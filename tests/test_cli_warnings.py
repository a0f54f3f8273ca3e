"""Numeric warnings are folded into a command's one line, never printed on lines of their own."""

import warnings

import numpy as np
import pytest

from klppo.cli.progress import NumericWarnings, one_line_warnings
from klppo.core.kl_gradient_claims import KLGradientWarning


def test_numeric_warnings_are_collected_once_and_folded(capsys):
    with NumericWarnings() as numeric:
        for _ in range(3):
            np.exp(np.float64(1000.0))
        np.log(np.float64(-1.0))
    assert capsys.readouterr().err == ""
    assert numeric == ["overflow encountered in exp", "invalid value encountered in log"]
    assert numeric.suffix() == (" (numeric warnings: overflow encountered in exp; invalid value "
                                "encountered in log)")


def test_other_warnings_are_shown_as_usual():
    with pytest.warns(UserWarning, match="a user warning"), NumericWarnings() as numeric:
        warnings.warn("a user warning", UserWarning, stacklevel=1)
    assert numeric == [] and numeric.suffix() == ""


def test_klppo_warnings_are_one_line_like_the_log(capsys):
    with warnings.catch_warnings(), one_line_warnings():
        warnings.simplefilter("always")
        warnings.warn("k3 in the loss: forward", KLGradientWarning, stacklevel=1)
        with pytest.warns(UserWarning, match="a user warning"):  # others: as usual
            warnings.warn("a user warning", UserWarning, stacklevel=1)
    assert capsys.readouterr().err == "WARNING KLGradientWarning: k3 in the loss: forward\n"
