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


def _metrics(it: int, sps: float, beta: float = 0.0) -> dict:
    return {"iteration": it, "global_step": it * 512, "episode_return_mean": 123.4,
            "kl_rollout": 0.0123, "frac_kill": 0.034, "beta": beta, "sps": sps}


def _clock(*times: float):
    ticks = iter(times)
    return lambda: next(ticks)


def test_progress_line_has_elapsed_and_an_eta_from_the_iterations_after_the_first():
    # start, after iteration 1 (slow: setup), after 2 and 3 (10 s each)
    p = Progress(5, file=io.StringIO(), now=_clock(0.0, 100.0, 110.0, 120.0))
    p(_metrics(1, 50.0))
    p(_metrics(2, 50.0))
    p(_metrics(3, 50.0))
    lines = p.bar.file.getvalue().splitlines()  # not a terminal: a line each (every = 1 here)
    assert lines[0].endswith("elapsed 1:40  ETA -")
    assert lines[1].endswith("elapsed 1:50  ETA 0:30")  # 10 s per iteration, 3 left
    assert lines[2].endswith("elapsed 2:00  ETA 0:20")


def test_progress_eta_counts_only_this_process_iterations():
    p = Progress(60, file=io.StringIO(), now=_clock(0.0, 5.0, 15.0))
    p(_metrics(51, 50.0))  # a resumed run: 50 iterations were done before
    p(_metrics(52, 50.0))
    assert p.bar.eta.parts()[1].forms == ("ETA 1:20",)  # 8 left at 10 s each


def test_progress_lines_off_a_terminal_every_twentieth_and_the_first_and_last():
    p = Progress(100, file=io.StringIO())
    for it in range(1, 101):
        p(_metrics(it, 10.0))
    its = [int(x.split()[1].split("/")[0]) for x in p.bar.file.getvalue().splitlines()]
    assert its == [1, *range(5, 101, 5)]


def test_progress_shows_beta_dash_without_a_controller_beta():
    from klppo.rl.presets import preset

    cfg = preset("klip/cartpole")
    clip = cli_train._progress(dataclasses.replace(cfg, objective="clip"))
    kl = cli_train._progress(dataclasses.replace(cfg, objective="kl_penalty"))
    assert "  beta -  " in clip.line(_metrics(1, 10.0, beta=0.0))
    assert "  beta 0.25  " in kl.line(_metrics(1, 10.0, beta=0.25))


def test_a_sweeps_eta_waits_for_its_first_wave_of_runs():
    """Twelve runs of one group end together: the first eleven lines give no ETA (11 x the
    elapsed time was the old guess), the twelfth 0:00; later waves get the sweep's rate."""
    from klppo.cli.progress import Eta

    clock = iter([0.0, *[100.0 + i * 0.01 for i in range(12)], 200.0])
    eta = Eta(24, now=lambda: next(clock), from_first=False, wave=12)
    lefts = []
    for done in range(1, 13):
        eta.update(done)
        lefts.append(eta.left)
    assert lefts[:11] == [None] * 11 and lefts[11] == pytest.approx(100.11, rel=1e-3)
    eta.update(13)  # 200 s, 13 done: 200 / 13 per run x 11 left
    assert eta.left == pytest.approx(200 / 13 * 11)
    plain = Eta(24, now=iter([0.0, 100.0]).__next__, from_first=False)
    plain.update(1)
    assert plain.left == pytest.approx(100 * 23)  # without a wave: what the sweep used to say
