"""The README and the pages that teach (the guide, the tutorials, the install page) work as
written: each python block runs on its own (in a directory where `runs/cp`, the tutorials'
first run, exists when the block uses it), each `klppo ...` line in a bash block parses (the
cheap ones run), and the files it names exist."""

import re
import shlex
from pathlib import Path

import pytest

from klppo.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
#: the Markdown whose code must run: the README and the pages that teach
PAGES = [ROOT / "README.md", ROOT / "docs" / "guide.md", ROOT / "docs" / "install.md",
         *sorted((ROOT / "docs" / "tutorials").glob("*.md"))]
README = "\n".join(p.read_text() for p in PAGES)

#: top-level modules of optional extras: a block that needs a missing one is skipped
EXTRAS = {"transformers", "tokenizers", "vaderSentiment", "ray", "wandb", "mujoco", "Box2D",
          "torchrl", "tensordict", "tensorboard", "onnx", "onnxscript", "onnxruntime",
          "moviepy"}


def _blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _commands(text: str = README) -> list[tuple[str, list[str], dict[str, str]]]:
    """``(line, argv after 'klppo', heredoc files written earlier in the block)`` for every
    `klppo` line of the bash blocks of ``text`` (continuations joined, comments dropped)."""
    out = []
    for block in _blocks("bash", text):
        lines, files, i = block.splitlines(), {}, 0
        while i < len(lines):
            line = lines[i]
            heredoc = re.match(r"cat > (\S+) <<'?(\w+)'?$", line.strip())
            if heredoc:
                end = lines.index(heredoc.group(2), i + 1)
                files[heredoc.group(1)] = "\n".join(lines[i + 1:end]) + "\n"
                i = end + 1
                continue
            while line.endswith("\\"):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            words = shlex.split(line, comments=True)
            while words and re.match(r"^[A-Z_]+=", words[0]):  # RAY_ADDRESS=auto klppo ...
                words.pop(0)
            if words and words[0] == "klppo":
                out.append((line.split("#")[0].strip(), words[1:], dict(files)))
    return out


PY_BLOCKS = _blocks("python")
COMMANDS = _commands()


def test_readme_has_blocks_and_commands():
    assert len(PY_BLOCKS) >= 4 and len(COMMANDS) >= 20
    assert {argv[0] for _, argv, _ in COMMANDS} >= {"train", "sweep", "report", "replay", "lm",
                                                    "rlhf"}


@pytest.mark.parametrize("code", PY_BLOCKS, ids=[f"block{i + 1}" for i in range(len(PY_BLOCKS))])
def test_readme_python_block_runs_on_its_own(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for run in ("runs/cp", "runs/readme-cp"):  # the first run of the tutorials, of the README
        if run in code:
            import dataclasses

            from klppo import rl

            rl.train(dataclasses.replace(rl.preset("klip/cartpole"), total_steps=1024,
                                         out=run, tensorboard=False))
    try:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})  # a fresh namespace
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in EXTRAS:
            pytest.skip(f"needs the optional {e.name} package")
        raise


def _check_train(argv: list[str]) -> None:
    from klppo.cli.train import parse_train

    parsed = parse_train(argv)
    if "--marl.overrides" in argv:  # each policy's config is checked against the env's agents
        pytest.importorskip("pettingzoo")
        from klppo.rl.marl.spec import check_multiagent

        check_multiagent(parsed)
    if "--resume" in argv:
        run_dir = getattr(parsed, "run_dir", parsed)  # a Resume with --total-steps
        assert run_dir == argv[argv.index("--resume") + 1]
    elif "--ppo.lr" in argv:  # flags win over the --config file
        assert parsed.ppo.lr == float(argv[argv.index("--ppo.lr") + 1])


def _check_argparse(argv: list[str], capsys) -> None:
    from klppo.cli.sweep import spec_from_args
    from klppo.experiments.sweep import expand
    from klppo.replay.lab import parse_controller

    args = build_parser().parse_args(argv)
    if argv[0] == "sweep":
        assert expand(spec_from_args(args))
    elif argv[0] == "tune":
        from klppo.experiments.tune_spec import load_tune_spec

        assert load_tune_spec(args.spec).params()
    elif argv[0] == "replay" and args.closed_loop:
        assert main(argv) == 0  # cheap: run it
        assert Path(args.out, "replay.png").exists()
    elif argv[0] == "replay":
        for spec in args.controller:
            parse_controller(spec, 0.02)


def _check_lm(argv: list[str]) -> None:
    pytest.importorskip("transformers")
    from klppo.cli import rlhf as cli_rlhf
    from klppo.cli import rlhf_compare
    from klppo.cli.flags import parse_config_flags

    if argv[:2] == ["lm", "pretrain"]:
        from klppo.lm.pretrain import PretrainConfig, validate_pretrain

        validate_pretrain(parse_config_flags(PretrainConfig, argv[2:], "klppo lm pretrain"))
    elif argv[:2] == ["rlhf", "compare"]:
        rlhf_compare._compare_parser().parse_args(argv[2:])
    else:
        known, rest = cli_rlhf._pre_parser().parse_known_args(argv[1:])
        if known.resume is not None:
            assert not rest and known.config is None and known.preset is None
            return
        cli_rlhf._rlhf_config(known.preset, known.config, rest)


@pytest.mark.parametrize("line, argv, files", COMMANDS, ids=[c[0][:70] for c in COMMANDS])
def test_readme_klppo_line_parses(line, argv, files, tmp_path, monkeypatch, capsys):
    """Parsed as the command would parse it (files the README writes with a heredoc are
    written first; ``examples/`` is the repository's); `--help` and cheap commands run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    if "--help" in argv:
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        assert rc in (0, None) and "--" in capsys.readouterr().out
    elif argv[0] == "train":
        _check_train(argv[1:])
    elif argv[0] in ("lm", "rlhf"):
        _check_lm(argv)
    else:
        _check_argparse(argv, capsys)


def test_verify_command_passes_and_prints_checks(capsys):
    assert main(["verify", "--batches", "20"]) == 0
    out = capsys.readouterr().out
    assert "Theorem 1" in out and "Theorem 2" in out and "verify: OK" in out
    assert "step(rllib)" in out and "pid" in out
