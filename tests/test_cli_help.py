"""Every `klppo` command has a description and every flag a help text that states its default
at most once: the argparse tree (sub-commands, `rlhf compare`) walked action by action, and
the help pages of the commands whose flags come from a config dataclass (tyro), read as a user
sees them."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from klppo.cli import PASSTHROUGH, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _walk(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) for ``parser`` and every sub-parser under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")


def _argparse_parsers():
    from klppo.cli.rlhf_compare import _compare_parser

    yield from _walk(build_parser(), "klppo")
    yield "klppo rlhf compare", _compare_parser()


def test_every_argparse_command_has_a_description_and_every_flag_help():
    seen = []
    for path, parser in _argparse_parsers():
        seen.append(path)
        assert parser.description and len(parser.description) > 30, path
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = "/".join(action.option_strings) or action.dest
            assert action.help and len(action.help) > 10, f"{path} {name}"
        for name, text in _entries(parser.format_help()):
            assert text.count("default") <= 1, f"{path} {name}: {text}"
    assert {"klppo", "klppo sweep", "klppo eval", "klppo rlhf compare"} <= set(seen)
    assert {f"klppo {name}" for name in PASSTHROUGH} <= set(seen)


def _entries(help_text: str) -> list[tuple[str, str]]:
    """(flag, its help) of an argparse help page (indented two spaces, help after two)."""
    out: list[tuple[str, str]] = []
    for line in help_text.splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if m:
            out.append((m.group(1), m.group(2) or ""))
        elif out and re.match(r"^\s{6,}\S", line):
            out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}")
    return out


def _tyro_page(argv: list[str], monkeypatch, capsys) -> tuple[str, list[tuple[str, str]]]:
    """The description and (flags, help) entries of a tyro help page at 100 columns (boxes
    on a terminal, rules elsewhere: an entry is a line that starts with a flag, its help
    follows two spaces or on the lines indented under it)."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    lines = [x.replace("│", " ").rstrip() for x in capsys.readouterr().out.splitlines()]
    first = next(i for i, x in enumerate(lines) if x.strip().startswith("-h, --help"))
    description = " ".join(x.strip() for x in lines[1:first]
                           if x.strip() and not set(x.strip()) <= set("─-╭╮╰╯ ")
                           and not x.strip().endswith("options"))
    entries: list[tuple[str, str, int]] = []
    for line in lines[first:]:
        text, indent = line.strip(), len(line) - len(line.lstrip())
        flag = r"--?[A-Za-z][^ ]*(?: (?!-)[^ ]+)*"  # a flag and its metavar words
        m = re.match(rf"^({flag}(?:, {flag})*)(?:\s{{2,}}(.*))?$", text)
        if m:
            entries.append((m.group(1), m.group(2) or "", indent))
        elif entries and text and indent >= entries[-1][2] + 4:
            flag, help_text, at = entries[-1]
            entries[-1] = (flag, f"{help_text} {text}".strip(), at)
    return description, [(flag, help_text) for flag, help_text, _ in entries]


TYRO_COMMANDS = [["train"], ["rlhf"], ["lm", "pretrain"]]


@pytest.mark.parametrize("argv", TYRO_COMMANDS, ids=" ".join)
def test_every_config_flag_has_help_and_one_default(argv, monkeypatch, capsys):
    if argv[0] in ("rlhf", "lm"):
        pytest.importorskip("transformers")
    description, entries = _tyro_page([*argv, "--help"], monkeypatch, capsys)
    assert len(description) > 30, argv
    assert len(entries) > 8, entries
    for flags, text in entries:
        if flags.startswith("-h"):
            continue
        assert text and not text.startswith("(default"), f"{argv} {flags}: no help"
        assert text.count("default") == 1, f"{argv} {flags}: {text}"


def test_rlhf_uses_train_flag_names_and_keeps_the_old_ones(monkeypatch, capsys):
    pytest.importorskip("transformers")
    from klppo.lm.config import FLAG_ALIASES

    _, entries = _tyro_page(["rlhf", "--help"], monkeypatch, capsys)
    shown = {flags.split()[0]: flags for flags, _ in entries}
    for old, canonical in FLAG_ALIASES.items():
        assert f"--{canonical}" in shown, canonical  # listed first, under train's name
        assert f"--{old.replace('_', '-')}" in shown[f"--{canonical}"]  # the alias next to it
    for name in ("--ppo.lr", "--kl.controller", "--kl.target", "--ppo.update-epochs",
                 "--ppo.gae-lambda", "--ppo.kl-estimator"):
        assert name in shown
    _, train = _tyro_page(["train", "--help"], monkeypatch, capsys)
    train_flags = {f for flags, _ in train for f in re.findall(r"--[\w.-]+", flags)}
    for canonical in FLAG_ALIASES.values():
        if canonical != "kl.monitor-warmup":  # rlhf's own: a KL to a reference ramps up
            assert f"--{canonical}" in train_flags, canonical


def test_old_and_new_rlhf_flag_names_give_the_same_config():
    pytest.importorskip("transformers")
    from klppo.cli.flags import parse_config_flags
    from klppo.lm.config import RLHFConfig

    old = parse_config_flags(RLHFConfig, ["--lr", "0.001", "--controller", "fixed", "--lam",
                                          "0.9", "--ppo-epochs", "2"], "klppo rlhf")
    new = parse_config_flags(RLHFConfig, ["--ppo.lr", "0.001", "--kl.controller", "fixed",
                                          "--ppo.gae-lambda", "0.9", "--ppo.update-epochs", "2"],
                             "klppo rlhf")
    assert old == new and new.lr == 0.001 and new.lam == 0.9 and new.ppo_epochs == 2


def test_version_is_the_package_version():
    import klppo

    res = subprocess.run([sys.executable, "-m", "klppo", "--version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith(f"klppo {klppo.__version__} (python ")
