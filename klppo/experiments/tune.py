"""``run_tune(spec, tune_dir) -> TuneResult``: an Optuna study whose trials are training runs.

Each trial samples the spec's space (TPE by default), then trains one ordinary run directory
per seed under ``TUNE_DIR/runs/`` (``klppo report``, ``klppo eval`` and ``--resume`` read them
as any run). Its value is the KLip-PPO final return (:func:`klppo.runs.protocol.final_return`:
the mean return of the episodes that ended in the last 10% of the steps), averaged over the
seeds. While a run trains, the same protocol over the steps so far is reported to Optuna
:data:`REPORTS` times; the median pruner stops a trial (status ``pruned``, its checkpoint kept)
whose estimate falls below the median of earlier trials at the same step, after the first
:data:`WARMUP` of its steps and ``startup_trials`` trials.

The study lives in ``TUNE_DIR/study.journal``, Optuna's journal file: JSON lines (data; nothing
in it is executed). The directory is resumable: rerunning the same spec continues the study,
and a trial that a signal or a crash left running resumes its run from the last checkpoint
(exactly, as ``klppo train --resume`` does) before new trials start. ``TUNE_DIR/index.json``
lists the trials and their runs; ``TUNE_DIR/best_config.yaml`` is the best trial's config.
"""

from __future__ import annotations

import dataclasses
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klppo.experiments.sweep_spec import RunPlan, _safe, check_envs
from klppo.experiments.tune_spec import TuneSpec
from klppo.rl import config as C
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.configfile import InputError
from klppo.runs.errors import RunFailed
from klppo.runs.install import install_hint
from klppo.runs.lifecycle import OnIteration, StopRun
from klppo.runs.owned import container_reason
from klppo.runs.protocol import final_return

__all__ = ["TuneResult", "TrialEntry", "run_tune", "require_optuna", "JOURNAL", "REPORTS",
           "WARMUP"]

JOURNAL, SPEC_FILE, STUDY = "study.journal", "tune.yaml", "klppo"
#: intermediate values reported per run, and the share of a run's steps before it may be pruned
REPORTS, WARMUP = 20, 0.3


@dataclass
class TrialEntry:
    """One trial: Optuna's state (complete, pruned, fail, running), its value (the mean final
    return; a pruned trial's is its last estimate, as Optuna keeps it), its sampled values,
    its run directories (names under ``runs/``) and why it failed."""

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    runs: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class TuneResult:
    tune_dir: Path
    trials: list[TrialEntry]
    #: the signal that stopped the study (None: it ran its trials)
    stop_signal: int | None = None

    @property
    def best(self) -> TrialEntry | None:
        done = [t for t in self.trials if t.state == "complete" and t.value is not None]
        return max(done, key=lambda t: t.value) if done else None  # type: ignore[arg-type,return-value]


def require_optuna() -> Any:
    """The optuna module; a ConfigError naming the pip command when it is missing."""
    try:
        import optuna
    except ImportError as e:
        raise C.ConfigError(f"klppo tune needs the tune extra: {install_hint('tune')} "
                            f"({e})") from None
    return optuna


def run_tune(spec: TuneSpec, tune_dir: str | Path,
             on_trial: Callable[[TrialEntry], None] | None = None,
             on_iteration: OnIteration = None) -> TuneResult:
    """Run (or continue) the study of ``spec`` in ``tune_dir`` until it holds ``spec.trials``
    trials or a signal stops it. Everything is checked before ``tune_dir`` is made: the spec
    (:class:`~klppo.rl.config.ConfigError`), the optuna package, the environments, and a
    directory that holds another study."""
    tune_dir = Path(tune_dir)
    spec.check()
    optuna = require_optuna()
    _check_envs(spec)
    _check_dir(tune_dir, spec)
    tune_dir.mkdir(parents=True, exist_ok=True)
    lock = R.DirLock(tune_dir, "tuning directory").acquire()
    try:
        _check_dir(tune_dir, spec)  # another process may have started a study meanwhile
        R.write_yaml(tune_dir / SPEC_FILE, spec.identity())
        (tune_dir / "runs").mkdir(exist_ok=True)
        study = _study(optuna, spec, tune_dir)
        runner = _Runner(optuna, study, spec, tune_dir, on_trial, on_iteration)
        stop_signal = runner.run()
        result = TuneResult(tune_dir, _entries(study), stop_signal)
        _write_index(result, spec, _importance(optuna, study))
    finally:
        lock.release()
    return result


def _check_envs(spec: TuneSpec) -> None:
    """Every environment the study can train is installed and single-agent (the study
    maximises one return)."""
    from klppo.rl.marl.spec import is_multiagent

    base = spec.base_config()
    envs = {base.env} | {c for p in spec.params() if p.name == "env" for c in p.choices}
    for env in sorted(envs, key=str):
        if is_multiagent(env):
            raise C.ConfigError(f"env={env!r}: klppo tune maximises one return; a multi-agent "
                                f"env has one per policy (tune a single-agent env)")
    plans = [RunPlan("check", "check", base.seed, {}, dataclasses.replace(base, env=e))
             for e in sorted(envs, key=str)]
    check_envs(plans)


def _check_dir(tune_dir: Path, spec: TuneSpec) -> None:
    owned = container_reason(tune_dir, "tuning study", "out")
    if owned is not None:  # a run's or sweep's file or folder: never written
        raise C.ConfigError(owned)
    if tune_dir.exists() and not tune_dir.is_dir():
        raise C.ConfigError(f"out={str(tune_dir)!r}: exists and is not a directory")
    path = tune_dir / SPEC_FILE
    if not path.exists():
        if tune_dir.exists() and any(p.name != ".lock" for p in tune_dir.iterdir()):
            raise C.ConfigError(f"out={str(tune_dir)!r}: a directory that is not a tuning "
                                f"study (no {SPEC_FILE}); choose another --out")
        return
    try:
        old = R.read_yaml(path, "spec")
    except InputError as e:
        raise C.ConfigError(f"{e}; this tuning directory's spec is damaged (restore or delete "
                            f"it, or choose another --out)") from None
    if old != spec.identity():
        raise C.ConfigError(f"out={str(tune_dir)!r}: holds a study of another spec (only "
                            f"`trials` may change); choose another --out or delete it")


def _study(optuna: Any, spec: TuneSpec, tune_dir: Path) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = tune_dir / JOURNAL
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        done = len(storage.get_all_trials(storage.get_study_id_from_name(STUDY),
                                          deepcopy=False))
    except KeyError:  # a new study
        done = 0
    except (ValueError, TypeError, AttributeError, IndexError) as e:  # a damaged journal
        raise _damaged(path, e) from None
    seed = spec.sampler_seed + done  # a resumed study draws on, reproducibly
    sampler = (optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.startup_trials)
               if spec.sampler == "tpe" else optuna.samplers.RandomSampler(seed=seed))
    steps = spec.base_config().num_iterations * spec.base_config().batch_size
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials,
                                          n_warmup_steps=int(WARMUP * steps))
              if spec.pruner == "median" else optuna.pruners.NopPruner())
    try:
        return optuna.create_study(storage=storage, study_name=STUDY, direction="maximize",
                                   sampler=sampler, pruner=pruner, load_if_exists=True)
    except (ValueError, TypeError, AttributeError, IndexError) as e:  # a damaged journal
        raise _damaged(path, e) from None


def _damaged(path: Path, e: BaseException) -> C.ConfigError:
    return C.ConfigError(f"{path}: cannot be read as Optuna's journal ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:120]}); restore it, or delete the tuning "
                         f"directory to start again")


class _Runner:
    """The study's loop: trials left running by a stopped process first, then new ones."""

    def __init__(self, optuna: Any, study: Any, spec: TuneSpec, tune_dir: Path,
                 on_trial: Callable[[TrialEntry], None] | None,
                 on_iteration: OnIteration) -> None:
        self.optuna, self.study, self.spec, self.dir = optuna, study, spec, tune_dir
        self.on_trial, self.on_iteration = on_trial, on_iteration
        self.params = spec.params()

    def run(self) -> int | None:
        """Run trials until the budget is spent; the signal that stopped it, if one did."""
        running = self.optuna.trial.TrialState.RUNNING
        for frozen in self.study.get_trials(deepcopy=False, states=(running,)):
            trial = self.optuna.trial.Trial(self.study, frozen._trial_id)
            sig = self.trial(trial, dict(frozen.params))
            if sig is not None:
                return sig
        while len(self.study.get_trials(deepcopy=False)) < self.spec.trials:
            trial = self.study.ask()
            sig = self.trial(trial, {p.name: p.suggest(trial) for p in self.params})
            if sig is not None:
                return sig
        return None

    def trial(self, trial: Any, values: dict[str, Any]) -> int | None:
        """Check the trial's configs (a draw the config refuses is an ``invalid`` trial, with
        its reason, and no run is made), then train its runs, one per seed, and tell Optuna how
        it ended."""
        try:
            configs = [self.spec.config(values, seed, "-") for seed in self.spec.seeds]
        except C.ConfigError as e:
            trial.set_user_attr("invalid", True)
            self._tell(trial, "invalid", error=" ".join(str(e).split())[:300])
            return None
        finals, names = [], []
        for k, (seed, cfg) in enumerate(zip(self.spec.seeds, configs)):
            try:
                names.append(_safe(f"{cfg.env}__trial{trial.number:04d}__{seed}"))
                trial.set_user_attr("runs", names)
                res = self._train(trial, cfg, self.dir / "runs" / names[-1],
                                  k * cfg.num_iterations * cfg.batch_size)
            except (RunFailed, C.ConfigError, ValueError, OSError) as e:
                self._tell(trial, "fail", error=" ".join(str(e).split())[:300])
                return None
            if res.status == "interrupted":
                return res.stop_signal or signal.SIGINT
            if res.status == "pruned":
                self._tell(trial, "pruned")
                return None
            finals.append(res.final_return)
        value = sum(finals) / len(finals)
        if math.isnan(value):
            self._tell(trial, "fail", error="no training episode ended in the last 10% "
                                            "of the steps: no final return")
            return None
        self._tell(trial, "complete", value)
        return None

    def _train(self, trial: Any, cfg: C.TrainConfig, run_dir: Path, offset: int) -> Any:
        from klppo.rl.trainer import TrainResult, resume, train

        report = _Reporter(trial, run_dir, offset, cfg.num_iterations, self.on_iteration)
        if _state(run_dir) == "pruned":  # pruned before this process could tell Optuna
            return TrainResult(run_dir, [], "pruned")
        if (run_dir / "config.yaml").exists():
            return resume(run_dir, on_iteration=report)
        return train(dataclasses.replace(cfg, out=str(run_dir)), on_iteration=report)

    def _tell(self, trial: Any, state: str, value: float | None = None,
              error: str | None = None) -> None:
        """Tell Optuna how the trial ended (and ``on_trial``); None: the study goes on."""
        states = self.optuna.trial.TrialState
        if error is not None:
            trial.set_user_attr("error", error)
        if state == "complete":
            self.study.tell(trial, value)
        else:  # an invalid draw is a failed trial to Optuna (its sampler learns to avoid it)
            self.study.tell(trial, state=states.PRUNED if state == "pruned" else states.FAIL)
        if self.on_trial is not None:
            self.on_trial(TrialEntry(trial.number, state, value, dict(trial.params),
                                     list(trial.user_attrs.get("runs", [])), error))
        return None


class _Reporter:
    """An ``on_iteration`` callback: the final-return protocol over the steps so far, reported
    :data:`REPORTS` times per run at step ``offset + global_step``; a trial the pruner stops
    ends its run with :class:`~klppo.runs.lifecycle.StopRun`."""

    def __init__(self, trial: Any, run_dir: Path, offset: int, iterations: int,
                 chain: OnIteration) -> None:
        self.trial, self.run_dir, self.offset, self.chain = trial, run_dir, offset, chain
        self.every = max(1, iterations // REPORTS)

    def __call__(self, m: dict[str, Any]) -> None:
        if self.chain is not None:
            self.chain(m)
        if m["iteration"] % self.every:
            return
        records, _ = M.read_metrics(self.run_dir / "metrics.jsonl")
        value = final_return([r for r in records if r.get("iteration", 0) <= m["iteration"]])
        if math.isnan(value):  # no episode ended in the window yet
            return
        self.trial.report(value, self.offset + int(m["global_step"]))
        if self.trial.should_prune():
            raise StopRun("pruned", f"pruned by klppo tune at step {m['global_step']:,}: its "
                                    f"final-return estimate {value:.4g} is below the median of "
                                    f"earlier trials at that step")


def _state(run_dir: Path) -> str | None:
    """The state in a run's status.json (None: none, or not a status)."""
    st = R.read_status(run_dir)
    return st.get("state") if isinstance(st, dict) else None


def _entries(study: Any) -> list[TrialEntry]:
    names = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "fail", "RUNNING": "running",
             "WAITING": "waiting"}
    return [TrialEntry(t.number, "invalid" if t.user_attrs.get("invalid") else
                       names.get(t.state.name, t.state.name.lower()), t.value,
                       dict(t.params), list(t.user_attrs.get("runs", [])),
                       t.user_attrs.get("error")) for t in study.get_trials(deepcopy=False)]


def _importance(optuna: Any, study: Any) -> dict[str, float]:
    """Optuna's parameter importances over the complete trials, normalised to sum to 1:
    PED-ANOVA (Optuna's evaluator that needs no scikit-learn) scores how differently each
    parameter is distributed among the best trials than among all of them. Empty below two
    complete trials or when Optuna cannot compute them (one value for every trial)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(complete) < 2 or not any(t.params for t in complete):
        return {}
    try:
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
    return {k: float(v) for k, v in found.items()}


def _write_index(result: TuneResult, spec: TuneSpec,
                 importance: dict[str, float] | None = None) -> None:
    """index.json (the sweep format, a run per trial and seed, plus the trials and the
    parameters' importance) and best_config.yaml (the best trial's config, for ``klppo train
    --config``). A pruned trial's runs are labelled so in the report."""
    runs = []
    for t in result.trials:
        label = f"trial{t.number:04d}" + (" (pruned)" if t.state == "pruned" else "")
        for name, seed in zip(t.runs, spec.seeds):
            runs.append({"name": name, "condition": label, "seed": seed,
                         "overrides": t.params,
                         "state": _state(result.tune_dir / "runs" / name) or "pending",
                         "error": t.error, "wall_s": None})
    best = result.best
    R.write_json_atomic(result.tune_dir / "index.json", {
        "kind": "tune", "runs": runs, "trials": [dataclasses.asdict(t) for t in result.trials],
        "best_trial": None if best is None else best.number,
        "importance": importance or {}})
    if best is not None:
        cfg = spec.config(best.params, spec.seeds[0], "-")
        R.write_yaml(result.tune_dir / "best_config.yaml",
                     {**C.to_dict(cfg), "out": None})
