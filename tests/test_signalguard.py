"""Ctrl-C and SIGTERM stop the test suite at once, even while a test trains in-process (where
klppo's own handlers would otherwise turn the signal into a graceful stop of that run only)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SUITE = textwrap.dedent("""
    from pathlib import Path

    from klppo.rl.config import TrainConfig
    from klppo.rl.trainer import train

    MARK = Path(__file__).with_name("marks")

    def test_trains_in_process(tmp_path):
        def started(m):
            with MARK.open("a") as f:
                f.write(f"iteration {m['iteration']}\\n")
        cfg = TrainConfig(env="CartPole-v1", total_steps=10**7, out=str(tmp_path / "run"),
                          tensorboard=False)
        train(cfg, on_iteration=started)

    def test_after():
        MARK.open("a").write("the suite went on\\n")
""")


def _run_and_signal(tmp_path: Path, sig: int) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.signalguard"]\n')
    (tmp_path / "test_long.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                             "-p", "no:cacheprovider", str(tmp_path / "test_long.py")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    marks = tmp_path / "marks"
    deadline = time.monotonic() + 120
    while not (marks.exists() and "iteration 2" in marks.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    sent = time.monotonic()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30, "the suite took too long to stop"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), marks.read_text()


def test_ctrl_c_stops_the_suite_during_in_process_training(tmp_path):
    done, marks = _run_and_signal(tmp_path, signal.SIGINT)
    assert "the suite went on" not in marks
    assert done.returncode in (2, 130), done.stdout  # pytest's own Ctrl-C status, or 128 + 2
    assert "KeyboardInterrupt" in done.stdout or "stopped by SIGINT" in done.stdout


def test_sigterm_stops_the_suite_during_in_process_training(tmp_path):
    done, marks = _run_and_signal(tmp_path, signal.SIGTERM)
    assert "the suite went on" not in marks
    assert done.returncode == -signal.SIGTERM, done.stdout  # ended by the signal itself


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_the_test_sends_itself_reaches_klppo(sig):
    from klppo.runs.signals import StopRequest
    from tests.signalguard import send_self

    with StopRequest() as stop:
        send_self(sig)
    assert stop.requested and stop.signum == sig
