"""--device for klppo rlhf and klppo lm pretrain."""

import json

import pytest
import torch

from klppo.cli import main
from tests.lm.conftest import TINY

CUDA = torch.cuda.is_available()


def rlhf_args(model, out, device, iterations=2):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, "iterations": iterations}.items()]
    return ["rlhf", "--model", str(model), "--out", str(out), "--device", device, *flags]


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
@pytest.mark.parametrize("command", ["rlhf", "pretrain"])
def test_cuda_without_a_gpu_is_one_line_before_any_directory(tiny_model_dir, tmp_path, capsys,
                                                             command):
    out = tmp_path / "out"
    argv = (rlhf_args(tiny_model_dir, out, "cuda") if command == "rlhf"
            else ["lm", "pretrain", "--out", str(out), "--steps", "2", "--device", "cuda"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "device='cuda': CUDA is not available" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_rlhf_auto_runs_here(tiny_model_dir, tmp_path):
    assert main(rlhf_args(tiny_model_dir, tmp_path / "r", "auto")) == 0
    assert json.loads((tmp_path / "r" / "status.json").read_text())["state"] == "finished"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_rlhf_on_cuda_finishes_and_resumes_exactly(tiny_model_dir, tmp_path):
    from klppo.lm.rlhf import resume_rlhf

    assert main(rlhf_args(tiny_model_dir, tmp_path / "full", "cuda", iterations=6)) == 0
    full = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    assert len(full) == 6
    res = resume_rlhf(tmp_path / "full")  # finished: nothing to do, metrics kept
    assert res.status == "finished"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_pretrain_on_cuda_saves_a_cpu_loadable_model(tmp_path):
    out = tmp_path / "m"
    assert main(["lm", "pretrain", "--out", str(out), "--steps", "5", "--device", "cuda",
                 "--vocab-size", "300"]) == 0
    from klppo.lm.model import load_lm

    lm, _ = load_lm(str(out))
    assert next(lm.parameters()).device.type == "cpu"
