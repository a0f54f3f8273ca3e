"""`klppo rlhf --resume`: exact continuation after a crash or SIGKILL, refusal of runs that cannot
be continued exactly, one writer per run directory, graceful SIGINT/SIGTERM."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from klppo.lm.config import RLHFConfig  # noqa: E402
from klppo.lm.rlhf import TIMING_KEYS, RLHFError, resume_rlhf, rlhf  # noqa: E402
from klppo.runs.metrics import read_metrics  # noqa: E402
from klppo.runs.rundir import DirLock  # noqa: E402
from tests.badinput import assert_one_line_error, run_main  # noqa: E402
from tests.lm.conftest import TINY  # noqa: E402
from tests.signalguard import send_self  # noqa: E402
from tests.waiting import wait_for_lines  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def reward(prompts, responses):
    return [float(len(r) % 3) for r in responses]


def cfg(model, out, **kw):
    return RLHFConfig(model=str(model), out=str(out), **{**TINY, **kw})


def strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def status(run):
    return json.loads((Path(run) / "status.json").read_text())


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("full") / "run"
    return rlhf(cfg(tiny_model_dir, run), reward=reward)


@pytest.mark.parametrize("crash_at", [2, 5, 8])
def test_crash_then_resume_equals_uninterrupted(crash_at, uninterrupted, tiny_model_dir,
                                                tmp_path):
    """A failure after iteration ``crash_at`` was logged (checkpoints every 3: none yet, one at
    3, one at 6) leaves status 'failed' naming the last good checkpoint; resuming drops the
    metrics after it and finishes with exactly the uninterrupted run's metrics."""
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == crash_at:
            raise Crash("simulated crash")

    with pytest.raises(RLHFError, match=f"iteration {crash_at}: Crash: simulated crash"):
        rlhf(cfg(tiny_model_dir, run), reward=reward, on_iteration=crash)
    saved = 3 * ((crash_at - 1) // 3)
    st = status(run)
    assert st["state"] == "failed" and st["checkpoint_iteration"] == saved
    assert (f"last good checkpoint (iteration {saved})" if saved else
            "no checkpoint was written yet") in st["error"]
    assert len(read_metrics(run / "metrics.jsonl")[0]) == crash_at
    (run / ".checkpoint.pt.tmp999").write_bytes(b"half a checkpoint")  # a kill mid-write
    res = resume_rlhf(run, reward=reward)
    assert res.status == "finished" and status(run)["state"] == "finished"
    assert strip(res.metrics) == strip(uninterrupted.metrics)
    assert (run / "policy" / "config.json").exists()
    assert (run / "policy" / "tokenizer.json").exists()


def test_sigterm_stops_after_the_iteration_and_resume_is_exact(uninterrupted, tiny_model_dir,
                                                               tmp_path):
    """In-process: SIGTERM during iteration 4 (checkpoints every 3) -> the iteration finishes, a
    checkpoint is written, status 'interrupted'; resuming gives the uninterrupted metrics."""
    run = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)

    def signal_self(m):
        if m["iteration"] == 4:
            send_self(signal.SIGTERM)

    res = rlhf(cfg(tiny_model_dir, run), reward=reward, on_iteration=signal_self)
    assert res.status == "interrupted" and len(res.metrics) == 4
    assert status(run)["state"] == "interrupted" and status(run)["checkpoint_iteration"] == 4
    assert torch.load(run / "checkpoint.pt", weights_only=False)["iteration"] == 4
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is restored
    assert strip(resume_rlhf(run, reward=reward).metrics) == strip(uninterrupted.metrics)


def test_second_sigint_stops_at_once(tiny_model_dir, tmp_path):
    run = tmp_path / "run"

    def twice(m):
        if m["iteration"] == 2:
            send_self(signal.SIGINT)
            send_self(signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        rlhf(cfg(tiny_model_dir, run), reward=reward, on_iteration=twice)
    st = status(run)
    assert st["state"] == "interrupted" and st["checkpoint_iteration"] == 0
    assert "second signal" in st["error"]


def test_a_failed_run_is_one_line_exit_1_and_status_failed(tiny_model_dir, tmp_path, capsys,
                                                           monkeypatch):
    from klppo.lm.experiment import Experiment

    real = Experiment.iterate

    def failing(self):
        if self.iteration == 4:
            raise FloatingPointError("loss is nan\nsecond line")
        return real(self)

    monkeypatch.setattr(Experiment, "iterate", failing)
    run = tmp_path / "run"
    capsys.readouterr()
    rc = run_main(["rlhf", "--config", str(_tiny_yaml(tmp_path)), "--model", str(tiny_model_dir),
                   "--out", str(run)])
    needles = ["iteration 5: FloatingPointError: loss is nan second line",
               "last good checkpoint (iteration 3)"]
    assert_one_line_error(rc, capsys.readouterr().err, 1, "rlhf", needles)
    st = status(run)
    assert st["state"] == "failed" and st["checkpoint_iteration"] == 3
    assert needles[1] in st["error"] and "Traceback" in st["traceback"]
    assert torch.load(run / "checkpoint.pt", weights_only=False)["iteration"] == 3


def test_resume_of_a_finished_run_changes_nothing(uninterrupted):
    before = (uninterrupted.run_dir / "metrics.jsonl").read_text()
    res = resume_rlhf(uninterrupted.run_dir, reward=reward)
    assert res.status == "finished"
    assert (uninterrupted.run_dir / "metrics.jsonl").read_text() == before


def _damage(kind: str, run: Path) -> None:
    ck = run / "checkpoint.pt"
    if kind == "empty":
        ck.write_bytes(b"")
    elif kind == "truncated":
        ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    elif kind == "garbage":
        ck.write_bytes(os.urandom(4096))
    elif kind == "foreign":
        torch.save({"iteration": 3, "agent": {}}, ck)
    elif kind == "other_model":
        state = torch.load(ck, weights_only=False)
        state["policy"] = {k: v[..., :1] for k, v in state["policy"].items()}
        torch.save(state, ck)
    elif kind == "short_metrics":
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        (run / "metrics.jsonl").write_text("".join(lines[:2]))
    elif kind == "no_metrics":
        (run / "metrics.jsonl").unlink()
    elif kind == "edited_config":
        import yaml

        data = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**data, "lr": 0.5}))
    elif kind == "past_without_staleness":
        state = torch.load(ck, weights_only=False)
        state["past_policies"] = [state["policy"]]
        torch.save(state, ck)


@pytest.mark.parametrize("kind, needles", [
    ("empty", ["checkpoint=", "checkpoint.pt", "empty file"]),
    ("truncated", ["checkpoint=", "checkpoint.pt", "unreadable"]),
    ("garbage", ["checkpoint=", "checkpoint.pt", "unreadable"]),
    ("foreign", ["checkpoint=", "not an rlhf checkpoint"]),
    ("other_model", ["checkpoint=", "does not fit this run's model"]),
    ("short_metrics", ["metrics.jsonl", "iteration 3", "holds 2"]),
    ("no_metrics", ["metrics.jsonl", "is missing"]),
    ("edited_config", ["config.yaml", "lr=0.5 but the checkpoint was made with"]),
    ("past_without_staleness", ["checkpoint=", "past_policies: 1 saved, but staleness=0"]),
])
def test_resume_refuses_what_it_cannot_continue_exactly(kind, needles, tiny_model_dir, tmp_path,
                                                        capsys):
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == 4:
            raise Crash("stop")

    with pytest.raises(RLHFError):
        rlhf(cfg(tiny_model_dir, run), reward=reward, on_iteration=crash)
    (run / "status.json").write_text('{"state": "running"}')  # as a SIGKILLed run leaves it
    _damage(kind, run)
    capsys.readouterr()
    rc = run_main(["rlhf", "--resume", str(run)])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf", needles)
    st = status(run)
    assert st["state"] == "failed" and needles[0] in st["error"]


def test_a_second_process_is_refused_naming_the_holder(uninterrupted, tiny_model_dir, tmp_path,
                                                       capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    capsys.readouterr()
    with DirLock(busy):
        rc = run_main(["rlhf", "--model", str(tiny_model_dir), "--out", str(busy),
                       "--config", str(_tiny_yaml(tmp_path))])
        assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf",
                              ["in use by", f"pid {os.getpid()}"])
        assert sorted(p.name for p in busy.iterdir()) == [".lock"]
    with DirLock(uninterrupted.run_dir):
        rc = run_main(["rlhf", "--resume", str(uninterrupted.run_dir)])
        assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf",
                              ["in use by", f"pid {os.getpid()}"])
    assert status(uninterrupted.run_dir)["state"] == "finished"


def _tiny_yaml(tmp: Path, **kw) -> Path:
    p = tmp / "tiny.yaml"
    p.write_text("".join(f"{k}: {v}\n" for k, v in {**TINY, "reward": "vader", **kw}.items()))
    return p


def _start(tmp: Path, model: Path, run: Path, **kw) -> subprocess.Popen:
    argv = [sys.executable, "-m", "klppo", "rlhf", "--config", str(_tiny_yaml(tmp, **kw)),
            "--model", str(model), "--out", str(run)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_iteration_checkpoints_and_stops(sig, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    proc = _start(tmp_path, tiny_model_dir, run, iterations=3000, checkpoint_every=1000)
    wait_for_lines(run / "metrics.jsonl", 3)
    if sig == signal.SIGTERM:  # meanwhile, a second process is refused, naming the first
        second = subprocess.run([sys.executable, "-m", "klppo", "rlhf", "--resume", str(run)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert_one_line_error(second.returncode, second.stderr, 2, "rlhf",
                              ["in use by", f"pid {proc.pid}"])
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err  # 130 for SIGINT, 143 for SIGTERM
    assert "status: interrupted" in out and f"klppo rlhf --resume {run}" in out
    n = len(read_metrics(run / "metrics.jsonl")[0])
    assert 3 <= n < 3000
    assert torch.load(run / "checkpoint.pt", weights_only=False)["iteration"] == n
    st = status(run)
    assert st["state"] == "interrupted" and st["checkpoint_iteration"] == n


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tiny_model_dir, tmp_path):
    """The promise, end to end: a real `python -m klppo rlhf` killed with SIGKILL mid-run, then
    `klppo rlhf --resume` (another real process), ends with the uninterrupted run's metrics."""
    n_iter = 60
    full = rlhf(RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "full"),
                           **{**TINY, "iterations": n_iter, "checkpoint_every": 4}))
    run = tmp_path / "killed"
    proc = _start(tmp_path, tiny_model_dir, run, iterations=n_iter, checkpoint_every=4)
    wait_for_lines(run / "metrics.jsonl", 11)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_before = len((run / "metrics.jsonl").read_text().splitlines())
    assert 11 <= n_before < n_iter, "the run must be killed mid-way"
    assert status(run)["state"] == "running"
    res = subprocess.run([sys.executable, "-m", "klppo", "rlhf", "--resume", str(run)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    assert strip(read_metrics(run / "metrics.jsonl")[0]) == strip(full.metrics)
    assert status(run)["state"] == "finished"
    shutil.rmtree(tmp_path / "full")


def _stale_past(kind: str, run: Path) -> None:
    ck = run / "checkpoint.pt"
    state = torch.load(ck, weights_only=False)
    past = state["past_policies"]
    if kind == "empty_list":
        state["past_policies"] = []
    elif kind == "ten_copies":
        state["past_policies"] = [past[0]] * 10
    elif kind == "last_not_policy":
        state["past_policies"] = [past[0]] * len(past)
    elif kind == "wrong_shape":
        state["past_policies"] = [{k: v[..., :1] for k, v in p.items()} for p in past]
    elif kind == "strings":
        state["past_policies"] = ["a", "b"]
    elif kind == "empty_dicts":
        state["past_policies"] = [{}, {}]
    elif kind == "staleness_edited":
        text = (run / "config.yaml").read_text()
        (run / "config.yaml").write_text(text.replace("staleness: 2", "staleness: 1"))
        return
    torch.save(state, ck)


@pytest.mark.parametrize("kind, needle", [
    ("empty_list", "past_policies: not 1 to 3 finite state dicts"),
    ("ten_copies", "past_policies: not 1 to 3 finite state dicts"),
    ("last_not_policy", "past_policies: the last is not the checkpoint's policy"),
    ("wrong_shape", "past_policies: not 1 to 3 finite state dicts"),
    ("strings", "past_policies: not 1 to 3 finite state dicts"),
    ("empty_dicts", "past_policies: not 1 to 3 finite state dicts"),
    ("staleness_edited", "staleness=1 but the checkpoint was made with 2"),
])
def test_a_stale_runs_past_policies_and_config_are_checked_on_resume(kind, needle,
                                                                     tiny_model_dir, tmp_path,
                                                                     capsys):
    """klppo rlhf --staleness 2: what klppo train refuses on resume, refused here too, in one
    line before any iteration (a past policy that is not the run's would train silently on
    other numbers)."""
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == 4:
            raise Crash("stop")

    with pytest.raises(RLHFError):
        rlhf(cfg(tiny_model_dir, run, staleness=2, mismatch_correction="tis"), reward=reward,
             on_iteration=crash)
    _stale_past(kind, run)
    capsys.readouterr()
    rc = run_main(["rlhf", "--resume", str(run)])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf", [needle])
    assert status(run)["state"] == "failed"
