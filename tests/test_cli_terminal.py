"""One terminal experience: the progress bar fitted to the terminal's width, lines printed while
it is live on their own line, and a signal's exit status and resume command, checked on a
real `klppo train` in a pseudo-terminal."""

import io
import json
import logging
import os
import pty
import signal
import subprocess
import sys
import threading
from pathlib import Path

from klppo.cli.progress import Bar, Part, StderrHandler, layout
from klppo.cli.train import Progress
from tests.terminal import screen
from tests.waiting import wait_for_lines

ROOT = Path(__file__).resolve().parents[1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _single(it: int) -> dict:
    return {"iteration": it, "global_step": it * 512, "episode_return_mean": 123.4,
            "kl_rollout": 0.0123, "frac_kill": 0.034, "beta": 0.0123, "sps": 12345.0}


def _multi(it: int) -> dict:
    m = {"iteration": it, "global_step": it * 512, "sps": 12345.0}
    for p in ("adversary", "agent"):
        m.update({f"{p}/episode_return_mean": -12.3, f"{p}/kl_rollout": 0.0123,
                  f"{p}/beta": 0.5})
    return m


def _shown(columns: int, metrics, monkeypatch) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    tty = _Tty()
    p = Progress(195, file=tty, now=iter([0.0, 1.0, 2.0]).__next__)
    p(metrics(12))
    p(metrics(13))
    p.close()
    return screen(tty.getvalue())


def test_train_bar_keeps_kill_beta_steps_per_second_and_eta_at_80_columns(monkeypatch):
    lines = _shown(80, _single, monkeypatch)
    assert len(lines) == 1 and len(lines[0]) < 80, lines
    bar = lines[0]
    for field in ("13/195", "kill 0.034", "beta 0.0123", "12,345 steps/s", "ETA 3:02",
                  "123.4", "kl 0.0123"):
        assert field in bar, (field, bar)


def test_wide_terminal_shows_every_field_and_the_bar(monkeypatch):
    bar = _shown(200, _single, monkeypatch)[0]
    assert "━" in bar and "step 6,656" in bar and "elapsed 0:02" in bar
    assert bar.index("━") < bar.index("iter")


def test_multi_agent_bar_keeps_each_policy_beta_at_80_columns(monkeypatch):
    bar = _shown(80, _multi, monkeypatch)[0]
    assert len(bar) < 80
    for field in ("adversary: beta 0.5", "agent: beta 0.5", "steps/s", "ETA"):
        assert field in bar, (field, bar)


def test_narrow_terminal_drops_the_least_important_fields_first(monkeypatch):
    bar = _shown(40, _single, monkeypatch)[0]
    assert len(bar) < 40 and "ETA 3:02" in bar and "steps/s" in bar and "return" not in bar


def test_layout_shortens_then_drops_by_priority():
    parts = [Part.of(5, "alpha 1", "a 1"), Part.of(1, "beta 2"), Part.of(9, "gamma 3")]
    assert layout(parts, 100) == (0, "alpha 1  beta 2  gamma 3")
    assert layout(parts, 22) == (0, "alpha 1 beta 2 gamma 3")  # single spaces first
    assert layout(parts, 20) == (0, "alpha 1  gamma 3")  # then the lowest priority goes
    assert layout(parts, 12) == (0, "a 1  gamma 3")  # then a shorter form
    assert layout(parts, 7) == (0, "gamma 3")
    assert layout(parts, 3) == (0, "")
    width, text = layout(parts, 60, bar_priority=3)
    assert text == "alpha 1  beta 2  gamma 3" and width == 30  # the bar takes the rest, <= 30
    assert layout(parts, 30, bar_priority=3) == (13, "alpha 1  gamma 3")  # beta ranks below
    kept = [Part.of(5, "alpha 1"), Part.of(4, "beta 2"), Part.of(9, "gamma 3")]
    assert layout(kept, 30, bar_priority=3) == (0, "alpha 1  beta 2  gamma 3")  # the bar goes


def test_a_warning_while_the_bar_is_live_gets_a_line_of_its_own(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    tty = _Tty()
    log = logging.getLogger("klppo.test.terminal")
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.propagate = False
    try:
        with Bar(10, file=tty) as bar:
            bar.update(1, [Part.of(9, "first")])
            log.warning("SIGINT: finishing this iteration")
            bar.update(2, [Part.of(9, "second")])
    finally:
        log.removeHandler(handler)
    lines = screen(tty.getvalue())
    assert "WARNING klppo.test.terminal: SIGINT: finishing this iteration" in lines
    # the warning above, the bar (redrawn in place) last: one bar line, its latest text
    assert lines.index("WARNING klppo.test.terminal: SIGINT: finishing this iteration") == 0
    assert len(lines) == 2 and "second" in lines[1] and "ETA" in lines[1]


def _train_argv(run: Path) -> list[str]:
    return [sys.executable, "-m", "klppo", "train", "--preset", "klip/cartpole",
            "--total-steps", "1024000", "--out", str(run), "--no-tensorboard",
            "--checkpoint-every", "1000"]


def test_ctrl_c_on_a_terminal_leaves_clean_lines_exit_130_and_the_resume_command(tmp_path):
    """A real `klppo train` on a pseudo-terminal of 80 columns: SIGINT's warning is on its own
    line (not glued to the bar), `run directory:` too, the resume command is printed and the
    exit status is 130."""
    run = tmp_path / "run"
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "LINES": "24", "TERM": "xterm-256color",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(_train_argv(run), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for_lines(run / "metrics.jsonl", 3)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=30)
        os.close(master)
    lines = screen(b"".join(chunks).decode("utf-8", "replace"))
    warning = [x for x in lines if "SIGINT: finishing this iteration" in x]
    assert rc == 130, lines
    assert len(warning) == 1 and warning[0].startswith("WARNING "), lines
    assert f"run directory: {run}" in lines
    hint = [x for x in lines if x.startswith("stopped by SIGINT after iteration")]
    assert hint and hint[0].endswith(f"resume with: klppo train --resume {run}"), lines
    bars = [x for x in lines if "steps/s" in x]
    assert bars and all(len(x) < 80 and "kill" in x and "beta" in x and "ETA" in x
                        for x in bars), bars
    assert json.loads((run / "status.json").read_text())["state"] == "interrupted"


def test_sigterm_exits_143_with_the_resume_command(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(_train_argv(run), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_lines(run / "metrics.jsonl", 3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "status: interrupted" in out
    assert "stopped by SIGTERM after iteration " in out
    assert out.rstrip().endswith(f"resume with: klppo train --resume {run}")
    assert "SIGTERM: finishing this iteration" in err
