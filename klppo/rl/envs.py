"""Gymnasium side: the vector-env factory and same-step autoreset (the running normalisers are
:mod:`klppo.rl.normalize`'s, importable from here too).

Every vector env klppo steps follows gymnasium's SAME_STEP autoreset convention: when a
sub-environment ends at step t, the observation returned at t is already the first observation of
the next episode, and the last observation of the finished episode is in ``info["final_obs"]``
(masked by ``info["_final_obs"]``). So every stored transition is a real one.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from typing import Any, cast

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from klppo.rl.cartpole import CartPoleSameStep
from klppo.rl.normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from klppo.rl.vecenv import RestoreReport, SameStepVecEnv
from klppo.runs.errors import ConfigError, UserInputError
from klppo.runs.install import install_hint
from klppo.runs.typecheck import short_repr

__all__ = ["EnvError", "EnvKwargsError", "check_env", "make_env", "env_spaces", "space_problem",
           "make_vector_env", "env_state", "restore_env_state", "RunningMeanStd", "ObsNormalizer",
           "RewardScaler"]

#: gymnasium extra that provides an env family, for the error message of a failed import.
_EXTRAS = {"box2d": "box2d", "mujoco": "mujoco"}


class EnvError(UserInputError):
    """The environment cannot be made; the message says why and what to do."""


class EnvKwargsError(EnvError, ConfigError):
    """``env_kwargs`` the environment does not take; the message names them."""


def _resolve_id(env_id: str) -> str:
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        if not module.strip() or module.startswith(".") or not name.strip():
            raise EnvError(f"env={env_id!r}: expected MODULE:ID (a module that registers the "
                           f"environment, then its id)")
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise EnvError(f"env={env_id!r}: cannot import module {module!r}: {e}") from None
        if name not in gym.registry:
            _register_attribute(env_id, mod, name)
        env_id = name
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if env_id.startswith("klppo-local/"):
            hint = ("; klppo.train registered it in the process that trained the run (a class "
                    "or function defined in __main__); define it in a module and pass "
                    "MODULE:NAME")
        raise EnvError(f"env={env_id!r}: not a registered Gymnasium environment{hint}")
    return env_id


def _register_attribute(env_id: str, module: Any, name: str) -> None:
    """``MODULE:NAME`` where NAME is no registered id but an attribute of the module: a
    gymnasium.Env class or a function that returns an env is registered under NAME (so the
    module need only define it); an env instance is refused (it cannot be made again)."""
    attr = getattr(module, name, None)
    if isinstance(attr, gym.Env):
        raise EnvError(f"env={env_id!r}: {name} is an environment instance, which cannot be "
                       f"made again for each parallel environment, a resume or an evaluation; "
                       f"define a class or a function that returns a new one")
    if callable(attr) and (not isinstance(attr, type) or issubclass(attr, gym.Env)):
        gym.register(id=name, entry_point=cast(Any, attr))


def _missing_extra(env_id: str, err: Exception) -> EnvError:
    """The pip command of the extra an env needs; a Ctrl-C that broke the import (and surfaces
    as an ImportError) stays a KeyboardInterrupt instead of a false "needs the extra"."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from err
        cause = cause.__cause__ or cause.__context__
    spec = gym.spec(env_id)
    entry = str(spec.entry_point)
    for key, extra in _EXTRAS.items():
        if key in entry:
            return EnvError(
                f"env={env_id!r} needs the {extra} extra: {install_hint(extra)} "
                f"(or pip install 'gymnasium[{extra}]'); import failed with: {err}"
            )
    return EnvError(f"env={env_id!r}: cannot be created: {err}")


def check_env(env_id: str, env_kwargs: dict[str, Any] | None = None,
              objective: str | None = None, backend: str = "gymnasium") -> str:
    """Resolve ``env_id`` and import its implementation, then make it once (with
    ``env_kwargs``) to check its spaces, so an unknown id (close matches), a missing extra (the
    pip command), arguments the env does not take or spaces klppo cannot train (for an
    ``objective`` that reads ``exp(logp)`` as a probability: actions that are not discrete)
    fail before a run starts; with the ``envpool`` backend, EnvPool must be installed and have
    the task."""
    from gymnasium.envs.registration import load_env_creator

    if backend == "envpool":
        from klppo.rl.envpool_backend import check_envpool

        return check_envpool(env_id)
    env_id = _resolve_id(env_id)
    entry = gym.spec(env_id).entry_point
    if isinstance(entry, str):
        try:
            load_env_creator(entry)
        except (ImportError, gym.error.DependencyNotInstalled) as e:
            raise _missing_extra(env_id, e) from None
        except Exception as e:  # noqa: BLE001 - e.g. MUJOCO_GL naming a GL library not present
            raise EnvError(f"env={env_id!r}: importing its implementation failed "
                           f"({type(e).__name__}: {e})") from None
    _check_env_spaces(env_id, env_kwargs or {}, objective)
    return env_id


#: the env ids whose gymnasium "out of date" warning this process has shown
_SAID_OUT_OF_DATE: set[str] = set()


def _gym_make(env_id: str, **kwargs: Any) -> Any:
    """``gym.make``, with gymnasium's "is out of date" warning for an old version shown once per
    id and process (it came twice a run, from the check and the env: the KLip-PPO presets
    choose v4, the paper's version, on purpose)."""
    with warnings.catch_warnings():
        if env_id in _SAID_OUT_OF_DATE:
            warnings.filterwarnings("ignore", message=r".*is out of date",
                                    category=DeprecationWarning)
        env = gym.make(env_id, **kwargs)
    _SAID_OUT_OF_DATE.add(env_id)
    return env


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None, **make_kwargs: Any) -> Any:
    """One environment of a run: ``gym.make`` of the resolved id (``module:Id`` imports the
    module first) with the run's ``env_kwargs`` and gymnasium's own ``make_kwargs`` (e.g.
    ``render_mode``)."""
    return _gym_make(_resolve_id(env_id), **{**(env_kwargs or {}), **make_kwargs})


def env_spaces(env_id: str, env_kwargs: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """The ``(observation space, action space)`` of one env made with ``env_kwargs`` (then
    closed): what shapes a run's networks (EnvPool's tasks have Gymnasium's spaces)."""
    env = make_env(env_id, env_kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def space_problem(obs_space: Any, act_space: Any) -> str | None:
    """Why klppo's networks cannot take these spaces (None: they can): observations must be a
    ``Box``, actions ``Discrete`` (from 0) or ``Box``."""
    from gymnasium import spaces

    if not isinstance(obs_space, spaces.Box):
        return (f"observation space {obs_space} is not a Box (klppo's networks take vectors of "
                f"numbers; wrap the env to give it one, e.g. a one-hot Box)")
    if isinstance(act_space, spaces.Discrete) and int(act_space.start) != 0:
        return f"action space {act_space} does not start at 0"
    if not isinstance(act_space, (spaces.Discrete, spaces.Box)):
        return f"action space {act_space} is not Discrete or Box"
    return None


def _objective_problem(objective: str, act_space: Any) -> str | None:
    from gymnasium import spaces

    from klppo.core.objectives import OBJECTIVES

    cls = OBJECTIVES.get(objective)
    if cls is not None and cls.needs_probabilities and not isinstance(act_space, spaces.Discrete):
        return (f"objective={objective!r} reads exp(logp) as a probability, which needs "
                f"Discrete actions; the action space is {act_space}")
    return None


def _check_env_spaces(env_id: str, env_kwargs: dict[str, Any],
                      objective: str | None = None) -> None:
    """Make the env once (then close it) and refuse spaces klppo cannot train on."""
    try:
        env = _gym_make(env_id, **env_kwargs)
    except (ImportError, gym.error.DependencyNotInstalled) as e:
        raise _missing_extra(env_id, e) from None
    except TypeError as e:
        if not env_kwargs:
            raise EnvError(f"env={env_id!r}: cannot be created (TypeError: {str(e)[:160]})") \
                from None
        raise EnvKwargsError(f"env_kwargs={short_repr(env_kwargs)}: {env_id} does not take them "
                             f"({str(e)[:160]})") from None
    except Exception as e:  # noqa: BLE001 - a user's env failing in its constructor
        what = f" with env_kwargs={short_repr(env_kwargs)}" if env_kwargs else ""
        raise EnvError(f"env={env_id!r}: cannot be created{what} ({type(e).__name__}: "
                       f"{str(e)[:160]})") from None
    try:
        problem = space_problem(env.observation_space, env.action_space)
        if problem is None and objective is not None:
            problem = _objective_problem(objective, env.action_space)
    finally:
        env.close()
    if problem is not None:
        raise EnvError(f"env={env_id!r}: {problem}")


def make_vector_env(
    env_id: str, num_envs: int, seed: int, vectorization: str = "auto",
    env_kwargs: dict[str, Any] | None = None,
    backend: str = "gymnasium",
) -> Any:
    """A seeded vector env with SAME_STEP autoreset whose state can be checkpointed; each env
    made by ``gym.make(env_id, **env_kwargs)``.

    ``vectorization``: ``auto`` uses the env's numpy vector implementation where klppo has a
    same-step adapter for it (CartPole, without ``env_kwargs``), else klppo's own
    :class:`SameStepVecEnv`; ``sync``
    forces :class:`SameStepVecEnv`; ``async`` uses Gymnasium's AsyncVectorEnv (one process per
    env; its state cannot be checkpointed, so a resumed run starts new episodes and says so).
    ``backend`` ``envpool``: EnvPool's C++ task of the same id
    (:class:`~klppo.rl.envpool_backend.EnvPoolSameStep`; not checkpointed either).
    Raises :class:`EnvError` with close matches for an unknown id and the pip command for a
    missing extra.
    """
    if backend == "envpool":
        from klppo.rl.envpool_backend import EnvPoolSameStep

        pool = EnvPoolSameStep(env_id, num_envs, seed)
        pool.reset(seed=seed)
        return pool
    env_id = _resolve_id(env_id)
    spec = gym.spec(env_id)
    kwargs = dict(env_kwargs or {})
    env: Any
    try:
        if vectorization == "auto" and env_id.startswith("CartPole") and spec.vector_entry_point \
                and not kwargs:
            env = CartPoleSameStep(gym.make_vec(env_id, num_envs,
                                                vectorization_mode="vector_entry_point"))
        elif vectorization == "async":
            env = gym.make_vec(env_id, num_envs, vectorization_mode="async",
                               vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                               **kwargs)
        else:
            env = SameStepVecEnv(lambda: _gym_make(env_id, **kwargs), num_envs, name=env_id)
    except (ImportError, gym.error.DependencyNotInstalled) as e:
        raise _missing_extra(env_id, e) from None
    env.reset(seed=seed)
    return env


def env_state(env: Any) -> dict[str, Any] | None:
    """The vector env's checkpointable state, or None when it has none (async)."""
    return env.state_dict() if hasattr(env, "state_dict") else None


def restore_env_state(env: Any, state: dict[str, Any] | None, env_id: str) -> RestoreReport:
    """Restore ``env`` in place from :func:`env_state`; return the problems (empty: exact)."""
    if state is None or not hasattr(env, "load_state_dict"):
        return RestoreReport([f"{env_id}: this vector env's state is not checkpointed "
                              f"(rollout.vectorization async); the resumed run starts new "
                              f"episodes and is not identical to an uninterrupted one"])
    return env.load_state_dict(state)
