"""Ctrl-C and SIGTERM stop the test suite at once, even while a test trains in-process.

klppo's loops install SIGINT / SIGTERM handlers that ask for a graceful stop (finish the
iteration, checkpoint, return). Inside ``pytest`` that would turn a Ctrl-C into one failed test
and let the suite go on. This plugin (loaded by ``tests/conftest.py``) wraps every Python handler
installed for those two signals while tests run: a signal a test sends itself with
:func:`send_self` reaches the handler as usual; any other one stops pytest -- SIGINT as pytest's
own KeyboardInterrupt (and, should the code under test catch it, :func:`pytest.exit` with status
130 right after the test), SIGTERM by the default action (the process ends with status 143).
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

GUARDED = (signal.SIGINT, signal.SIGTERM)
_real_signal = signal.signal
_expected = {int(s): 0 for s in GUARDED}  # signals a test announced with send_self
_external: list[int] = []  # signals from outside, in order of arrival


def send_self(sig: int) -> None:
    """Send ``sig`` to this process as a test that exercises klppo's own handling of it."""
    _expected[int(sig)] += 1
    os.kill(os.getpid(), sig)


def _stop(signum: int) -> None:
    _external.append(signum)
    if signum == signal.SIGTERM:  # as if no handler were installed: the process ends now
        _real_signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    raise KeyboardInterrupt


def guard(handler: Any) -> Any:
    """``handler`` wrapped so that only announced signals reach it (others stop the suite)."""
    if not callable(handler) or getattr(handler, "_klppo_guarded", False) \
            or handler is signal.default_int_handler:
        return handler

    @functools.wraps(handler)
    def guarded(signum: int, frame: Any) -> Any:
        if _expected.get(signum, 0) > 0:
            _expected[signum] -= 1
            return handler(signum, frame)
        return _stop(signum)

    guarded._klppo_guarded = True  # type: ignore[attr-defined]
    return guarded


def _signal(sig: int, handler: Callable[..., Any] | int | None) -> Any:
    return _real_signal(sig, guard(handler) if sig in GUARDED else handler)


def pytest_configure(config: pytest.Config) -> None:
    signal.signal = _signal  # type: ignore[assignment]


def pytest_unconfigure(config: pytest.Config) -> None:
    signal.signal = _real_signal


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    yield
    if _external:  # the code under test caught the KeyboardInterrupt: stop here all the same
        sig = signal.Signals(_external[0])
        pytest.exit(f"stopped by {sig.name}", returncode=128 + sig.value)
