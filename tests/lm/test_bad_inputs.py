"""Bad input to `klppo rlhf`, `klppo lm pretrain` and `klppo rlhf compare`: one line on stderr
naming the field (or flag, or file) and the value, exit status 2, no traceback, and nothing
created, before any work starts."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from klppo.cli import main  # noqa: E402
from tests.badinput import assert_one_line_error, run_main, tree  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _yaml(text: str | bytes):
    """A case that writes ``text`` to cfg.yaml and passes it as --config."""
    def make(tmp: Path, model: Path) -> list[str]:
        data = text.encode() if isinstance(text, str) else text
        (tmp / "cfg.yaml").write_bytes(data)
        return ["--model", str(model), "--config", str(tmp / "cfg.yaml")]
    return make


def _flags(*flags: str):
    return lambda tmp, model: ["--model", str(model), *flags]


def _model(kind: str):
    def make(tmp: Path, model: Path) -> list[str]:
        d = tmp / "m"
        if kind == "file":
            d.write_text("not a model")
        elif kind == "empty_dir":
            d.mkdir()
        elif kind == "bad_config":
            d.mkdir()
            (d / "config.json").write_text('{"model_type": "no-such-architecture"}')
        return ["--model", str(d)]
    return make


def _out(kind: str):
    def make(tmp: Path, model: Path) -> list[str]:
        (tmp / "f").write_text("x")
        if kind in ("run", "train_run"):
            (tmp / "old").mkdir()
            (tmp / "old" / "metrics.jsonl").write_text('{"iteration": 1}\n')
            (tmp / "old" / "config.yaml").write_text("kind: rlhf\n" if kind == "run" else
                                                     "env: CartPole-v1\n")
        if kind == "empty":
            return ["--model", str(model), "--out", ""]
        target = {"file": tmp / "f", "under_file": tmp / "f" / "run", "run": tmp / "old",
                  "train_run": tmp / "old"}[kind]
        return ["--model", str(model), "--out", str(target)]
    return make


def _resume(kind: str):
    def make(tmp: Path, model: Path) -> list[str]:
        d = tmp / "r"
        if kind != "missing":
            d.mkdir()
        if kind == "train_run":
            (d / "config.yaml").write_text("env: CartPole-v1\n")
        if kind == "extra":
            (d / "config.yaml").write_text("kind: rlhf\n")
            return ["--resume", str(d), "--lr", "0.1"]
        return ["--resume", str(d)]
    return make


RLHF_CASES = {
    # --config FILE.yaml
    "yaml_lr_string": (_yaml('lr: "fast"\n'), ["lr='fast'", "must be a number", "cfg.yaml"]),
    "yaml_top_level_list": (_yaml("- lr\n- 0.1\n"), ["config=", "must be a mapping", "list"]),
    "yaml_malformed": (_yaml("lr: [1, 2\n"), ["config=", "not valid YAML", "line"]),
    "yaml_not_utf8": (_yaml(b"lr: 0.1\n# caf\xe9\n"), ["config=", "not UTF-8", "0xe9"]),
    "yaml_missing_file": (lambda tmp, m: ["--config", str(tmp / "nope.yaml")],
                          ["config=", "nope.yaml", "no such file"]),
    "yaml_is_directory": (lambda tmp, m: ["--config", str(tmp)], ["config=", "is a directory"]),
    "yaml_unknown_key": (_yaml("lrr: 0.1\n"),
                         ["lrr=0.1", "unknown config field", "did you mean lr"]),
    "yaml_bool_sentence": (_yaml("stop_at_eos: yes please\n"),
                           ["stop_at_eos='yes please'", "true or false"]),
    "yaml_int_as_bool": (_yaml("iterations: true\n"), ["iterations=True", "an integer"]),
    "yaml_literal": (_yaml("kl_estimator: k9\n"), ["kl_estimator='k9'", "one of 'k1'"]),
    "yaml_optional": (_yaml("horizon: soon\n"), ["horizon='soon'", "a number or null"]),
    "yaml_zero_iterations": (_yaml("iterations: 0\n"), ["iterations=0", ">= 1"]),
    "yaml_nan_lr": (_yaml("lr: .nan\n"), ["lr=nan", "finite"]),
    "yaml_minibatch": (_yaml("minibatch_size: 5\n"), ["minibatch_size=5", "must divide"]),
    "yaml_model_int": (_yaml("model: 3\n"), ["model=3", "a string"]),
    # flags
    "flag_lr_string": (_flags("--lr", "fast"), ["--lr", "'fast'"]),
    "flag_negative_iterations": (_flags("--iterations", "-1"), ["iterations=-1", ">= 1"]),
    "flag_negative_beta": (_flags("--beta", "-0.5"), ["beta=-0.5", ">= 0"]),
    "flag_inf_temperature": (_flags("--temperature", "inf"), ["temperature=inf", "finite"]),
    "flag_literal": (_flags("--kl-estimator", "k9"), ["k9", "--kl-estimator"]),
    "flag_unknown": (_flags("--bogus", "1"), ["--bogus"]),
    "flag_negative_seed": (_flags("--seed", "-1"), ["seed=-1"]),
    "flag_reward_name": (_flags("--reward", "imdb"), ["reward='imdb'"]),
    "flag_reward_label": (_flags("--reward", "classifier:x:pos"), ["reward='classifier:x:pos'"]),
    "flag_reward_path": (lambda tmp, m: ["--model", str(m), "--reward",
                                         f"classifier:{tmp}/none"], ["reward=", "no config.json"]),
    "flag_gamma": (_flags("--gamma", "1.5"), ["gamma=1.5", "[0, 1]"]),
    "flag_beta_above_max": (_flags("--beta-max", "0.05"), ["beta=0.1", "beta_max"]),
    "flag_horizon_zero": (_flags("--horizon", "0"), ["horizon=0.0", "> 0"]),
    "flag_too_long_for_model": (_flags("--response-len", "200"), ["response_len=200", "160"]),
    # sizes bounded before anything is allocated (klppo.lm.bounds)
    "flag_batch_huge": (_flags("--batch-size", "1000000000"),
                        ["batch_size=1000000000", "at most 4,096"]),
    "flag_epochs_huge": (_flags("--ppo-epochs", "1000000000"),
                         ["ppo_epochs=1000000000", "at most 10,000"]),
    "flag_iterations_huge": (_flags("--iterations", "100000000"),
                             ["iterations=100000000", "at most 10,000,000"]),
    "flag_batch_tokens": (_flags("--batch-size", "4096", "--minibatch-size", "8"),
                          ["batch_size * (prompt_len + response_len)=163840", "131,072 tokens"]),
    "flag_eval_windows_huge": (_flags("--eval-windows", "100000"),
                               ["eval_windows=100000", "at most 4,096"]),
    # a correction with nothing to correct (every weight 1)
    "flag_correction_without_mismatch": (_flags("--mismatch-correction", "tis"),
                                         ["mismatch_correction='tis'", "needs a sampler"]),
    "flag_reject_not_m2po": (_flags("--staleness", "1", "--mismatch-correction", "tis",
                                    "--mismatch-reject", "5"),
                             ["mismatch_reject=5.0", "only the m2po correction"]),
    # --model
    "model_missing": (lambda tmp, m: ["--model", str(tmp / "nope")],
                      ["model=", "nope", "no such directory"]),
    "model_is_file": (_model("file"), ["model=", "is a file"]),
    "model_no_config": (_model("empty_dir"), ["model=", "no config.json"]),
    "model_bad_config": (_model("bad_config"), ["model=", "config.json cannot be read"]),
    # --out
    "out_is_file": (_out("file"), ["out=", "not a directory"]),
    "out_under_file": (_out("under_file"), ["out=", "is a file"]),
    "out_holds_run": (_out("run"), ["out=", "already holds a run", "--resume"]),
    "out_holds_train_run": (_out("train_run"), ["out=", "not a `klppo rlhf` run"]),
    "out_empty": (_out("empty"), ["out=''", "names no path"]),
    "config_empty_name": (lambda tmp, m: ["--config", ""], ["--config", "names no path"]),
    "resume_empty_name": (lambda tmp, m: ["--resume", ""], ["--resume", "names no path"]),
    "model_empty": (lambda tmp, m: ["--model", ""], ["model=''", "names no path"]),
    # --resume
    "resume_missing": (_resume("missing"), ["resume=", "no such directory"]),
    "resume_not_run": (_resume("empty"), ["resume=", "no config.yaml"]),
    "resume_other_kind": (_resume("train_run"), ["config=", "kind=None", "klppo train"]),
    "resume_with_flags": (_resume("extra"), ["resume=", "takes no other flags", "--lr"]),
    # --preset
    "preset_unknown": (_flags("--preset", "smollm3"),
                       ["preset='smollm3'", "no such RLHF preset", "smollm2"]),
    "preset_empty": (_flags("--preset", ""), ["--preset", "''", "not a name"]),
    "preset_twice": (_flags("--preset", "smollm2", "--preset", "smollm2"),
                     ["--preset", "given twice"]),
}


@pytest.mark.parametrize("case", list(RLHF_CASES))
def test_rlhf_bad_input(case, tiny_model_dir, tmp_path, capsys):
    make, needles = RLHF_CASES[case]
    argv = make(tmp_path, tiny_model_dir)
    if "--out" not in argv and "--resume" not in argv:
        argv += ["--out", str(tmp_path / "run")]
    before = tree(tmp_path)
    rc = run_main(["rlhf", *argv])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf", needles)
    assert tree(tmp_path) == before, "a refused run must create nothing"


PRETRAIN_CASES = {
    "steps_negative": (["--steps", "-5"], ["steps=-5", ">= 1"]),
    "steps_zero": (["--steps", "0"], ["steps=0"]),
    "steps_not_int": (["--steps", "many"], ["--steps", "'many'"]),
    "batch_size_zero": (["--batch-size", "0"], ["batch_size=0"]),
    "seq_len_negative": (["--seq-len", "-1"], ["seq_len=-1"]),
    "lr_zero": (["--lr", "0"], ["lr=0.0", "> 0"]),
    "lr_negative": (["--lr", "-1e-3"], ["lr=-0.001"]),
    "lr_nan": (["--lr", "nan"], ["lr=nan", "finite"]),
    "lr_inf": (["--lr", "inf"], ["lr=inf", "finite"]),
    "vocab_too_small": (["--vocab-size", "100"], ["vocab_size=100", ">= 257"]),
    "seed_negative": (["--seed", "-1"], ["seed=-1"]),
    "threads_zero": (["--torch-threads", "0"], ["torch_threads=0"]),
    "unknown_flag": (["--epochs", "3"], ["--epochs"]),
    "out_is_file": (["--out", "{tmp}/f"], ["out=", "not a directory"]),
    "out_under_file": (["--out", "{tmp}/f/model"], ["out=", "is a file"]),
    # sizes bounded before anything is allocated (klppo.lm.bounds)
    "batch_size_huge": (["--batch-size", "1000000000"], ["batch_size=1000000000", "4,096"]),
    "seq_len_huge": (["--seq-len", "1000000000"], ["seq_len=1000000000", "at most 2,048"]),
    "tokens_per_step": (["--batch-size", "4096", "--seq-len", "2048"],
                        ["batch_size * seq_len=8388608", "131,072 tokens"]),
    "vocab_huge": (["--vocab-size", "1000000000"], ["vocab_size=1000000000", "65,536"]),
    "n_embd_huge": (["--n-embd", "1000000"], ["n_embd=1000000", "at most 4,096"]),
    "n_layer_huge": (["--n-layer", "100000"], ["n_layer=100000", "at most 64"]),
    "parameters_huge": (["--n-embd", "4096", "--n-layer", "64", "--n-head", "64"],
                        ["n_embd, n_layer, vocab_size=(4096, 64, 2048)", "parameters"]),
    "steps_huge": (["--steps", "100000000"], ["steps=100000000", "at most 10,000,000"]),
    # the one writer that lacked the ownership check: a run's exported policy is the run's
    "out_is_a_runs_policy": (["--out", "{tmp}/run/policy"],
                             ["out=", "policy/ belongs to the run", "its exported policy"]),
}


@pytest.mark.parametrize("case", list(PRETRAIN_CASES))
def test_pretrain_bad_input(case, tmp_path, capsys):
    flags, needles = PRETRAIN_CASES[case]
    (tmp_path / "f").write_text("x")
    (tmp_path / "run" / "policy").mkdir(parents=True)  # a run with an exported policy
    (tmp_path / "run" / "config.yaml").write_text("kind: rlhf\n")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"iteration": 1}\n')
    (tmp_path / "run" / "policy" / "config.json").write_text("{}")
    flags = [f.format(tmp=tmp_path) for f in flags]
    if "--out" not in flags:
        flags += ["--out", str(tmp_path / "model")]
    before = tree(tmp_path)
    rc = run_main(["lm", "pretrain", *flags])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "lm pretrain", needles)
    assert tree(tmp_path) == before


def test_pretrain_read_only_out(tmp_path, capsys, monkeypatch):
    """A read-only parent (simulated: tests often run as root, who may write anywhere)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro
                        else real_access(p, mode))
    rc = main(["lm", "pretrain", "--out", str(ro / "model")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "lm pretrain",
                          ["out=", "not writable"])
    assert list(ro.iterdir()) == []


def test_lm_without_subcommand_is_one_line(capsys):
    assert main(["lm"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "klppo lm pretrain" in err


COMPARE_CASES = {
    "iterations_zero": (["--iterations", "0"], ["iterations=0"]),
    "iterations_not_int": (["--iterations", "many"], ["--iterations", "'many'"]),
    "strong_beta_negative": (["--strong-beta", "-1"], ["--strong-beta=-1.0", ">= 0"]),
    "weak_beta_nan": (["--weak-beta", "nan"], ["--weak-beta=nan", "finite"]),
    "strong_beta_overflow": (["--strong-beta", "1e400"], ["--strong-beta=inf"]),
    "adaptive_unknown": (["--adaptive", "magic"], ["--adaptive='magic'", "one of"]),
    "adaptive_fixed": (["--adaptive", "fixed"], ["--adaptive='fixed'", "one of", "pid"]),
    "preset_unknown": (["--preset", "smollm3"], ["preset='smollm3'", "smollm2"]),
    "target_zero": (["--target", "0"], ["target=0.0", "> 0"]),
    "workers_zero": (["--workers", "0"], ["--workers=0"]),
    "workers_huge": (["--workers", "100000"], ["--workers=100000", "1,024"]),
    "preset_twice": (["--preset", "smollm2", "--preset", "x"], ["--preset", "given twice"]),
    "abbreviated": (["--pre", "smollm2"], ["--pre"]),
    "set_twice_each_checked": (["--set", "lr=-1", "--set", "gamma=0.5"], ["lr=-1.0"]),
    "seeds_repeated": (["--seeds", "0", "0"], ["--seeds=[0, 0]", "distinct"]),
    "seed_negative": (["--seeds", "-1"], ["seed=-1"]),
    "set_wrong_type": (["--set", "lr=fast"], ["lr='fast'", "a number"]),
    "set_unknown_field": (["--set", "bogus=1"], ["bogus=1", "unknown config field"]),
    "set_without_value": (["--set", "lr"], ["--set='lr'", "FIELD=VALUE"]),
    "set_owned_field": (["--set", "seed=3"], ["--set='seed=3'", "--seeds"]),
    "set_malformed_yaml": (["--set", "lr=[1"], ["--set='lr=[1'", "not valid YAML"]),
    "set_literal": (["--set", "kl_placement=both"], ["kl_placement='both'"]),
    "model_missing": (["--model", "{tmp}/nope"], ["model=", "no such directory"]),
    "model_not_a_model": (["--model", "{tmp}"], ["model=", "no config.json"]),
    "out_is_file": (["--out", "{tmp}/f"], ["out=", "not a directory"]),
}


@pytest.mark.parametrize("case", list(COMPARE_CASES))
def test_compare_bad_input(case, tiny_model_dir, tmp_path, capsys):
    flags, needles = COMPARE_CASES[case]
    (tmp_path / "f").write_text("x")
    flags = [f.format(tmp=tmp_path) for f in flags]
    if "--model" not in flags:
        flags += ["--model", str(tiny_model_dir)]
    if "--out" not in flags:
        flags += ["--out", str(tmp_path / "cmp")]
    before = tree(tmp_path)
    rc = run_main(["rlhf", "compare", *flags])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf compare", needles)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("argv, command, needles", [
    (["rlhf", "--lr", "fast"], "rlhf", ["--lr", "'fast'"]),
    (["rlhf", "--config", "{tmp}/c.yaml"], "rlhf", ["lr='fast'"]),
    (["rlhf", "--model", "{tmp}/nope"], "rlhf", ["model=", "no such directory"]),
    (["lm", "pretrain", "--steps", "-5"], "lm pretrain", ["steps=-5"]),
    (["rlhf", "compare", "--workers", "0"], "rlhf compare", ["--workers=0"]),
])
def test_real_subprocess_bad_input(argv, command, needles, tmp_path):
    (tmp_path / "c.yaml").write_text('lr: "fast"\n')
    argv = [a.format(tmp=tmp_path) for a in argv]
    out = ["--out", str(tmp_path / "o")]
    proc = subprocess.run([sys.executable, "-m", "klppo", *argv, *out], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert_one_line_error(proc.returncode, proc.stderr, 2, command, needles)
    assert not (tmp_path / "o").exists() and not (tmp_path / "runs").exists()


def _base_model(tmp: Path, model: Path) -> Path:
    """The tiny GPT-2 without a head (GPT2Model): neither a causal LM nor a classifier."""
    from transformers import GPT2Config, GPT2Model

    d = tmp / "base"
    GPT2Model(GPT2Config.from_pretrained(model)).save_pretrained(d)
    return d


def _no_architectures(tmp: Path, model: Path) -> Path:
    import json
    import shutil

    d = tmp / "noarch"
    shutil.copytree(model, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("architectures", None)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


#: the wrong kind of model: (argv from (tmp, causal LM, classifier), needles)
KIND_CASES = {
    "model_is_classifier": (lambda t, m, c: ["--model", str(c)],
                            ["model=", "GPT2ForSequenceClassification", "not a causal language "
                             "model", "--reward classifier:PATH"]),
    "model_has_no_head": (lambda t, m, c: ["--model", str(_base_model(t, m))],
                          ["model=", "architectures ['GPT2Model']", "not a causal language"]),
    "reward_is_causal_lm": (lambda t, m, c: ["--model", str(m), "--reward", f"classifier:{m}"],
                            ["reward='classifier:{m}'", "architectures ['GPT2LMHeadModel']",
                             "not a sequence-classification model"]),
    "reward_names_no_architecture": (
        lambda t, m, c: ["--model", str(m), "--reward", f"classifier:{_no_architectures(t, m)}"],
        ["reward=", "model_type 'gpt2'", "not a sequence-classification model"]),
    "reward_label_missing": (lambda t, m, c: ["--model", str(m), "--reward",
                                              f"classifier:{c}:5"],
                             ["reward=", "2 labels", "LABEL 5 is none"]),
}


@pytest.mark.parametrize("case", list(KIND_CASES))
def test_rlhf_wrong_kind_of_model(case, tiny_model_dir, tiny_classifier_dir, tmp_path, capsys):
    make, needles = KIND_CASES[case]
    argv = make(tmp_path, tiny_model_dir, tiny_classifier_dir) + ["--out", str(tmp_path / "r")]
    before = tree(tmp_path)
    rc = run_main(["rlhf", *argv])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf",
                          [n.format(m=tiny_model_dir) for n in needles])
    assert tree(tmp_path) == before, "a refused run must create nothing"


def test_compare_refuses_a_classifier_as_model(tiny_classifier_dir, tmp_path, capsys):
    rc = run_main(["rlhf", "compare", "--model", str(tiny_classifier_dir), "--out",
                   str(tmp_path / "cmp")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf compare",
                          ["model=", "GPT2ForSequenceClassification"])
    assert list(tmp_path.iterdir()) == []


def test_a_classifier_reward_is_loaded_and_scores(tiny_classifier_dir):
    from klppo.lm.reward import make_reward

    reward = make_reward(f"classifier:{tiny_classifier_dir}:1")
    scores = reward(["a", "b"], ["Emma was happy.", "Mr. Knightley was not happy at all."])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def string_reward(prompts, responses):
    return ["1.0"] * len(responses)


#: what a user's reward function returns: (id, scores, needles of the error)
BAD_SCORES = [
    ("string", ["1.0"], ["reward <lambda>: score 0 is '1.0' (a str), not a number"]),
    ("bool", [True], ["score 0 is True (a bool), not a number"]),
    ("none", [None], ["score 0 is None (a NoneType)"]),
    ("list", [[1.0]], ["score 0 is [1.0] (a list)"]),
    ("nan", [float("nan")], ["score 0 is not finite (nan)"]),
    ("inf-numpy", [np.float32("inf")], ["score 0 is not finite (inf)"]),
    ("tensor-of-two", [torch.tensor([1.0, 2.0])], ["score 0 is tensor([1., 2.]) (a Tensor)"]),
]


@pytest.mark.parametrize("case", BAD_SCORES, ids=[c[0] for c in BAD_SCORES])
def test_a_reward_that_is_not_a_finite_number_is_refused(case):
    from klppo.lm.reward import checked

    _, scores, needles = case
    with pytest.raises(ValueError) as e:
        checked(lambda p, r: scores, ["p"], ["r"])
    for n in needles:
        assert n in str(e.value)


def test_numpy_and_torch_scalars_are_numbers():
    from klppo.lm.reward import checked

    got = checked(lambda p, r: [np.float32(0.5), torch.tensor(2.0), np.int64(3), 4],
                  ["p"] * 4, ["r"] * 4)
    assert got == [0.5, 2.0, 3.0, 4.0] and all(type(x) is float for x in got)


def test_a_run_whose_reward_returns_strings_fails_in_one_line_naming_it(tiny_model_dir,
                                                                        tmp_path):
    from klppo.lm.config import RLHFConfig
    from klppo.lm.rlhf import RLHFError, rlhf
    from tests.lm.conftest import TINY

    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "run"), **TINY)
    with pytest.raises(RLHFError) as e:
        rlhf(cfg, reward=string_reward)
    assert "reward string_reward: score 0 is '1.0' (a str), not a number" in str(e.value)
    assert "\n" not in str(e.value)
