"""Every bad input to ``klppo train`` is one line naming the field or file and the value, exit
code 2, no traceback, and no run directory (issue: trust everywhere)."""

import os
from pathlib import Path

import pytest

from klppo.cli import main

GOOD = ["--preset", "klip/cartpole", "--total-steps", "1024", "--no-tensorboard"]

#: name -> (flags after GOOD, text the message must contain). ``{d}`` is a scratch directory.
FLAGS = {
    "lr_not_a_number": (["--ppo.lr", "fast"], "--ppo.lr"),
    "lr_zero": (["--ppo.lr", "0"], "ppo.lr=0.0"),
    "lr_negative": (["--ppo.lr", "-1"], "ppo.lr=-1.0"),
    "lr_nan": (["--ppo.lr", "nan"], "ppo.lr=nan"),
    "lr_inf": (["--ppo.lr", "inf"], "ppo.lr=inf"),
    "seed_negative": (["--seed", "-1"], "seed=-1"),
    "seed_too_large": (["--seed", str(2**40)], "seed="),
    "total_steps_zero": (["--total-steps", "0"], "total_steps=0"),
    "total_steps_negative": (["--total-steps", "-5"], "total_steps=-5"),
    "total_steps_below_one_rollout": (["--total-steps", "10"], "total_steps=10"),
    "minibatch_not_dividing": (["--ppo.minibatch-size", "3"], "ppo.minibatch_size=3"),
    "update_epochs_zero": (["--ppo.update-epochs", "0"], "ppo.update_epochs=0"),
    "num_envs_zero": (["--rollout.num-envs", "0"], "rollout.num_envs=0"),
    "checkpoint_every_zero": (["--checkpoint-every", "0"], "checkpoint_every=0"),
    "torch_threads_zero": (["--torch-threads", "0"], "torch_threads=0"),
    "gamma_above_one": (["--ppo.gamma", "1.5"], "ppo.gamma=1.5"),
    "eps_negative": (["--ppo.eps", "-0.1"], "ppo.eps=-0.1"),
    "clip_obs_zero": (["--rollout.clip-obs", "0"], "rollout.clip_obs=0.0"),
    "dual_clip_below_one": (["--ppo.dual-clip", "0.5"], "ppo.dual_clip=0.5"),
    "soft_shape_without_softness": (["--objective", "per_sample_kl", "--ppo.shape", "sigmoid"],
                                    "ppo.softness=None"),
    "unknown_shape": (["--ppo.shape", "wobbly"], "'wobbly' for argument '--ppo.shape'"),
    "unknown_objective": (["--objective", "nope"],
                          "invalid choice 'nope' for argument '--objective'"),
    "early_stop_without_target": (["--ppo.early-stop", "minibatch"], "ppo.early_stop"),
    "rollout_measure_at_minibatch": (["--kl.cadence", "minibatch"], "kl.measure='rollout'"),
    "negative_beta": (["--objective", "kl_penalty", "--kl.beta", "-1"], "beta"),
    "zero_hidden_layer": (["--net.hidden", "0"], "net.hidden=(0,)"),
    "separate_losses_without_trunk": (["--net.separate-losses"], "net.separate_losses"),
    "unknown_flag": (["--nonsense", "3"], "--nonsense"),
    "unknown_env": (["--env", "CartPol-v1"], "did you mean CartPole-v1"),
    "unknown_env_module": (["--env", "no_such_module_xyz:Foo-v0"], "no_such_module_xyz"),
    "unknown_preset": (["--preset", "klip/nope"], "preset='klip/nope'"),
    "shape_with_clip": (["--objective", "clip", "--ppo.shape", "spo"], "ppo.shape='spo'"),
    "softness_with_clip": (["--objective", "clip", "--ppo.softness", "0.1"],
                           "ppo.softness=0.1: only per_sample_kl"),
    "controller_without_beta": (["--objective", "clip", "--kl.controller", "pid",
                                 "--kl.target", "0.01"], "kl.controller='pid'"),
    "update_epochs_huge": (["--ppo.update-epochs", "1000000000"], "ppo.update_epochs="),
    "preset_empty": (["--preset", ""], "argument --preset: '' is not a name"),
    "env_module_empty": (["--env", ":"], "env=':': expected MODULE:ID"),
    "fullwidth_digits": (["--total-steps", "１０２４"], "must be written with ASCII digits"),
    "arabic_indic_digits": (["--ppo.lr", "٠.٠٠٣"], "must be written with ASCII digits"),
    "dual_clip_without_band": (["--objective", "kl_penalty", "--ppo.dual-clip", "3"],
                               "ppo.dual_clip=3.0: objective='kl_penalty' has no clip band"),
    # the trust-region catalogue (issue 21): sequence-level objectives, settings it ignores
    "sequence_level_objective": (["--objective", "gspo"], "objective='gspo': is sequence-level"),
    # stale rollouts (issue 30): settings nothing reads, a staleness the network cannot take
    "correction_without_staleness": (["--ppo.mismatch-correction", "tis"],
                                     "ppo.mismatch_correction='tis': only ppo.staleness > 0"),
    "icepop_bounds_inverted": (["--ppo.staleness", "2", "--ppo.mismatch-correction", "icepop",
                                "--ppo.mismatch-upper", "0.3"],
                               "ppo.mismatch_upper=0.3: must be above the lower bound 0.5"),
    "correction_with_topr": (["--objective", "topr", "--ppo.staleness", "1",
                              "--ppo.mismatch-correction", "mis"],
                             "objective='topr' takes its ratio to the sampling policy"),
    "staleness_with_shared_trunk": (["--ppo.staleness", "1", "--net.shared-trunk"],
                                    "ppo.staleness=1: needs net.shared_trunk false"),
    "knob_the_objective_ignores": (["--objective", "clip", "--ppo.tau-pos", "2"],
                                   "ppo.tau_pos=2.0: objective='clip' would ignore it"),
    "band_edge_the_objective_ignores": (["--objective", "cispo", "--ppo.dual-clip", "3"],
                                        "ppo.dual_clip=3.0: objective='cispo' does not read"),
    "cov_window_inverted": (["--objective", "clip_cov", "--ppo.cov-low", "6"],
                            "ppo.cov_low=6.0: must be below ppo.cov_high=5.0"),
    "cov_fraction_zero": (["--objective", "kl_cov", "--ppo.cov-fraction", "0"],
                          "ppo.cov_fraction=0.0: must be in (0, 1]"),
    "probability_objective_on_box_actions": (["--env", "Pendulum-v1", "--objective", "dppo_kl"],
                                             "reads exp(logp) as a probability"),
    "target_kl_without_early_stop": (["--ppo.target-kl", "0.01"],
                                     "ppo.target_kl=0.01: only the KL early stop reads it"),
    # the lr / clip actuators (issue 21): unknown, ignored or at odds with another field
    "actuator_unknown": (["--kl.actuator", "speed"], "'speed' for argument '--kl.actuator'"),
    "actuator_lr_with_schedule": (["--kl.actuator", "lr"],
                                  "ppo.anneal_lr=True: kl.actuator=lr sets the learning rate"),
    "actuator_with_controller": (["--objective", "kl_penalty", "--kl.actuator", "lr",
                                  "--ppo.no-anneal-lr", "--kl.controller", "step"],
                                 "kl.controller='step': with kl.actuator=lr"),
    "actuator_with_cadence": (["--kl.actuator", "clip", "--kl.cadence", "epoch"],
                              "kl.cadence='epoch': sets the beta controller's timing"),
    "actuator_clip_without_band": (["--objective", "kl_penalty", "--kl.actuator", "clip"],
                                   "kl.actuator='clip': objective='kl_penalty' has no clip band"),
    "actuator_clip_asymmetric": (["--kl.actuator", "clip", "--ppo.eps-high", "0.28"],
                                 "ppo.eps_high=0.28: kl.actuator=clip moves the symmetric"),
    "actuator_lr_outside_bounds": (["--kl.actuator", "lr", "--ppo.no-anneal-lr", "--ppo.lr",
                                    "0.05"], "ppo.lr=0.05: kl.actuator=lr keeps it in"),
    "actuator_bounds_crossed": (["--kl.actuator", "lr", "--ppo.no-anneal-lr", "--kl.actuator-min",
                                 "0.01", "--kl.actuator-max", "0.001"], "kl.actuator_min=0.01"),
    "actuator_min_negative": (["--kl.actuator", "lr", "--ppo.no-anneal-lr", "--kl.actuator-min",
                               "-1"], "kl.actuator_min=-1.0"),
    "actuator_rule_without_actuator": (["--kl.actuator-rule", "rl_games"],
                                       "kl.actuator_rule='rl_games': only the lr and clip"),
    "actuator_max_without_actuator": (["--kl.actuator-max", "0.01"],
                                      "kl.actuator_max=0.01: only the lr and clip"),
    # BAPO's clip-bound controller (issue 21): unknown, ignored or at odds with another field
    "band_controller_unknown": (["--ppo.band-controller", "wide"],
                                "'wide' for argument '--ppo.band-controller'"),
    "bapo_objective": (["--ppo.band-controller", "bapo", "--objective", "cispo"],
                       "objective='cispo': ppo.band_controller=bapo balances"),
    "bapo_eps_high": (["--ppo.band-controller", "bapo", "--ppo.eps-high", "0.28"],
                      "ppo.eps_high=0.28: ppo.band_controller=bapo sets both band edges"),
    "bapo_with_clip_actuator": (["--ppo.band-controller", "bapo", "--kl.actuator", "clip"],
                                "kl.actuator='clip': ppo.band_controller=bapo already moves"),
    "bapo_low_inverted": (["--ppo.band-controller", "bapo", "--ppo.bapo-low", "0.9", "0.6"],
                          "ppo.bapo_low=(0.9, 0.6): the start must not exceed the max"),
    "bapo_target_nan": (["--ppo.band-controller", "bapo", "--ppo.bapo-target", "nan"],
                        "ppo.bapo_target=nan"),
    "bapo_target_without_bapo": (["--ppo.bapo-target", "0.5"],
                                 "ppo.bapo_target=0.5: only ppo.band_controller bapo reads it"),
    "pettingzoo_module_empty": (["--env", "pettingzoo:"], "env='pettingzoo:': names no module"),
    "preset_twice": (["--preset", "klip/lunarlander", "--preset", "klip/cartpole"],
                     "argument --preset: given twice"),
    "config_twice": (["--config", "a.yaml", "--config", "b.yaml"],
                     "argument --config: given twice"),
    # non-finite floats anywhere (issue 19: nan blamed the env and named a missing checkpoint)
    "log_std_init_nan": (["--net.log-std-init", "nan"], "net.log_std_init=nan"),
    "log_std_init_inf": (["--net.log-std-init", "-inf"], "net.log_std_init=-inf"),
    "monitor_high_inf": (["--kl.monitor-high", "inf"], "kl.monitor_high=inf"),
    "beta_nan": (["--objective", "kl_penalty", "--kl.beta", "nan"], "kl.beta=nan"),
    "gamma_nan": (["--ppo.gamma", "nan"], "ppo.gamma=nan"),
    # sizes beyond the stated bounds (hang in weight init, MemoryError)
    "hidden_huge": (["--net.hidden", "100000000"], "net.hidden=(100000000,)"),
    "hidden_too_many_weights": (["--net.hidden", "8192", "8192", "8192"],
                                "134,217,728 weights between hidden layers"),
    "num_envs_huge": (["--rollout.num-envs", "100000000"], "rollout.num_envs=100000000"),
    "num_steps_huge": (["--rollout.num-steps", "10000000000"], "rollout.num_steps=10000000000"),
    "rollout_too_large": (["--rollout.num-envs", "1024", "--rollout.num-steps", "4096"],
                          "rollout.num_envs * rollout.num_steps=4194304"),
    "total_steps_huge": (["--total-steps", str(10**13)], "total_steps=10000000000000"),
    "torch_threads_huge": (["--torch-threads", "100000"], "torch_threads=100000"),
    # multi-agent settings on a single-agent env (were ignored)
    "marl_policies_single_agent": (["--marl.policies", "a=b"], "marl.policies=('a=b',)"),
    "marl_overrides_single_agent": (["--marl.overrides", "a:ppo.lr=0.1"], "marl.overrides="),
    "marl_env_kwargs_single_agent": (["--marl.env-kwargs", "max_cycles=25"],
                                     "marl.env_kwargs=('max_cycles=25',)"),
    # spaces klppo's networks cannot take (were numpy's or Python's words and a run directory)
    "frozenlake": (["--env", "FrozenLake-v1"], "observation space Discrete(16) is not a Box"),
    "cliffwalking": (["--env", "CliffWalking-v1"], "observation space Discrete(48) is not a Box"),
    "cliffwalking_v0": (["--env", "CliffWalking-v0"], "did you mean CliffWalking-v1"),
    "blackjack": (["--env", "Blackjack-v1"], "observation space Tuple(Discrete(32)"),
    "dict_observation": (["--env", "tests.rl.envs_for_tests:KlppoTest/DictObs-v0"],
                         "observation space Dict("),
    "action_from_one": (["--env", "tests.rl.envs_for_tests:KlppoTest/ActionFromOne-v0"],
                        "action space Discrete(3, start=1) does not start at 0"),
    "multidiscrete_action": (["--env", "tests.rl.envs_for_tests:KlppoTest/MultiDiscreteAction-v0"],
                             "action space MultiDiscrete([2 3]) is not Discrete or Box"),
    "env_constructor_fails": (["--env", "tests.rl.envs_for_tests:KlppoTest/Unbuildable-v0"],
                              "cannot be created (RuntimeError: cannot open the simulator"),
    # values accepted before that meant nothing (issue #32): each field's domain
    "eps_one_or_more": (["--ppo.eps", "1.5"], "ppo.eps=1.5: must be in (0, 1)"),
    "eps_low_one": (["--ppo.eps-low", "1.0"], "ppo.eps_low=1.0: must be in (0, 1)"),
    "dppo_tv_delta_above_one": (["--objective", "dppo_tv", "--ppo.delta", "2"],
                                "ppo.delta=2.0: dppo_tv bounds a total-variation distance"),
    "sapo_temperature_huge": (["--objective", "sapo", "--ppo.tau-pos", "1e300"],
                              "ppo.tau_pos=1e+300: must be in (0, 100]"),
    "log_std_init_huge": (["--net.log-std-init", "1e6"], "net.log_std_init=1000000.0"),
    "max_episode_steps_negative": (["--env-kwargs", "{max_episode_steps: -1}"],
                                   "env_kwargs.max_episode_steps=-1"),
    "render_mode_in_training": (["--env-kwargs", "{render_mode: human}"],
                                "env_kwargs.render_mode='human'"),
    "envpool_threads_without_envpool": (["--envpool-threads", "2"], "envpool_threads=2"),
    # sizes bounded before anything is allocated (issue #32)
    "bapo_grid_huge": (["--ppo.band-controller", "bapo", "--ppo.bapo-step-high", "1e-12"],
                       "ppo.bapo_step_high=1e-12: makes 1,800,000,000,001 bounds"),
    "bapo_range_huge": (["--ppo.band-controller", "bapo", "--ppo.bapo-high", "1.2", "1e15"],
                        "bounds over (1.2, 1e+15); at most 10,000"),
    "envpool_threads_huge": (["--rollout.env-backend", "envpool", "--envpool-threads",
                              "100000"], "envpool_threads=100000"),
}

#: a "billion laughs" document: 9 levels of 9 aliases (9**8 strings once expanded)
BOMB = "a: &a [lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

#: name -> (YAML text or bytes for --config, text the message must contain)
YAML = {
    "lr_string": ("ppo:\n  lr: fast\n", "ppo.lr='fast'"),
    "hidden_scalar": ("net:\n  hidden: 64\n", "net.hidden=64"),
    "epochs_bool": ("ppo:\n  update_epochs: true\n", "ppo.update_epochs=True"),
    "norm_obs_string": ("rollout:\n  norm_obs: yes please\n", "rollout.norm_obs='yes please'"),
    "target_string": ("kl:\n  target: '0.02'\n", "kl.target='0.02'"),
    "section_not_mapping": ("ppo: 3\n", "ppo=3"),
    "unknown_field": ("ppo:\n  lr_schedule: cosine\n",
                      "ppo.lr_schedule='cosine': unknown config field"),
    "unknown_controller": ("kl:\n  controller: magic\n", "kl.controller='magic'"),
    "unknown_actuator": ("kl:\n  actuator: speed\n", "kl.actuator='speed'"),
    "unknown_band_controller": ("ppo:\n  band_controller: wide\n", "ppo.band_controller='wide'"),
    "bapo_high_three_values": ("ppo:\n  band_controller: bapo\n  bapo_high: [1.2, 2, 3]\n",
                               "ppo.bapo_high=[1.2, 2, 3]: must be a list of 2: a number"),
    "objective_int": ("objective: 3\n", "objective=3"),
    "top_level_list": ("- 1\n- 2\n", "must be a mapping"),
    "top_level_scalar": ("42\n", "must be a mapping"),
    "malformed": ("ppo: [1, 2\n", "not valid YAML at line"),
    "tabs": ("ppo:\n\tlr: 1\n", "not valid YAML"),
    "not_utf8": (b"ppo:\n  lr: \xff\xfe\n", "not UTF-8"),
    "value_out_of_range": ("ppo:\n  gamma: -0.5\n", "ppo.gamma=-0.5"),
    # duplicate keys (the last won silently), alias bombs, recursion, huge values
    "duplicate_key": ("ppo:\n  lr: 0.1\n  lr: 0.2\n", "duplicate key 'lr'"),
    "duplicate_section": ("ppo:\n  lr: 0.1\nppo:\n  eps: 0.1\n", "duplicate key 'ppo'"),
    "duplicate_top_key": ("seed: 1\nseed: 2\n", "line 2, column 1: duplicate key 'seed'"),
    "alias_bomb": (BOMB + "ppo:\n  lr: *i\n", "aliases expand to more than 100,000 values"),
    "recursive_alias": ("net:\n  hidden: &h [*h]\n", "a recursive alias"),
    "nested_too_deep": ("ppo: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    "huge_value": ("ppo:\n  lr: " + "x" * 100_000 + "\n", "ppo.lr='xxxx"),
    "nan_float": ("net:\n  log_std_init: .nan\n", "net.log_std_init=nan"),
    "marl_on_single_agent": ("marl:\n  policies: [a=b]\n", "marl.policies=('a=b',)"),
    "yaml11_underscore_int": ("total_steps: 1_024\n", "total_steps='1_024'"),
    "yaml11_yes_bool": ("tensorboard: yes\n", "tensorboard='yes'"),
    "yaml11_on_bool": ("tensorboard: On\n", "tensorboard='On'"),
    "yaml11_sexagesimal": ("ppo:\n  lr: 1:30\n", "ppo.lr='1:30'"),
    "yaml11_date": ("seed: 2026-01-01\n", "seed='2026-01-01'"),
}


def run(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def assert_one_line(code, err, expect):
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert len(err) <= 300, f"{len(err)} characters: {err[:400]}"
    assert err.startswith("klppo train: ") and "Traceback" not in err
    assert expect in err, err


@pytest.mark.parametrize("name", list(FLAGS))
def test_bad_flag(tmp_path, capsys, name):
    flags, expect = FLAGS[name]
    out = tmp_path / "run"
    good = GOOD[2:] if "--preset" in flags else GOOD  # a case's own preset replaces GOOD's
    code, err = run(["train", *good, *flags, "--out", str(out)], capsys)
    assert_one_line(code, err, expect)
    assert not out.exists()


@pytest.mark.parametrize("name", list(YAML))
def test_bad_yaml_config(tmp_path, capsys, name):
    text, expect = YAML[name]
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "run"
    code, err = run(["train", *GOOD, "--config", str(cfg), "--out", str(out)], capsys)
    assert_one_line(code, err, expect)
    if name not in ("value_out_of_range", "nan_float", "marl_on_single_agent"):
        # a range is checked after the flags (which may fix it)
        assert str(cfg) in err
    assert not out.exists()


def _paths(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    f = tmp_path / "a_file"
    f.write_text("x")
    done = tmp_path / "done"
    done.mkdir()
    (done / "metrics.jsonl").write_text("")
    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    bad_cfg = tmp_path / "bad_cfg"
    bad_cfg.mkdir()
    (bad_cfg / "config.yaml").write_text("ppo:\n  lr: fast\n")
    started = tmp_path / "started"  # a run killed before its first metrics line
    started.mkdir()
    (started / "config.yaml").write_text("seed: 5\n")
    (started / "checkpoint.pt").write_bytes(b"weights")
    meta_only = tmp_path / "meta_only"
    meta_only.mkdir()
    (meta_only / "metadata.json").write_text("{}")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    return {
        "config_missing": (["train", *GOOD, "--config", str(tmp_path / "nope.yaml")],
                           "nope.yaml': no such file"),
        "config_is_directory": (["train", *GOOD, "--config", str(empty_dir)], "is a directory"),
        "out_is_a_file": (["train", *GOOD, "--out", str(f)], "not a directory"),
        "out_under_a_file": (["train", *GOOD, "--out", str(f / "run")], "not a directory"),
        "out_holds_a_run": (["train", *GOOD, "--out", str(done)], "already holds a run"),
        "out_not_writable": (["train", *GOOD, "--out", "/proc/klppo-test/run"], "/proc"),
        "resume_missing": (["train", "--resume", str(tmp_path / "nope")], "no such directory"),
        "resume_a_file": (["train", "--resume", str(f)], "not a directory"),
        "resume_not_a_run": (["train", "--resume", str(empty_dir)], "no config.yaml"),
        "resume_bad_config": (["train", "--resume", str(bad_cfg)], "ppo.lr='fast'"),
        "resume_with_flags": (["train", "--resume", str(done), "--seed", "3"],
                              "--resume takes no other flags"),
        "out_empty": (["train", *GOOD, "--out", ""], "out='': must name a directory"),
        "runs_root_blank": (["train", *GOOD, "--runs-root", " "], "runs_root=' '"),
        "out_holds_a_run_without_metrics": (["train", *GOOD, "--out", str(started)],
                                            "holds a run that has no metrics yet "
                                            "(config.yaml, checkpoint.pt)"),
        "out_holds_only_metadata": (["train", *GOOD, "--out", str(meta_only)],
                                    "holds a run that has no metrics yet (metadata.json)"),
        "out_not_empty": (["train", *GOOD, "--out", str(foreign)],
                          "is not empty (1 entries, e.g. 'thesis.tex')"),
        "config_is_a_device": (["train", *GOOD, "--config", "/dev/zero"],
                               "config='/dev/zero': not a regular file"),
        "resume_empty": (["train", "--resume", ""], "argument --resume: '' names no path"),
    }


PATH_CASES = ["config_missing", "config_is_directory", "out_is_a_file", "out_under_a_file",
              "out_holds_a_run", "out_not_writable", "resume_missing", "resume_a_file",
              "resume_not_a_run", "resume_bad_config", "resume_with_flags", "out_empty",
              "runs_root_blank", "out_holds_a_run_without_metrics", "out_holds_only_metadata",
              "out_not_empty", "config_is_a_device", "resume_empty"]


@pytest.mark.parametrize("name", PATH_CASES)
def test_bad_path(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # a default run directory would land here
    argv, expect = _paths(tmp_path)[name]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    dirs = sorted(p.name for p in tmp_path.rglob("*"))
    code, err = run(argv, capsys)
    assert_one_line(code, err, expect)
    assert sorted(p.name for p in tmp_path.rglob("*")) == dirs  # nothing created
    assert {p: p.read_bytes() for p in before} == before  # nothing overwritten


def test_out_may_be_an_empty_directory_or_one_a_killed_start_left(tmp_path, capsys):
    """The refusals above do not refuse what is ours: an empty directory, or one holding only
    the lock (and a temp file) of a start killed before it wrote its config."""
    for name, files in (("empty", []), ("killed", [".lock", ".config.yaml.tmp123"])):
        out = tmp_path / name
        out.mkdir()
        for f in files:
            (out / f).write_text("")
        code = main(["train", *GOOD, "--total-steps", "512", "--rollout.num-steps", "128",
                     "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        assert (out / "metrics.jsonl").exists()


def test_docs_state_this_tables_size():
    """docs/reliability.md states how many cases this table holds: it fails when a case is
    added or dropped without the docs saying so."""
    import re

    docs = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    row = next(line for line in docs.splitlines() if line.startswith("| `klppo train` |"))
    stated = int(re.findall(r"\| (\d+) \| `tests/rl/test_bad_inputs.py` \|", row)[0])
    assert stated == len(FLAGS) + len(YAML) + len(PATH_CASES)


def test_real_subprocess_prints_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "klppo", "train", *GOOD, "--ppo.lr", "fast",
                           "--out", str(tmp_path / "r")], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()
