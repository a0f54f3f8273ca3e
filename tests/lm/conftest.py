import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 1-layer GPT-2 (16 wide, 160 positions) with a 300-token BPE tokenizer, saved in the
    Hugging Face format: what `--model` points at in the lm tests (nothing is downloaded)."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    return make_tiny_model(tmp_path_factory.mktemp("tiny_lm"))


def make_tiny_model(d):
    """:func:`tiny_model_dir`'s model and tokenizer, saved in ``d``; ``d``."""
    from klppo.lm.model import small_gpt2, train_tokenizer

    tok = train_tokenizer("Emma was happy. Mr. Knightley was not. " * 200, vocab_size=300)
    model = small_gpt2(len(tok), n_positions=160, n_embd=16, n_layer=1, n_head=2)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


#: a small, fast RLHF config (tests add model and out)
TINY = {"iterations": 8, "batch_size": 4, "minibatch_size": 2, "prompt_len": 6,
        "response_len": 5, "eval_every": 3, "eval_windows": 2, "target": 1.0, "ppo_epochs": 1,
        "checkpoint_every": 3, "lr": 1e-3}


@pytest.fixture(scope="session")
def tiny_classifier_dir(tiny_model_dir, tmp_path_factory):
    """The tiny GPT-2 with a 2-label sequence-classification head (GPT2ForSequenceClassification)
    and the same tokenizer: what `--reward classifier:PATH` points at in the lm tests."""
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification

    d = tmp_path_factory.mktemp("tiny_classifier")
    cfg = GPT2Config.from_pretrained(tiny_model_dir, num_labels=2)
    GPT2ForSequenceClassification(cfg).save_pretrained(d)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(d)
    return d
