"""``rlhf(config) -> RLHFResult``: PPO on a language model with a KL penalty to a reference;
``resume_rlhf(run_dir)`` continues a run from its last checkpoint exactly.

The iteration itself is :class:`klppo.lm.experiment.Experiment`; this module is the run's life in
its directory. Every input (config, model, reward, output path) is checked and loaded before the
directory is created. The process holds the directory's lock (:class:`klppo.runs.rundir.DirLock`)
while it runs. Every ``checkpoint_every`` iterations (and at the end, and on SIGINT / SIGTERM)
the policy is exported to ``policy/`` and ``checkpoint.pt`` is written atomically; a run killed
at any moment and resumed writes the same metrics.jsonl as an uninterrupted one (timing fields
aside). A failure leaves status.json ``failed`` with the reason and the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klppo.lm.config import ConfigError, RLHFConfig
from klppo.lm.config_checks import config_from_dict, validate_rlhf
from klppo.lm.experiment import STATE_KEYS, TIMING_KEYS, Experiment
from klppo.lm.model import fingerprint
from klppo.lm.reward import RewardFn
from klppo.lm.scoring import distinct_n, per_token_kl, score_sequences, token_rewards
from klppo.runs import metrics as M
from klppo.runs import rundir as R
from klppo.runs.checkpoint import CHECKPOINT
from klppo.runs.configfile import read_config_file
from klppo.runs.errors import ResumeError, RunFailed
from klppo.runs.lifecycle import (
    OnIteration,
    RunLife,
    check_config_unchanged,
    check_metrics,
    check_run_dir,
)
from klppo.runs.loop import run_iterations
from klppo.runs.paths import check_writable
from klppo.runs.threads import compute_threads

__all__ = ["RLHFResult", "RLHFError", "ResumeError", "rlhf", "resume_rlhf", "read_run_config",
           "read_checkpoint", "TIMING_KEYS", "CHECKPOINT", "score_sequences", "per_token_kl",
           "token_rewards", "distinct_n"]



class RLHFError(RunFailed):
    """A run stopped on an error; status.json says why, and its last good checkpoint is kept."""


@dataclass
class RLHFResult:
    run_dir: Path
    metrics: list[dict[str, Any]]
    status: str = "finished"
    #: the signal that stopped an 'interrupted' run (None otherwise)
    stop_signal: int | None = None


def rlhf(cfg: RLHFConfig, reward: RewardFn | None = None,
         on_iteration: OnIteration = None, keep: tuple[str, ...] = ()) -> RLHFResult:
    """Run the experiment into a new run directory; return its per-iteration metrics.

    Bad input raises ``ConfigError`` (naming the field and the value) before any directory
    exists; a directory in use by another process raises ``DirBusyError``; a failure during the
    run raises :class:`RLHFError`. ``out`` must be new or empty, but for the names in ``keep``
    (files of the run's own made before it: a comparison arm's ``pending.yaml``).
    """
    validate_rlhf(cfg)
    out = Path(cfg.out or Path("runs/rlhf") / R.default_run_name(
        "lm", f"{cfg.controller}-beta{cfg.beta:g}", cfg.seed))
    try:
        check_writable(out)
    except OSError as e:
        raise ConfigError(str(e)) from None
    _refuse_existing_run(out, keep)
    with compute_threads(cfg.torch_threads) as threads:
        exp = Experiment(cfg, reward)  # loads and checks the model, reward, corpus
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"out={str(out)!r}: cannot be made ({e.strerror or e})") from None
        lock = R.DirLock(out).acquire()
        try:
            _refuse_existing_run(out, keep)  # another process may have started one meanwhile
            R.write_yaml(out / "config.yaml", {"kind": "rlhf", **dataclasses.asdict(cfg)})
            R.write_metadata(out, {"kind": "rlhf", "threads": threads,
                                   "model_sha256": fingerprint(exp.ref, exp.tok)})
        except BaseException:
            lock.release()
            raise
        return _run(exp, out, lock, on_iteration)


def _refuse_existing_run(out: Path, keep: tuple[str, ...]) -> None:
    """``out`` must be new or empty (as ``klppo train``'s:
    :func:`klppo.runs.rundir.check_reusable`); a run there, even one killed before its first
    metrics, continues with ``--resume``; anything else there is not ours."""
    if (out / "metrics.jsonl").exists() or (out / CHECKPOINT).exists():
        try:
            _rlhf_config_dict(out)
        except (ResumeError, ConfigError, OSError):  # not an rlhf run: it is not ours to resume
            raise ConfigError(f"out={str(out)!r}: already holds a run that is not a `klppo "
                              f"rlhf` run; choose another --out") from None
        raise ConfigError(f"out={str(out)!r}: already holds a run; continue it with "
                          f"`klppo rlhf --resume {out}` or choose another --out")
    try:
        R.check_reusable(out, keep)
    except FileExistsError as e:
        raise ConfigError(str(e)) from None


def _run(exp: Experiment, run_dir: Path, lock: R.DirLock, on_iteration: OnIteration,
         saved: int = 0) -> RLHFResult:
    """Iterate to the end (or a stop request) under the shared run lifecycle, which records
    the outcome in status.json and releases the lock."""
    life = RunLife(run_dir, lock, saved=saved)
    state = run_iterations(exp, life, lambda: M.MetricsWriter([M.JsonlSink(
        run_dir / "metrics.jsonl")]), on_iteration, RLHFError)
    records, _ = M.read_metrics(run_dir / "metrics.jsonl")
    return RLHFResult(run_dir, records, state, life.stop_signal)


def _one_line(e: BaseException) -> str:
    """The error's message on one line (its type's name when it has none: a MemoryError)."""
    return " ".join(x.strip() for x in str(e).splitlines() if x.strip())[:500] or \
        type(e).__name__


# ------------------------------------------------------------------------------------ resume
def read_run_config(run_dir: str | Path) -> RLHFConfig:
    """The validated config of an rlhf run directory; one-line errors for a missing directory,
    a missing or malformed ``config.yaml``, another kind of run, or bad values."""
    run_dir = Path(run_dir)
    d = _rlhf_config_dict(run_dir)
    try:
        return config_from_dict(d)
    except ConfigError as e:
        raise ResumeError(f"{e} (in {run_dir / 'config.yaml'})") from None


def _rlhf_config_dict(run_dir: Path) -> dict[str, Any]:
    """config.yaml of an rlhf run (without ``kind``); nothing is written on the way."""
    check_run_dir(run_dir, "klppo rlhf")
    path = run_dir / "config.yaml"
    d = read_config_file(path, "config")
    kind = d.pop("kind", None)
    if kind != "rlhf":
        raise ResumeError(f"config={str(path)!r}: kind={kind!r}, not an rlhf run (a `klppo "
                          f"train` run resumes with `klppo train --resume`)")
    return d


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The state in an rlhf ``checkpoint.pt``; None when there is none; :class:`ResumeError`
    (one line naming the file) when it is empty, truncated, corrupt or of another kind."""
    from klppo.runs.checkpoint import CheckpointError, check_finite, load_data

    if not path.exists():
        return None
    name, fix = f"checkpoint={str(path)!r}", "delete it to restart the run from scratch"
    if path.stat().st_size == 0:
        raise ResumeError(f"{name}: empty file; {fix}")
    try:  # data only: a pickled object that would run code is refused (never executed)
        state = load_data(path, fix)
    except CheckpointError as e:
        raise ResumeError(f"{name}: {str(e).removeprefix(f'{path}: ')}") from None
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else STATE_KEYS
    if missing:
        raise ResumeError(f"{name}: not an rlhf checkpoint (no {', '.join(missing)}); {fix}")
    try:
        check_finite(state, path)
    except CheckpointError as e:
        raise ResumeError(f"{name}: {str(e).removeprefix(f'{path}: ')}") from None
    return state


def resume_rlhf(run_dir: str | Path, reward: RewardFn | None = None,
                on_iteration: OnIteration = None) -> RLHFResult:
    """Continue a run from its last checkpoint (or start it, if it never wrote one).

    Metrics after the checkpoint are discarded and recomputed, so the finished metrics.jsonl
    equals an uninterrupted run's (timing fields aside). A run that cannot be resumed raises
    :class:`ResumeError` (and its status.json says 'failed' with the reason).
    """
    run_dir = Path(run_dir)
    _rlhf_config_dict(run_dir)  # not an rlhf run directory: refuse before touching it
    lock = R.DirLock(run_dir).acquire()
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(compute_threads(read_run_config(run_dir).torch_threads))
            exp = _restore(run_dir, reward)
        except BaseException as e:
            if isinstance(e, Exception):
                R.write_refused(run_dir, _one_line(e))
            lock.release()
            raise
        if exp is None:  # the checkpoint is of the last iteration: nothing to run
            lock.release()
            return RLHFResult(run_dir, M.read_metrics(run_dir / "metrics.jsonl")[0],
                              "finished")
        M.truncate_metrics(run_dir / "metrics.jsonl", exp.iteration)
        return _run(exp, run_dir, lock, on_iteration, saved=exp.iteration)


#: config fields a resume may change: where files go, how often to checkpoint, where to compute
RESUME_MAY_CHANGE = frozenset({"out", "checkpoint_every", "torch_threads", "device"})


def _check_config(run_dir: Path, cfg: RLHFConfig, saved: Any) -> None:
    """config.yaml against the checkpoint's own copy of the config (checkpoints written before
    klppo kept one have none): an edit other than :data:`RESUME_MAY_CHANGE` is refused."""
    if saved is not None:
        check_config_unchanged(run_dir, dataclasses.asdict(cfg), saved,
                               dataclasses.asdict(RLHFConfig()), RESUME_MAY_CHANGE)


def _restore(run_dir: Path, reward: RewardFn | None) -> Experiment | None:
    cfg = read_run_config(run_dir)
    state = read_checkpoint(run_dir / CHECKPOINT)
    it = _checkpoint_iteration(run_dir, state, cfg)
    check_metrics(run_dir, it)
    if it >= cfg.iterations:
        M.truncate_metrics(run_dir / "metrics.jsonl", it)
        R.write_status(run_dir, "finished", iteration=it, checkpoint_iteration=it)
        return None
    if state is not None:
        _check_config(run_dir, cfg, state.get("config"))
    exp = Experiment(cfg, reward)
    _check_model(run_dir, cfg, exp)
    if state is not None:
        try:
            exp.load_state_dict(state)
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise ResumeError(f"checkpoint={str(run_dir / CHECKPOINT)!r}: does not fit this "
                              f"run's model ({type(e).__name__}: {_one_line(e)[:200]})") from None
    return exp


def _checkpoint_iteration(run_dir: Path, state: dict[str, Any] | None, cfg: RLHFConfig) -> int:
    """The checkpoint's iteration: an integer from 0 to the run's ``iterations`` (0 without a
    checkpoint); anything else is refused in one line before anything is allocated."""
    if state is None:
        return 0
    it = state["iteration"]
    if isinstance(it, bool) or not isinstance(it, int) or not 0 <= it <= cfg.iterations:
        raise ResumeError(f"checkpoint={str(run_dir / CHECKPOINT)!r}: iteration={it!r} must be "
                          f"an integer from 0 to the run's iterations ({cfg.iterations}); delete "
                          f"it to restart the run from scratch")
    return it


def _check_model(run_dir: Path, cfg: RLHFConfig, exp: Experiment) -> None:
    """The run's ``model`` (its reference, read from it again) must be the model the run
    started from: the fingerprint in ``metadata.json`` (runs started before klppo kept one
    are not checked)."""
    try:
        meta = json.loads((run_dir / "metadata.json").read_text())
        saved = meta.get("model_sha256")
    except (OSError, ValueError, RecursionError, AttributeError):
        meta, saved = {}, None
    if not isinstance(saved, str):
        return
    now = fingerprint(exp.ref, exp.tok)
    if now != saved:
        raise ResumeError(f"model={cfg.model!r}: is not the model this run started from (its "
                          f"weights or tokenizer changed: sha256 {now[:12]}..., "
                          f"{saved[:12]}... in metadata.json{_loader_changed(meta)}); resume "
                          "it with that model")


def _loader_changed(meta: dict) -> str:
    """``; transformers was X at the start, Y now...`` when the version that read the model
    changed since the run started (a new version may read the same file into other weights)."""
    import transformers

    packages = meta.get("packages")
    then = packages.get("transformers") if isinstance(packages, dict) else None
    now = transformers.__version__
    if not isinstance(then, str) or then == now:
        return ""
    return (f"; transformers was {then} at the start and is {now} now, which may read the same "
            f"files into other weights")
