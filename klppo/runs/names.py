"""One dashboard name per logged quantity, and the names other libraries give it.

``metrics.jsonl`` keeps klppo's plain keys (``kl_rollout``). TensorBoard and Weights & Biases
get each numeric one once, under its namespace (CleanRL's ``charts/``, ``losses/``, ...):
``NAMESPACE/key``, the namespace's own word dropped from the key (``kl_rollout`` ->
``kl/rollout``; ``loss_critic`` stays ``losses/loss_critic``: ``losses/entropy`` is CleanRL's
name of the entropy, not of the entropy term of the loss). :data:`ALIASES` is the one table of
CleanRL's and Stable-Baselines3's names for the same quantities (docs/metrics.md prints it);
``metric_names="cleanrl"`` or ``"sb3"`` logs those names *instead of* klppo's where one exists,
for a dashboard built for that library, never both.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["NAMESPACES", "ALIASES", "MetricNames", "namespaced", "dashboard_name",
           "dashboard_scalars"]

MetricNames = Literal["klppo", "cleanrl", "sb3"]

#: key prefix -> dashboard namespace (the first prefix that matches wins)
NAMESPACES: dict[str, str] = {
    "episode_": "charts", "lr": "charts", "iteration": "charts",
    "loss": "losses", "value_": "losses", "explained_variance": "losses", "grad_norm": "losses",
    "entropy": "policy", "ratio_": "policy", "clip_fraction": "policy", "frac_": "policy",
    "early_stop": "policy", "epochs": "policy", "minibatch_steps": "policy",
    "kl": "kl", "beta": "kl", "controller_": "kl", "clip_eps": "kl", "actuator_": "kl",
    "update_fraction": "policy", "bapo_": "policy", "ent_coef": "policy",
    "mismatch_": "policy", "eval_": "eval",
    "sps": "perf", "time_": "perf",
}

#: the word of a namespace that a key in it does not repeat (``kl_k3`` -> ``kl/k3``)
_OWN_WORD = {"kl": "kl_", "eval": "eval_"}

#: library -> {klppo key: (the library's name, scale)}: the library's value is ``scale`` times
#: klppo's (SB3's ``train/value_loss`` is the mean squared error, klppo's ``value_loss`` half of
#: it; SB3's ``train/entropy_loss`` is minus the entropy). The notes are in docs/metrics.md.
ALIASES: dict[str, dict[str, tuple[str, float]]] = {
    "cleanrl": {
        "episode_return_mean": ("charts/episodic_return", 1.0),
        "episode_length_mean": ("charts/episodic_length", 1.0),
        "lr": ("charts/learning_rate", 1.0),
        "sps": ("charts/SPS", 1.0),
        "value_loss": ("losses/value_loss", 1.0),
        "loss_objective": ("losses/policy_loss", 1.0),
        "entropy": ("losses/entropy", 1.0),
        "kl_k3": ("losses/approx_kl", 1.0),
        "kl_k1": ("losses/old_approx_kl", 1.0),
        "clip_fraction": ("losses/clipfrac", 1.0),
        "explained_variance": ("losses/explained_variance", 1.0),
    },
    "sb3": {
        "episode_return_mean": ("rollout/ep_rew_mean", 1.0),
        "episode_length_mean": ("rollout/ep_len_mean", 1.0),
        "iteration": ("time/iterations", 1.0),
        "sps": ("time/fps", 1.0),
        "lr": ("train/learning_rate", 1.0),
        "loss": ("train/loss", 1.0),
        "loss_objective": ("train/policy_gradient_loss", 1.0),
        "value_loss": ("train/value_loss", 2.0),
        "entropy": ("train/entropy_loss", -1.0),
        "kl_k3": ("train/approx_kl", 1.0),
        "clip_fraction": ("train/clip_fraction", 1.0),
        "explained_variance": ("train/explained_variance", 1.0),
        "eval_return_mean": ("eval/mean_reward", 1.0),
        "eval_length_mean": ("eval/mean_ep_length", 1.0),
    },
}


def namespaced(key: str) -> str:
    """klppo's dashboard name of a metrics key: ``kl/beta`` for ``beta``, ``kl/rollout`` for
    ``kl_rollout``; a multi-agent run's ``adversary/beta`` -> ``adversary/kl/beta``."""
    policy, _, name = key.rpartition("/")
    if policy:
        return f"{policy}/{namespaced(name)}"
    for prefix, ns in NAMESPACES.items():
        if key.startswith(prefix):
            own = _OWN_WORD.get(ns)
            return f"{ns}/{key[len(own):] if own and key.startswith(own) else key}"
    return f"other/{key}"


def dashboard_name(key: str, names: MetricNames = "klppo") -> tuple[str, float]:
    """The name a metrics key is logged under with ``names``, and the scale of its value."""
    if names not in ("klppo", *ALIASES):
        raise ValueError(f"metric_names={names!r}: must be one of 'klppo', "
                         f"{', '.join(repr(n) for n in ALIASES)}")
    policy, _, name = key.rpartition("/")
    alias = ALIASES.get(names, {}).get(name)
    if alias is None:
        return namespaced(key), 1.0
    return (f"{policy}/{alias[0]}" if policy else alias[0]), alias[1]


def dashboard_scalars(metrics: dict[str, Any], names: MetricNames = "klppo") -> dict[str, float]:
    """Every numeric metric once, under its dashboard name (``global_step`` is the x axis)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or k == "global_step":
            continue
        name, scale = dashboard_name(k, names)
        out[name] = v * scale if scale != 1.0 else v
    return out
