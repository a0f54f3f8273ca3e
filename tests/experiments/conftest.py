"""Fixtures shared with the lm tests."""

from tests.lm.conftest import tiny_model_dir  # noqa: F401 - a fixture
