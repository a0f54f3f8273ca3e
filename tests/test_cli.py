"""The `klppo` command as a whole: every sub-command is described and every flag has help,
the help text says what the code does, and exit codes come from klppo's error base."""

import argparse
import re
import subprocess
import sys

import pytest

from klppo.cli import PASSTHROUGH, SUBPARSERS, build_parser, main
from klppo.cli.errors import MAX_LINE, FlagError, exit_code, fail, say_error
from klppo.runs.errors import (
    CheckpointError,
    ConfigError,
    InputError,
    KlppoError,
    ResumeError,
    RunFailed,
    UserInputError,
)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_sub_command_is_listed():
    assert set(_subparsers()) == set(PASSTHROUGH) | set(SUBPARSERS)


@pytest.mark.parametrize("name", SUBPARSERS)
def test_every_sub_command_has_a_description_and_every_flag_help(name):
    parser = _subparsers()[name]
    assert parser.description and len(parser.description) > 40, name
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction):
            assert action.help, f"klppo {name} {'/'.join(action.option_strings) or action.dest}"


def _tyro_help(argv: list[str], capsys) -> str:
    """A tyro help page with its box drawing removed and its lines joined."""
    with pytest.raises(SystemExit):
        main(argv)
    text = capsys.readouterr().out
    return " ".join(line.strip(" │╭╮╰╯─") for line in text.splitlines())


def test_train_help_says_which_envs_make_vec_serves_and_names_every_estimator(capsys):
    from klppo.core.loss import KLEstimatorChoice

    text = re.sub(r"\s+", " ", _tyro_help(["train", "--help"], capsys))
    assert "vectorised with gymnasium.make_vec" not in text
    assert "make_vec for CartPole" in text
    helps = text.split("--ppo.kl-estimator", 1)[1].split("--ppo.gamma", 1)[0]
    described = helps.split("}", 1)[1]  # the help after the {choices} list
    for name in KLEstimatorChoice.__args__:
        assert name in described, name


def test_rlhf_help_names_every_estimator(capsys):
    pytest.importorskip("transformers")
    from klppo.lm.config import KLEstimatorLM

    text = re.sub(r"\s+", " ", _tyro_help(["rlhf", "--help"], capsys))
    described = text.split("--kl-estimator", 1)[1].split("}", 1)[1].split(" --", 1)[0]
    for name in KLEstimatorLM.__args__:
        assert name in described, name


@pytest.mark.parametrize("err, code", [
    (RunFailed("run failed"), 1),
    (ConfigError("ppo.lr=-1: must be > 0"), 2),
    (InputError("config.yaml: not YAML"), 2),
    (ResumeError("resume='r': no checkpoint"), 2),
    (CheckpointError("checkpoint.pt: truncated"), 2),
    (FlagError("--workers=0: must be >= 1"), 2),
    (FileNotFoundError("nope"), 2),
    (PermissionError("read-only"), 2),
    (ValueError("a bad value"), 2),
])
def test_exit_codes_come_from_the_error_base(err, code, capsys):
    assert exit_code(err) == code
    assert fail("train", err) == code
    assert capsys.readouterr().err == f"klppo train: {err}\n"


def test_flag_error_is_the_one_user_input_error_of_the_command_line():
    assert issubclass(FlagError, UserInputError) and issubclass(FlagError, KlppoError)
    assert issubclass(FlagError, ValueError)  # callers that caught ValueError still do


def test_say_error_is_one_bounded_line(capsys):
    say_error("sweep", "first line\n  second line")
    say_error("", "no command")
    say_error("report", "x" * 1000)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["klppo sweep: first line second line", "klppo: no command"]
    assert len(lines) == 3 and len(lines[2]) == MAX_LINE and lines[2].endswith("...")


def test_snapshot_refuses_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["snapshot", str(tmp_path / "empty"), str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("klppo snapshot: ")
    assert "no readable run" in err[0]


@pytest.mark.parametrize("module", ["klppo", "klppo.cli"])
def test_python_dash_m_runs_the_command(module):
    proc = subprocess.run([sys.executable, "-m", module, "verify", "--batches", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "verify: OK" in proc.stdout


def test_verify_prints_the_kl_gradient_table(capsys):
    assert main(["verify", "--batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "KL gradients: which KL each estimator x placement x correction descends" in out
    for est in ("k1", "k2", "k3", "abs", "k3_flipped", "tutorial", "full"):
        assert f"\n    {est} " in out
    assert "on_policy            ratio       ratio_grad token_ratio_grad             none" in out
    assert "agrees with enumeration" in out and "verify: OK" in out
    # the TRL GRPO section: TRL's default is reverse per token; GSPO's ratio on the KL neither
    trl = out[out.index("TRL GRPO:"):]
    assert "token                     True                    first   token_ratio_grad     " \
           "reverse    neither" in trl
    assert "sequence                  True                    first   seq_mean_ratio_grad  " \
           "neither    neither" in trl
    # k3 differentiated in the loss, one action: forward on-policy, reverse with the ratio
    block = out[out.index("in the loss (differentiated):"):]
    row = next(line for line in block.splitlines() if line.startswith("    k3 "))
    assert row.split() == ["k3", "forward", "forward", "reverse", "neither"]


def test_verify_fails_when_a_claim_disagrees_with_enumeration(monkeypatch, capsys):
    from klppo.core import kl_gradient_claims as C

    monkeypatch.setitem(C.CLAIMS, (1, "reward", "token", "k3", "on_policy"), "reverse")
    assert main(["verify", "--batches", "2"]) == 1
    out = capsys.readouterr().out
    assert ("MISMATCH k3 in the reward (per token, on-policy, 1 token): claimed reverse, "
            "enumerated neither") in out
    assert "DISAGREES with enumeration" in out and "verify: FAILED" in out


@pytest.mark.parametrize("flags, words", [
    (["--batches", "1000000000"], "--batches=1000000000: must be 1 to 10,000"),
    (["--batches", "0"], "--batches=0: must be 1 to 10,000"),
    (["--seed", "-1"], "--seed=-1: must be in [0,"),
])
def test_verify_bounds_its_work_before_it_starts(flags, words, capsys):
    """(issue #32) 10^9 batches ran for weeks without a word: refused at once, one line."""
    import time

    t = time.perf_counter()
    assert main(["verify", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert time.perf_counter() - t < 5.0  # (an unbounded run took weeks)
