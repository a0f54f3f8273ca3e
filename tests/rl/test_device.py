"""--device: cpu (default), cuda (torch path only), auto."""

import dataclasses
import json

import pytest
import torch

from klppo import rl
from klppo.cli import main
from klppo.rl.trainer import TIMING_KEYS

CUDA = torch.cuda.is_available()


def small(out, **kw):
    cfg = rl.preset("klip/cartpole")
    kw = {"total_steps": 1024, "tensorboard": False, **kw}  # a test may set total_steps
    return dataclasses.replace(cfg, out=str(out), **kw)


def strip(metrics):
    return [{k: v for k, v in m.items() if k not in TIMING_KEYS} for m in metrics]


def test_auto_on_a_cpu_machine_is_cpu(tmp_path):
    if CUDA:
        pytest.skip("this machine has a GPU")
    a = rl.train(small(tmp_path / "a", device="auto", fast_path=False))
    b = rl.train(small(tmp_path / "b", device="cpu", fast_path=False))
    assert strip(a.metrics) == strip(b.metrics)


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
def test_cuda_without_a_gpu_is_one_line_before_any_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--preset", "klip/cartpole", "--device", "cuda", "--no-fast-path",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "device='cuda': CUDA is not available" in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_cuda_trains_resumes_exactly_and_loads_on_cpu(tmp_path):
    import klppo

    full = rl.train(small(tmp_path / "full", device="cuda", fast_path=False, total_steps=3072,
                          checkpoint_every=1))
    assert full.status == "finished"
    run = tmp_path / "part"
    cfg = small(run, device="cuda", fast_path=False, total_steps=3072, checkpoint_every=1)

    def stop(m):
        if m["iteration"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rl.train(cfg, on_iteration=stop)
    assert strip(rl.resume(run).metrics) == strip(full.metrics)
    policy = klppo.load(full.run_dir)  # a GPU-trained policy loads on the CPU
    assert next(policy.agent.parameters()).device.type == "cpu"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_cuda_with_the_fast_path_stays_on_cpu_and_says_so(tmp_path, caplog):
    res = rl.train(small(tmp_path / "r", device="cuda"))
    assert res.status == "finished" and "numpy fast path runs on the CPU" in caplog.text
    assert json.loads((tmp_path / "r" / "status.json").read_text())["state"] == "finished"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on the device machine)")
def test_a_torch_group_trains_on_cuda_and_its_runs_follow_themselves_alone(tmp_path):
    """The engine's torch stack on the GPU: runs in a group follow the same runs trained alone
    on the GPU (to float rounding), and their checkpoints resume alone."""
    from klppo.rl.engine.rundirs import train_batched

    cfgs = [small(tmp_path / f"b{s}", device="cuda", fast_path=False, seed=s,
                  objective=obj, total_steps=2048)
            for s, obj in ((0, "clip"), (1, "kl_penalty"), (2, "sapo"))]
    batched = train_batched(cfgs)
    for c, b in zip(cfgs, batched):
        o = rl.train(dataclasses.replace(c, out=str(tmp_path / f"o{c.seed}")))
        assert b.status == o.status == "finished"
        for mb, mo in list(zip(b.metrics, o.metrics))[:2]:
            assert mb["loss"] == pytest.approx(mo["loss"], rel=1e-3, abs=1e-5)
    longer = rl.resume(batched[0].run_dir, total_steps=2560)
    assert longer.status == "finished"
