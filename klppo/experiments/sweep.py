"""Sweeps: a grid of conditions x seeds, each run through the same entry point as ``klppo train``.

A sweep directory holds ``spec.yaml`` (what was asked), ``index.json`` (one entry per run:
name, condition, seed, overrides, state, error), ``.lock`` (held by the one sweep process
writing it) and ``runs/{name}/`` run directories. Re-running a sweep skips finished runs and
resumes the others from their checkpoints. Every run is its own process
(``python -m klppo.experiments.worker RUN_DIR``, see :mod:`klppo.experiments.launch`), so a
crash, even a segfault, takes down only that run; the sweep records its error and carries on.

Stopping: a first SIGINT or SIGTERM (or :meth:`SweepStop.request`) stops launching runs and
asks the running ones to finish their iteration, checkpoint and stop; they are recorded as
``interrupted``. A second one kills them (SIGKILL); they are still recorded as ``interrupted``
and resume from their last checkpoint. If the sweep itself is killed, its workers stop
themselves the same graceful way.

Groups: every run trains in klppo's one engine, whose unit is a group of runs
(:mod:`klppo.rl.engine`). By default the runs that can share a group are spread over the
workers, one group per worker and shape (:mod:`klppo.experiments.batching`; with Ray, one task
per group), each run still in its own run directory; a crash of that process takes its whole
group down (each run resumes from its last checkpoint at the next invocation). A group size of
1 (``--group-size 1``) trains each run in a worker process of its own.

Backends: ``local`` (default) runs at most ``workers`` processes at once on this machine;
``ray`` submits the same worker function as Ray tasks (one CPU each) to the cluster named by
``RAY_ADDRESS`` (or a local instance), for a user who outgrows one machine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from klppo.experiments.batching import plan_groups
from klppo.experiments.launch import run_group, run_one
from klppo.experiments.pool import Done, SweepStop, run_local, signals_to, units
from klppo.experiments.sweep_spec import (
    DEMO_SPEC,
    MAX_RUNS,
    RunPlan,
    SweepSpec,
    check_envs,
    expand,
    load_spec,
)
from klppo.rl import config as C
from klppo.runs import rundir as R
from klppo.runs.configfile import InputError, read_text
from klppo.runs.install import install_hint
from klppo.runs.owned import container_reason
from klppo.runs.typecheck import short_repr

log = logging.getLogger(__name__)

__all__ = ["SweepSpec", "RunEntry", "SweepResult", "SweepStop", "expand", "load_spec",
           "check_envs", "run_sweep", "run_one", "plan_groups", "worker_count",
           "DEMO_SPEC",
           "MAX_RUNS"]

Backend = Literal["local", "ray"]


@dataclass
class RunEntry:
    name: str
    condition: str
    seed: int
    overrides: dict[str, Any]
    state: str = "pending"
    """pending (not started), running, finished, failed or interrupted (resumable)"""
    error: str | None = None
    wall_s: float | None = None
    """wall time of this run's worker process in this sweep invocation (None: not run)"""


@dataclass
class SweepResult:
    sweep_dir: Path
    entries: list[RunEntry]
    stop_signal: int | None = None
    """the signal that stopped the sweep early (SIGINT, SIGTERM), or None"""

    def _in(self, state: str) -> list[RunEntry]:
        return [e for e in self.entries if e.state == state]

    @property
    def finished(self) -> list[RunEntry]:
        return self._in("finished")

    @property
    def failed(self) -> list[RunEntry]:
        return self._in("failed")

    @property
    def interrupted(self) -> list[RunEntry]:
        return self._in("interrupted")

    @property
    def not_started(self) -> list[RunEntry]:
        return self._in("pending")

    @property
    def unfinished(self) -> list[RunEntry]:
        return [e for e in self.entries if e.state != "finished"]


def _write_index(sweep_dir: Path, entries: list[RunEntry]) -> None:
    R.write_json_atomic(sweep_dir / "index.json",
                        {"runs": [dataclasses.asdict(e) for e in entries]})


def _open_sweep_dir(sweep_dir: Path, spec: SweepSpec) -> R.DirLock:
    """Create (or reopen) the sweep directory and take its lock; refuse a different spec, or
    a directory where the sweep's files would land on what a run or study owns."""
    owned = container_reason(sweep_dir, "sweep", "out")
    if owned is not None:
        raise C.ConfigError(owned)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise C.ConfigError(f"out={str(sweep_dir)!r}: exists and is not a directory")
    runs = sweep_dir / "runs"
    if runs.exists() and not runs.is_dir():  # before anything is written there
        raise C.ConfigError(f"out={str(sweep_dir)!r}: its {runs.name!r} is a file, where the "
                            f"sweep keeps its run directories; move it or choose another --out")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = R.DirLock(sweep_dir, "sweep directory").acquire()
    spec_path, spec_dict = sweep_dir / "spec.yaml", dataclasses.asdict(spec)
    try:
        old = R.read_yaml(spec_path, "spec") if spec_path.exists() else spec_dict
    except InputError as e:
        lock.release()
        raise C.ConfigError(f"{e}; this sweep directory's spec is damaged (choose another "
                            f"--out, or restore or delete the file)") from None
    if old != spec_dict:
        lock.release()
        raise C.ConfigError(f"out={str(sweep_dir)!r}: holds a different sweep spec; choose "
                            f"another directory or delete it")
    R.write_yaml(spec_path, spec_dict)
    (sweep_dir / "runs").mkdir(exist_ok=True)
    return lock


def _status(run_dir: Path) -> dict[str, Any]:
    """A run's status.json ({} when there is none); a damaged one is a ConfigError naming it."""
    path = run_dir / "status.json"
    if not path.exists():
        return {}
    try:
        st = json.loads(read_text(path, "status"))
    except InputError as e:
        raise C.ConfigError(str(e)) from None
    except (ValueError, RecursionError) as e:
        raise C.ConfigError(f"status={str(path)!r}: not valid JSON ({type(e).__name__}); "
                            f"restore or delete "
                            f"it (the run then resumes from its checkpoint)") from None
    if not isinstance(st, dict) or not isinstance(st.get("state", ""), str):
        raise C.ConfigError(f"status={str(path)!r}: {short_repr(st, 60)} is not a run status; "
                            f"restore or delete it (the run then resumes from its checkpoint)")
    return st


def _grouped(cfg: C.TrainConfig, sweep_dir: Path) -> C.TrainConfig:
    """A run that logs to W&B without a group of its own goes in the sweep's group (the sweep
    directory's name), so W&B shows a sweep's runs together."""
    if cfg.track != "wandb" or cfg.wandb.group is not None:
        return cfg
    name = sweep_dir.resolve().name or "sweep"
    group = "".join("-" if c in "/\\#?%:" else c for c in name)[:128]  # what W&B accepts
    return dataclasses.replace(cfg, wandb=dataclasses.replace(cfg.wandb, group=group))


def _prepare(sweep_dir: Path, planned: list[RunPlan]) -> list[RunEntry]:
    for plan in planned:
        path = sweep_dir / "runs" / plan.name
        if path.exists() and not path.is_dir():
            raise C.ConfigError(f"{path}: a file where run {plan.name} keeps its directory; "
                                f"move it or choose another --out")
    statuses = [_status(sweep_dir / "runs" / plan.name) for plan in planned]  # before writing
    entries = []
    for plan, st in zip(planned, statuses):
        run_dir = sweep_dir / "runs" / plan.name
        run_dir.mkdir(exist_ok=True)
        if not (run_dir / "config.yaml").exists():
            cfg = _grouped(dataclasses.replace(plan.config, out=str(run_dir)), sweep_dir)
            R.write_yaml(run_dir / "config.yaml", C.to_dict(cfg))
        got = st.get("state")
        state = got if isinstance(got, str) and got in ("finished", "failed", "interrupted") \
            else "pending"
        entries.append(RunEntry(plan.name, plan.condition, plan.seed, plan.overrides, state,
                                st.get("error") if state == "failed" else None))
    return entries


def run_sweep(
    spec: SweepSpec,
    sweep_dir: str | Path,
    backend: Backend = "local",
    workers: int | None = None,
    on_done: Callable[[RunEntry], None] | None = None,
    stop: SweepStop | None = None,
    max_runs: int = MAX_RUNS,
    group_size: int | None = None,
    on_start: Callable[[], None] | None = None,
) -> SweepResult:
    """Run every run of ``spec`` under ``sweep_dir``; idempotent, crash-isolated, stoppable.
    ``on_start`` is called once every check has passed and the directory is open, before the
    first run starts.

    The runs that can share a group train together, one group per worker and shape
    (:mod:`klppo.experiments.batching`: at most ``group_size`` runs each when given;
    ``group_size=1``: each run in a worker process of its own).

    Everything is checked before ``sweep_dir`` is created (:class:`~klppo.rl.config.ConfigError`;
    more than ``max_runs`` runs is refused);
    a directory another sweep holds raises :class:`~klppo.runs.rundir.DirBusyError`.
    """
    sweep_dir, stop = Path(sweep_dir), stop or SweepStop()
    planned = expand(spec, max_runs)
    check_envs(planned)
    order = sorted(planned, key=lambda p: spec.seeds.index(p.seed))
    if backend not in ("local", "ray"):
        raise C.ConfigError(f"backend={backend!r}: must be 'local' or 'ray'")
    worker_count(workers)  # checked before Ray starts
    runner = run_local if backend == "local" else _ray_runner()
    workers = worker_count(workers if backend == "local" else workers or _ray_cpus())
    groups, notes = plan_groups(order, group_size, workers)
    for note in notes:
        log.warning("%s", note)
    lock = _open_sweep_dir(sweep_dir, spec)
    try:
        entries = _prepare(sweep_dir, planned)
        _write_index(sweep_dir, entries)
        if on_start is not None:
            on_start()
        by_name = {e.name: e for e in entries}

        def update(name: str, res: dict[str, Any]) -> None:
            e = by_name[name]
            e.state, e.error, e.wall_s = res["state"], res.get("error"), res.get("wall_s")
            _write_index(sweep_dir, entries)
            if on_done is not None and e.state not in ("running", "pending"):
                on_done(e)

        # seed by seed: a sweep stopped part way holds whole comparisons (every condition at
        # the first seeds), not every seed of the first conditions
        todo = {e.name: str(sweep_dir / "runs" / e.name)
                for e in sorted(entries, key=lambda e: spec.seeds.index(e.seed))
                if e.state != "finished"}
        with signals_to(stop):
            if groups:
                runner(todo, workers, update, stop, groups)
            else:
                runner(todo, workers, update, stop)
    finally:
        lock.release()
    return SweepResult(sweep_dir, entries, stop.signal)


def worker_count(workers: int | None) -> int:
    """The number of parallel worker processes: ``workers``, default one per core (the ray
    backend: one per CPU of the cluster)."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise C.ConfigError(f"workers={workers!r}: must be an integer >= 1")
    return workers or max(1, os.cpu_count() or 1)


# -------------------------------------------------------------------------------- ray backend
class _Runner(Protocol):
    """What runs a sweep's runs: :func:`~klppo.experiments.pool.run_local`, or :func:`_ray`."""

    def __call__(self, dirs: dict[str, str], workers: int, update: Done, stop: SweepStop,
                 groups: list[list[str]] | None = None) -> None: ...


def _ray_runner() -> _Runner:
    try:
        import ray
    except ImportError:
        raise C.ConfigError(f"backend='ray': needs the ray extra: {install_hint('ray')}") \
            from None
    if not ray.is_initialized():  # before our signal handlers: ray.init installs its own
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # a shell's background job (`klppo sweep ... &`) ignores SIGINT, and so would every
            # Ray worker started from here: ray.cancel, which stops a running task with SIGINT,
            # would then never reach it
            signal.signal(signal.SIGINT, signal.default_int_handler)
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    return _ray


def _ray_cpus() -> int:
    """The Ray cluster's CPUs: the default worker count of the ray backend (a batched sweep
    spreads each shape's runs over them, one task per group)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _ray(dirs: dict[str, str], workers: int, update: Done, stop: SweepStop,
         groups: list[list[str]] | None = None) -> None:
    import ray

    one, group = ray.remote(num_cpus=1)(run_one), ray.remote(num_cpus=1)(run_group)
    pending: dict[Any, list[str]] = {}
    for unit in units(dirs, groups):
        names = [n for n, _ in unit]
        ref = one.remote(unit[0][1]) if len(unit) == 1 else group.remote([d for _, d in unit])
        pending[ref] = names
    cancelled = 0
    while pending:
        if stop.requests > cancelled:  # running tasks get KeyboardInterrupt (run_one forwards
            cancelled = stop.requests  # it to the worker); queued ones never start
            for ref in pending:
                ray.cancel(ref, force=cancelled > 1)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
        for ref in ready:
            names = pending.pop(ref)
            if len(names) == 1:
                update(names[0], _ray_result(ray, ref, dirs[names[0]]))
                continue
            results = _ray_result(ray, ref, None)
            for name in names:
                update(name, results.get(dirs[name]) or _ray_lost(results, dirs[name]))


def _ray_result(ray: Any, ref: Any, run_dir: str | None) -> dict[str, Any]:
    """The task's result; for a lost or cancelled one, what ``run_dir``'s status says (a batched
    group's task, ``run_dir`` None: ``{"lost": {...}}`` for each run to read its own)."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:  # cancelled before it started
        lost: dict[str, Any] = {"state": "pending"}
    except Exception as e:  # noqa: BLE001 - a lost worker is one failed (or stopped) run
        lost = {"state": "failed", "error": repr(e)}
    return {"lost": lost} if run_dir is None else _ray_lost({"lost": lost}, run_dir)


def _ray_lost(results: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """A run whose task returned nothing for it: its own status if it ended, else the loss."""
    state = (R.read_status(Path(run_dir)) or {}).get("state")
    if state in ("finished", "interrupted"):
        return {"state": state}
    return results.get("lost", {"state": "failed", "error": "the batched worker returned no "
                                "result for this run"})
