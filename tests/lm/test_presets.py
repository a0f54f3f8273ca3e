"""``klppo rlhf --preset``: each preset is the config of an arm of a committed study, and the
command line layers a config file and flags over it."""

from pathlib import Path

import pytest
import yaml

from klppo.cli import main
from klppo.lm.config import RLHFConfig
from klppo.lm.presets import RLHF_PRESETS, preset_values, rlhf_preset

ROOT = Path(__file__).resolve().parents[2]
#: preset -> the committed config.yaml of the study arm it is
ARMS = {"smollm2": "docs/results/rlhf-smollm2-pid/adaptive_from_weak__0.config.yaml"}


def test_every_preset_names_a_committed_arm():
    assert set(ARMS) == set(RLHF_PRESETS)
    for name, (_, study) in RLHF_PRESETS.items():
        assert (ROOT / study / "README.md").is_file()
        assert ARMS[name].startswith(study + "/")


@pytest.mark.parametrize("name", sorted(RLHF_PRESETS))
def test_a_preset_is_its_study_arm_field_by_field(name):
    """Every field of the arm's config (the run's own config.yaml) but where it was written
    and its seed is the preset's: the preset runs what the study measured."""
    arm = yaml.safe_load((ROOT / ARMS[name]).read_text())
    cfg = rlhf_preset(name)
    assert arm.pop("kind") == "rlhf"
    arm.pop("out"), arm.pop("seed")
    differ = {k: (v, getattr(cfg, k)) for k, v in arm.items() if getattr(cfg, k) != v}
    assert not differ
    # and the preset sets each of its fields to something other than the default
    assert all(getattr(RLHFConfig(), k) != v for k, v in preset_values(name).items())


def test_flags_and_a_config_file_go_over_the_preset(tmp_path):
    from klppo.cli.rlhf import _rlhf_config

    cfg = _rlhf_config("smollm2", None, [])
    assert cfg == rlhf_preset("smollm2")
    cfg = _rlhf_config("smollm2", None, ["--ppo.lr", "2e-5", "--kl.target", "4"])
    assert (cfg.lr, cfg.target, cfg.controller, cfg.model) == (2e-5, 4.0, "pid", "smollm2")
    (tmp_path / "c.yaml").write_text("batch_size: 8\ncontroller: proportional\n")
    cfg = _rlhf_config("smollm2", str(tmp_path / "c.yaml"), ["--batch-size", "4"])
    assert (cfg.batch_size, cfg.controller, cfg.lr) == (4, "proportional", 1e-5)


def test_rlhf_help_with_a_preset_shows_its_values(capsys):
    pytest.importorskip("transformers")
    with pytest.raises(SystemExit) as e:
        main(["rlhf", "--preset", "smollm2", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: smollm2)" in out and "(default: pid)" in out


def test_compare_arms_from_a_preset(tmp_path, monkeypatch):
    """``klppo rlhf compare --preset smollm2``: every arm is the preset but for its controller
    and beta; its flags and ``--set`` go over the preset."""
    from klppo.cli import rlhf_compare as C

    monkeypatch.setattr("klppo.lm.model.check_model_dir", lambda *a, **k: None)
    out = str(tmp_path / "cmp")
    arms = C._compare_configs(C._compare_parser().parse_args(
        ["--preset", "smollm2", "--out", out, "--seeds", "0", "1"]))
    assert len(arms) == 8
    p = rlhf_preset("smollm2")
    for name, cfg in arms.items():
        kind = name.split("_")[0]
        assert cfg.controller == ("fixed" if kind == "fixed" else "pid"), name
        assert cfg.beta == (2.0 if "strong" in name else 0.04)
        assert (cfg.model, cfg.lr, cfg.batch_size, cfg.target, cfg.iterations,
                cfg.checkpoint_every) == ("smollm2", 1e-5, 16, 3.0, 64, 8)
    assert arms["adaptive_from_weak__0"] == p
    arms = C._compare_configs(C._compare_parser().parse_args(
        ["--preset", "smollm2", "--out", out, "--iterations", "8", "--adaptive",
         "proportional", "--target", "2", "--set", "lr=3e-5"]))
    cfg = arms["adaptive_from_weak__0"]
    assert (cfg.iterations, cfg.controller, cfg.target, cfg.lr, cfg.batch_size) == \
        (8, "proportional", 2.0, 3e-5, 16)


def test_a_named_pretrained_model_at_the_austen_lr_is_warned_about(caplog):
    """``--model smollm2`` with the defaults' lr 1e-4, at which its KL ran away: one warning
    naming the lr and the preset; none with the preset's lr, none for the Austen model."""
    import logging

    from klppo.lm.setup import say_what_the_choices_mean

    def warned(**kw) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="klppo"):
            say_what_the_choices_mean(RLHFConfig(**kw))
        return [r.getMessage() for r in caplog.records if "lr=" in r.getMessage()]

    got = warned(model="smollm2")
    assert len(got) == 1 and "lr=0.0001 on model smollm2" in got[0]
    assert "--preset smollm2" in got[0] and "docs/results/rlhf-smollm2-pid" in got[0]
    assert warned(model="smollm2", lr=1e-5) == []
    assert warned(model="runs/lm/base") == []
