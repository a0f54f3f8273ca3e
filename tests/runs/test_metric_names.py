"""Dashboard names: klppo's namespaces, CleanRL's names, and a multi-agent run's policy prefix."""

from klppo.runs.metrics import dashboard_scalars, namespaced


def test_single_agent_names_are_namespaced_with_cleanrl_aliases():
    out = dashboard_scalars({"beta": 0.5, "episode_return_mean": 3.0, "global_step": 10,
                             "episode_return_mean_none": None})
    assert out["kl/beta"] == 0.5
    assert out["charts/episodic_return"] == 3.0
    assert "global_step" not in str(out)


def test_policy_prefix_leads_the_namespace_and_the_cleanrl_alias():
    assert namespaced("adversary/beta") == "adversary/" + namespaced("beta")
    out = dashboard_scalars({"adversary/beta": 0.2, "agent/episode_return_mean": -1.0})
    assert out["adversary/kl/beta"] == 0.2
    assert out["agent/charts/episodic_return"] == -1.0
    assert "charts/episodic_return" not in out  # no policy's value under the plain name
