"""What `klppo lm` and `klppo rlhf` show a user: help texts and pretraining progress."""

import re

import pytest

from klppo.cli import main


def test_lm_help_lists_pretrain(capsys):
    assert main(["lm", "--help"]) == 0
    out = capsys.readouterr().out
    assert "klppo lm pretrain" in out and re.search(r"^\s+pretrain\s+\S", out, re.M)


def test_rlhf_help_names_compare(capsys):
    pytest.importorskip("transformers")
    with pytest.raises(SystemExit) as e:
        main(["rlhf", "--help"])
    assert e.value.code == 0
    assert "klppo rlhf compare" in capsys.readouterr().out


def test_rlhf_compare_help_shows_every_default(capsys):
    with pytest.raises(SystemExit) as e:
        main(["rlhf", "compare", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in ("runs/rlhf-compare", "[0]", "2.0", "0.04"):
        assert f"(default: {default})" in out
    for flag, default in (("--model", "runs/lm/base"), ("--iterations", "150"),
                          ("--adaptive", "proportional"), ("--target", "6")):
        # the defaults without a preset, which are RLHFConfig's
        assert re.search(rf"{flag} \S+ .*?\(default: the preset's, else {default}\)", out)
    from klppo.lm.config import RLHFConfig

    c = RLHFConfig()
    assert (c.model, c.iterations, c.controller, c.target) == ("runs/lm/base", 150,
                                                              "proportional", 6.0)


def test_pretrain_prints_progress(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from klppo.lm import pretrain as P
    from klppo.lm.corpus import Split

    text = "Emma was happy. Mr. Knightley was not. It is a truth universally acknowledged. "
    monkeypatch.setattr(P, "split_corpus", lambda: Split(text * 40, text * 8))
    assert main(["lm", "pretrain", "--out", str(tmp_path / "m"), "--steps", "40",
                 "--batch-size", "2", "--seq-len", "16", "--vocab-size", "300"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step")]
    assert [x.split()[1] for x in lines] == ["1/40"] + [f"{k}/40" for k in range(2, 41, 2)]
    # the ETA comes from the steps after the first (the tokenizer's time before it is no rate)
    assert re.search(r"  elapsed \d+:\d\d  ETA -$", lines[0])
    assert all(re.search(r"loss \d+\.\d{3}  lr \S+  elapsed \d+:\d\d  ETA \d+:\d\d$", x)
               for x in lines[1:])
