"""The one run loop (klppo.runs.loop) with stand-in trainers: however a run ends, its status.json
says how, its trainer is closed and its lock released; a second signal anywhere (while the
sinks open, while a run ends) leaves 'interrupted', never 'running'."""

import json

import pytest

from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.errors import RunFailed, RunInterrupted
from klppo.runs.lifecycle import RunLife, StopRun
from klppo.runs.loop import run_group, run_iterations


class Trainer:
    """Counts to ``n`` iterations; ``fail_at`` raises there; ``closed`` after close()."""

    def __init__(self, n=3, fail_at=None):
        self.iteration, self.n, self.fail_at, self.closed, self.saved = 0, n, fail_at, False, []

    num_iterations = property(lambda self: self.n)
    checkpoint_every = property(lambda self: 2)

    def iterate(self):
        if self.iteration + 1 == self.fail_at:
            raise RuntimeError("boom")
        self.iteration += 1
        return {"iteration": self.iteration}

    def describe(self, m):
        return ""

    def check(self, m):
        return []

    def checkpoint(self, run_dir):
        self.saved.append(self.iteration)
        return [(run_dir / "checkpoint.pt", b"%d" % self.iteration)]

    def close(self):
        self.closed = True


def life(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    return RunLife(d, R.DirLock(d).acquire())


def status(lf):
    return json.loads((lf.run_dir / "status.json").read_text())


def writer(lf):
    return M.MetricsWriter([M.JsonlSink(lf.run_dir / "metrics.jsonl")])


def unlocked(lf):
    R.DirLock(lf.run_dir).acquire().release()  # raises if still held
    return True


def test_a_run_alone_finishes_fails_or_stops_as_asked(tmp_path):
    lf, tr = life(tmp_path, "a"), Trainer()
    assert run_iterations(tr, lf, lambda: writer(lf), None, RunFailed) == "finished"
    assert status(lf)["state"] == "finished" and tr.closed and unlocked(lf)
    lf, tr = life(tmp_path, "b"), Trainer(fail_at=2)
    with pytest.raises(RunFailed, match="iteration 2: RuntimeError: boom"):
        run_iterations(tr, lf, lambda: writer(lf), None, RunFailed)
    assert status(lf)["state"] == "failed" and tr.closed and unlocked(lf)

    def prune(m):
        raise StopRun("pruned", "enough")

    lf, tr = life(tmp_path, "c"), Trainer()
    assert run_iterations(tr, lf, lambda: writer(lf), prune, RunFailed) == "pruned"
    assert status(lf)["reason"] == "enough" and tr.saved == [1] and unlocked(lf)


def test_a_second_signal_while_the_sinks_open_leaves_every_run_interrupted(tmp_path):
    lives, trs = [life(tmp_path, f"r{i}") for i in range(2)], [Trainer(), Trainer()]

    def make_writer(i):
        if i == 1:
            raise KeyboardInterrupt
        return writer(lives[i])

    with pytest.raises(KeyboardInterrupt):
        run_group(trs, lives, lambda live: [t.iterate() for t in trs], make_writer)
    for lf, tr in zip(lives, trs):
        assert status(lf)["state"] == "interrupted" and tr.closed and unlocked(lf)
    lf, tr = life(tmp_path, "alone"), Trainer()

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        run_iterations(tr, lf, interrupt, None, RunFailed)
    assert status(lf)["state"] == "interrupted" and tr.closed and unlocked(lf)


def test_a_second_signal_while_a_run_ends_does_not_leave_it_running(tmp_path):
    lf, tr = life(tmp_path, "a"), Trainer(n=1)

    class ClosingInterrupted(M.MetricsWriter):
        def close(self):
            super().close()
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        run_iterations(tr, lf, lambda: ClosingInterrupted([M.JsonlSink(
            lf.run_dir / "metrics.jsonl")]), None, RunFailed)
    assert status(lf)["state"] == "interrupted" and tr.closed and unlocked(lf)


def test_a_run_whose_checkpoint_cannot_be_written_fails_alone(tmp_path):
    """A group's checkpoints are written together: the run whose file cannot be written fails
    naming it, with its previous checkpoint kept; the other run finishes with its own."""
    class Homeless(Trainer):
        def checkpoint(self, run_dir):
            if self.iteration < 4:
                return super().checkpoint(run_dir)
            self.saved.append(self.iteration)
            return [(run_dir / "gone" / "checkpoint.pt", b"x")]

    lives = [life(tmp_path, "a"), life(tmp_path, "b")]
    trs = [Trainer(n=5), Homeless(n=5)]

    def iterate_all(live):
        return [trs[i].iterate() for i in live]

    states, errors = run_group(trs, lives, iterate_all, lambda i: writer(lives[i]))
    assert states == ["finished", "failed"]
    assert "gone/checkpoint.pt" in errors[1] and "iteration 2" in errors[1]
    assert (lives[0].run_dir / "checkpoint.pt").read_bytes() == b"5"
    assert (lives[1].run_dir / "checkpoint.pt").read_bytes() == b"2"
    assert trs[0].saved == [2, 4, 5] and trs[1].saved == [2, 4]
    assert all(unlocked(lf) for lf in lives)


def test_a_stop_requested_while_the_checkpoints_are_written_checkpoints_every_run(tmp_path):
    """SIGINT arrives while run 0 writes its checkpoint (every 2 iterations): run 1, not due
    (every 5), must still finish the iteration with a checkpoint before it ends 'interrupted'."""
    import signal

    from tests.signalguard import send_self

    class Signalling(Trainer):
        def checkpoint(self, run_dir):
            send_self(signal.SIGINT)
            return super().checkpoint(run_dir)

    class Rare(Trainer):
        checkpoint_every = property(lambda self: 5)

    lives, trs = [life(tmp_path, "a"), life(tmp_path, "b")], [Signalling(n=6), Rare(n=6)]
    states, _ = run_group(trs, lives, lambda live: [trs[i].iterate() for i in live],
                          lambda i: writer(lives[i]))
    assert states == ["interrupted", "interrupted"]
    assert trs[0].saved == [2] and trs[1].saved == [2]
    assert [status(lf)["checkpoint_iteration"] for lf in lives] == [2, 2]
