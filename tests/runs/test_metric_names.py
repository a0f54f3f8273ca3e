"""Dashboard names: one name per quantity under klppo's namespaces, CleanRL's or SB3's names
instead (never both) when asked, and a multi-agent run's policy prefix."""

import pytest

from klppo.runs.names import ALIASES, dashboard_name, dashboard_scalars, namespaced


def test_each_quantity_is_logged_once_under_its_namespace():
    m = {"beta": 0.5, "episode_return_mean": 3.0, "global_step": 10, "kl_rollout": 0.01,
         "loss_critic": 2.0, "lr": 3e-4, "sps": 100.0, "kl_alarm_low": 1.0,
         "value_target_rms": 9.0, "controller_updates": 1, "none": None, "flag": True}
    out = dashboard_scalars(m)
    assert out == {"kl/beta": 0.5, "charts/episode_return_mean": 3.0, "kl/rollout": 0.01,
                   "losses/loss_critic": 2.0, "charts/lr": 3e-4, "perf/sps": 100.0,
                   "kl/alarm_low": 1.0, "losses/value_target_rms": 9.0,
                   "kl/controller_updates": 1}  # no alias next to them, no double prefix


def test_cleanrl_and_sb3_names_replace_klppo_names_with_their_scale():
    m = {"episode_return_mean": 3.0, "value_loss": 2.0, "entropy": 0.7, "kl_rollout": 0.01,
         "sps": 50.0, "iteration": 4}
    cleanrl = dashboard_scalars(m, "cleanrl")
    assert cleanrl == {"charts/episodic_return": 3.0, "losses/value_loss": 2.0,
                       "losses/entropy": 0.7, "kl/rollout": 0.01, "charts/SPS": 50.0,
                       "charts/iteration": 4}
    sb3 = dashboard_scalars(m, "sb3")
    assert sb3 == {"rollout/ep_rew_mean": 3.0, "train/value_loss": 4.0,  # SB3: the MSE
                   "train/entropy_loss": -0.7, "kl/rollout": 0.01, "time/fps": 50.0,
                   "time/iterations": 4}
    with pytest.raises(ValueError, match="metric_names='tianshou'"):
        dashboard_name("lr", "tianshou")  # type: ignore[arg-type]


def test_no_two_quantities_share_a_name():
    keys = ["episode_return_mean", "episode_length_mean", "episode_count", "iteration", "lr",
            "beta", "beta_before", "beta_after", "kl_rollout", "kl_k1", "kl_k3", "kl_analytic",
            "kl_penalty", "kl_target", "kl_observed", "loss", "loss_objective", "loss_critic",
            "loss_entropy", "value_loss", "entropy", "clip_fraction", "explained_variance",
            "sps", "time_elapsed"]
    for names in ("klppo", *ALIASES):
        shown = [dashboard_name(k, names)[0] for k in keys]  # type: ignore[arg-type]
        assert len(set(shown)) == len(shown), names


def test_policy_prefix_leads_the_namespace_and_the_alias():
    assert namespaced("adversary/beta") == "adversary/" + namespaced("beta")
    out = dashboard_scalars({"adversary/beta": 0.2, "agent/episode_return_mean": -1.0},
                            "cleanrl")
    assert out == {"adversary/kl/beta": 0.2, "agent/charts/episodic_return": -1.0}
