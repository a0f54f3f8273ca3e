"""examples/torchrl_cartpole.py runs end to end with tiny sizes (a TorchRL collector, GAE and
each loss), and klppo's KLipPPOLoss trains exactly as TorchRL's ClipPPOLoss there."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torchrl")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrl_cartpole.py"
TINY = dict(frames=512, frames_per_batch=128, epochs=2, minibatch=64, verbose=False)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("torchrl_cartpole", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_klip_trains_exactly_as_clip_ppo_loss(example):
    klip = example.train("klip", **TINY)
    assert len(klip) == 4 and all(r > 0 for r in klip)
    assert example.train("clip", **TINY) == klip


def test_klpen_and_the_command_line(example, capsys):
    example.main(["--loss", "klpen", "--frames", "256", "--frames-per-batch", "128",
                  "--epochs", "1", "--minibatch", "64"])
    out = capsys.readouterr().out
    assert "beta" in out and "klpen: final return" in out
