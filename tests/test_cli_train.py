"""What `klppo train` shows a user: the help, the step rounding, the progress bar."""

import dataclasses
import io

import pytest

from klppo.cli import main
from klppo.cli import train as cli_train
from klppo.cli.train import Progress, announce_rounding


def test_train_help_lists_the_preparser_flags(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    described = [line.split()[:2] for line in out.splitlines() if line.startswith("  --")]
    for flag in (["--preset", "NAME"], ["--config", "FILE.yaml"], ["--resume", "RUN_DIR"]):
        assert flag in described  # its own line, with what it does
    from klppo.rl.presets import PRESETS

    for name in PRESETS:  # every preset is named in the help
        assert name in out


def test_total_steps_rounding_is_announced(tmp_path, capsys):
    from klppo.rl.presets import preset

    cfg = preset("klip/cartpole")  # 4 envs x 128 steps = 512 per iteration
    assert announce_rounding(dataclasses.replace(cfg, total_steps=1024)) is None
    assert main(["train", "--preset", "klip/cartpole", "--total-steps", "1300",
                 "--out", str(tmp_path / "r"), "--no-tensorboard"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == ["note: total_steps 1,300 is not a multiple of num_envs * num_steps = 512: "
                     "the run will do 2 iterations = 1,024 steps"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(text: str) -> str:
    """What a terminal shows on one line: ``\r`` moves to column 0, then characters overwrite
    what was there."""
    row: list[str] = []
    col = 0
    for ch in text:
        if ch == "\r":
            col = 0
            continue
        if col < len(row):
            row[col] = ch
        else:
            row.append(ch)
        col += 1
    return "".join(row).rstrip()


def _metrics(it: int, sps: float, beta: float = 0.0) -> dict:
    return {"iteration": it, "global_step": it * 512, "episode_return_mean": 20.0,
            "kl_rollout": 0.01, "frac_kill": 0.05, "beta": beta, "sps": sps}


def test_progress_bar_leaves_no_characters_behind(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr("sys.stdout", tty)
    monkeypatch.setenv("COLUMNS", "300")
    p = Progress(4, uses_beta=True)
    p(_metrics(1, 123456.0, beta=1.2345))
    p(_metrics(2, 5.0, beta=0.5))  # a shorter line over a longer one
    shown, last = _screen(tty.getvalue()), tty.getvalue().split("\r")[-1].rstrip()
    assert shown == last and "/s/s" not in shown
    assert "beta 0.5 " in shown and "elapsed, ETA" in shown


def test_progress_shows_elapsed_and_eta(monkeypatch):
    clock = iter([100.0, 110.0, 120.0])  # start, after iteration 1, after iteration 2
    monkeypatch.setattr(cli_train.time, "perf_counter", lambda: next(clock))
    p = Progress(4)
    assert p.line(_metrics(1, 50.0)).endswith("0:10 elapsed, ETA 0:30")
    assert p.line(_metrics(2, 50.0)).endswith("0:20 elapsed, ETA 0:20")


def test_progress_eta_counts_only_this_process_iterations(monkeypatch):
    clock = iter([0.0, 10.0])  # a resumed run: 50 iterations were done before
    monkeypatch.setattr(cli_train.time, "perf_counter", lambda: next(clock))
    assert Progress(60).line(_metrics(51, 50.0)).endswith("0:10 elapsed, ETA 1:30")


def test_progress_shows_beta_dash_without_a_controller_beta():
    from klppo.rl.presets import preset

    cfg = preset("klip/cartpole")
    clip = cli_train._progress(dataclasses.replace(cfg, objective="clip"))
    kl = cli_train._progress(dataclasses.replace(cfg, objective="kl_penalty"))
    assert "  beta -  " in clip.line(_metrics(1, 10.0, beta=0.0))
    assert "  beta 0.25  " in kl.line(_metrics(1, 10.0, beta=0.25))
