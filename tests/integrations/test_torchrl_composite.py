"""klppo's KLPENPPOLoss on composite action distributions (several heads, TorchRL's
``CompositeDistribution``), issue #33: the KL is the sum of the heads' KLs (nats per sample),
each exact where it has a closed form and sampled otherwise; ``composite_kl="torchrl"`` gives
TorchRL's own joint Monte Carlo numbers and beta trajectory; both log-probability aggregation
settings, log-prob keys as TorchRL reads them, gradients to the actor only through the
objective, and one-line refusals."""

import functools

import pytest

pytest.importorskip("torchrl")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import (  # noqa: E402
    CompositeDistribution,
    NormalParamExtractor,
    TensorDictModule,
    set_composite_lp_aggregate,
)
from torch import nn  # noqa: E402
from torchrl.data import Bounded, Categorical, Composite  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator  # noqa: E402
from torchrl.modules.distributions import TruncatedNormal  # noqa: E402
from torchrl.objectives import KLPENPPOLoss as TorchRLKLPEN  # noqa: E402

from klppo.core.kl import monte_carlo_kl  # noqa: E402
from klppo.integrations.torchrl import KLPENPPOLoss  # noqa: E402
from tests.integrations.torchrl_setup import perturb, total  # noqa: E402

OBS, ACT, N = 4, 2, 3

#: head kinds of the composites below: TanhNormal (a closed form through the tanh), Categorical
#: (a closed form), TruncatedNormal (none: sampled)
HEADS = {
    "tanh": (TanhNormal, ("loc", "scale")),
    "cat": (torch.distributions.Categorical, ("logits",)),
    "trunc": (TruncatedNormal, ("loc", "scale")),
}


class Heads(nn.Module):
    """One linear layer per head from the observation, its parameters under ``params``."""

    def __init__(self, heads):
        super().__init__()
        self.heads = list(heads)
        self.nets = nn.ModuleDict({
            h: nn.Sequential(nn.Linear(OBS, 2 * ACT), NormalParamExtractor())
            if HEADS[h][1] == ("loc", "scale") else nn.Linear(OBS, N) for h in self.heads})

    def forward(self, obs):
        out = []
        for h in self.heads:
            y = self.nets[h](obs)
            out.extend(y if isinstance(y, tuple) else (y,))
        return tuple(out)


def composite_actor(heads=("tanh", "cat"), seed=0):
    """A ProbabilisticActor whose distribution is a CompositeDistribution of ``heads``, each
    head's action at ``("action", head)``."""
    torch.manual_seed(seed)
    out_keys = [("params", h, k) for h in heads for k in HEADS[h][1]]
    module = TensorDictModule(Heads(heads), in_keys=["observation"], out_keys=out_keys)
    specs = {h: Categorical(N) if h == "cat" else Bounded(-1.0, 1.0, (ACT,)) for h in heads}
    dist = functools.partial(CompositeDistribution,
                             distribution_map={h: HEADS[h][0] for h in heads},
                             name_map={h: ("action", h) for h in heads})
    return ProbabilisticActor(module, in_keys=["params"], distribution_class=dist,
                              out_keys=[("action", h) for h in heads],
                              spec=Composite({"action": Composite(specs)}),
                              return_log_prob=True)


def critic(seed=0):
    torch.manual_seed(seed)
    return ValueOperator(nn.Sequential(nn.Linear(OBS, 8), nn.Tanh(), nn.Linear(8, 1)),
                         in_keys=["observation"])


def collect(actor, value, n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({"observation": torch.randn(n, OBS, generator=g)}, [n])
    torch.manual_seed(seed)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        actor(td)
        value(td)
    td["advantage"] = torch.randn(n, 1, generator=g)
    td["value_target"] = td["state_value"] + torch.randn(n, 1, generator=g)
    return td


def loss_keys(loss, heads):
    """TorchRL's keys for a composite: each head's action, and its log-probability unless the
    log-probabilities are aggregated (then the actor's one key, TorchRL's default)."""
    from tensordict.nn import composite_lp_aggregate

    if composite_lp_aggregate():
        loss.set_keys(action=[("action", h) for h in heads])
    else:
        loss.set_keys(action=[("action", h) for h in heads],
                      sample_log_prob=[("action", f"{h}_log_prob") for h in heads])
    return loss


def dists(actor, td):
    """The behaviour policy's and the current policy's composite distributions on ``td``."""
    with torch.no_grad():
        old = actor.build_dist_from_params(td)
        new = actor.get_dist(td.copy())
    return old, new


@pytest.mark.parametrize("aggregate", [False, True], ids=["per-key", "aggregated"])
@pytest.mark.parametrize("heads", [("tanh",), ("tanh", "cat"), ("cat", "tanh")],
                         ids=["one-head", "two-heads", "two-heads-reordered"])
def test_the_kl_is_the_sum_of_the_heads_exact_kls(heads, aggregate):
    """Per sample, the loss's ``kl`` is the sum over heads of each head's closed-form KL(pi_old
    || pi_new) in nats (the heads are independent given the state); the policy term is
    ``w A - beta KL`` with it; both aggregation settings give the same."""
    with set_composite_lp_aggregate(aggregate):
        actor, value = composite_actor(heads), critic()
        td = collect(actor, value)
        perturb(actor, 0.3, seed=1)
        loss = loss_keys(KLPENPPOLoss(actor, value, beta=0.7), heads)
        out = loss(td.clone())
        old, new = dists(actor, td)
        log_weight = _log_weight(loss, td)
    expect = sum(torch.distributions.kl_divergence(old.dists[("action", h)],
                                                   new.dists[("action", h)])
                 for h in heads)
    assert torch.allclose(out["kl"].squeeze(-1), expect, atol=1e-6)
    assert (out["kl"] > 0).all()
    w = torch.exp(log_weight)
    adv = td["advantage"]
    policy = (w * adv - 0.7 * expect.unsqueeze(-1)).mean()
    assert torch.allclose(out["loss_objective"], -policy, atol=1e-5)


def _log_weight(loss, td):
    """TorchRL's own log-ratio for ``td`` (its ``_log_weight``)."""
    with torch.no_grad():
        log_weight, *_ = loss._log_weight(td.clone(), adv_shape=td.shape)
    return log_weight


def test_a_head_without_a_closed_form_is_sampled_the_others_exact():
    """TruncatedNormal has no closed-form KL: its KL is ``samples_mc_kl`` draws from pi_old
    (as for a single TruncatedNormal), the TanhNormal head's is exact; they add."""
    heads = ("tanh", "trunc")
    actor, value = composite_actor(heads), critic()
    td = collect(actor, value)
    perturb(actor, 0.3, seed=2)
    loss = loss_keys(KLPENPPOLoss(actor, value, samples_mc_kl=64), heads)
    old, new = dists(actor, td)
    torch.manual_seed(5)
    kl = loss.kl(old, new)
    torch.manual_seed(5)
    exact = torch.distributions.kl_divergence(old.dists[("action", "tanh")],
                                              new.dists[("action", "tanh")])
    sampled = monte_carlo_kl(old.dists[("action", "trunc")], new.dists[("action", "trunc")],
                             64, reparameterize=False)
    assert torch.allclose(kl, exact + sampled, atol=1e-6)


@pytest.mark.parametrize("aggregate", [False, True], ids=["per-key", "aggregated"])
def test_composite_kl_torchrl_gives_torchrls_losses_and_beta_trajectory(aggregate):
    """``composite_kl="torchrl"``: the same joint Monte Carlo draws as TorchRL's class, so the
    same loss values, KL, gradients and beta over a training run, with TorchRL's step rule."""
    heads = ("tanh", "cat")
    opts = dict(dtarg=0.01, beta=0.5, increment=1.5, decrement=0.75, entropy_coeff=0.01)
    with set_composite_lp_aggregate(aggregate):
        a1, v1 = composite_actor(heads), critic()
        a2, v2 = composite_actor(heads), critic()
        ref = loss_keys(TorchRLKLPEN(a1, v1, **opts), heads)
        ours = loss_keys(KLPENPPOLoss(a2, v2, composite_kl="torchrl", **opts), heads)
        opt1 = torch.optim.Adam(ref.parameters(), lr=0.05)
        opt2 = torch.optim.Adam(ours.parameters(), lr=0.05)
        betas = []
        for step in range(12):
            if step % 4 == 0:
                data = collect(a1, v1, seed=step)
            torch.manual_seed(100 + step)
            out1 = ref(data.clone())
            torch.manual_seed(100 + step)
            out2 = ours(data.clone())
            for k in ("loss_objective", "loss_critic", "loss_entropy", "kl"):
                assert torch.equal(out1[k], out2[k]), (step, k)
            assert torch.equal(ref.beta, ours.beta)
            betas.append(float(ref.beta))
            for opt, out in ((opt1, out1), (opt2, out2)):
                opt.zero_grad()
                total(out).backward()
                opt.step()
            for p, q in zip(ref.parameters(), ours.parameters(), strict=True):
                assert torch.equal(p, q)
    assert len(set(betas)) > 2  # the rule moved beta up and down


def test_gradients_reach_the_actor_through_the_objective_only():
    heads = ("tanh", "cat")
    actor, value = composite_actor(heads), critic()
    td = collect(actor, value)
    perturb(actor, 0.2, seed=3)
    loss = loss_keys(KLPENPPOLoss(actor, value), heads)
    out = loss(td.clone())
    out["loss_critic"].backward(retain_graph=True)
    assert all(p.grad is None for p in actor.parameters())
    assert all(p.grad is not None for p in value.parameters())
    value.zero_grad()
    out["loss_objective"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


def test_a_composite_against_a_plain_distribution_is_refused_in_one_line():
    heads = ("tanh",)
    actor, value = composite_actor(heads), critic()
    td = collect(actor, value)
    loss = loss_keys(KLPENPPOLoss(actor, value), heads)
    old, _ = dists(actor, td)
    plain = old.dists[("action", "tanh")]
    with pytest.raises(TypeError, match="both be composite, or neither") as e:
        loss.kl(old, plain)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="composite_kl='joint'"):
        KLPENPPOLoss(actor, value, composite_kl="joint")


def test_heads_of_any_shape_and_family_with_per_head_entropy_coefficients():
    """A Gamma head (closed form), a Kumaraswamy head with a dimension past the batch and a
    Gaussian mixture (neither has a closed form: sampled, in the heads' order; the extra
    dimension summed as TorchRL sums a head's features), nested action keys, and an entropy
    coefficient per head: the KL is the heads' sum in nats per sample."""
    from tensordict.nn import (
        ProbabilisticTensorDictModule,
        ProbabilisticTensorDictSequential,
        WrapModule,
    )
    from tensordict.nn import TensorDictSequential as Seq

    d = torch.distributions
    B = 5

    def mixture(logits, loc, scale):
        return d.MixtureSameFamily(d.Categorical(logits=logits), d.Normal(loc, scale))

    names = {"g": ("agent0", "action", "g"), "k": ("agent1", "action"), "m": "agent2"}
    with set_composite_lp_aggregate(False):
        params = nn.ParameterDict({
            "g_c": nn.Parameter(torch.ones(B)), "g_r": nn.Parameter(torch.ones(B)),
            "k0": nn.Parameter(torch.ones(B, 2)), "k1": nn.Parameter(torch.ones(B, 2)),
            "m_l": nn.Parameter(torch.zeros(B, 3)), "m_loc": nn.Parameter(torch.zeros(B, 3)),
            "m_s": nn.Parameter(torch.ones(B, 3))})

        class Params(nn.Module):
            def __init__(self):
                super().__init__()
                self.p = params

            def forward(self):
                sp = nn.functional.softplus
                return (sp(self.p["g_c"]), sp(self.p["g_r"]), sp(self.p["k0"]),
                        sp(self.p["k1"]), self.p["m_l"], self.p["m_loc"], sp(self.p["m_s"]))

        make = TensorDictModule(Params(), in_keys=[], out_keys=[
            ("params", "g", "concentration"), ("params", "g", "rate"),
            ("params", "k", "concentration0"), ("params", "k", "concentration1"),
            ("params", "m", "logits"), ("params", "m", "loc"), ("params", "m", "scale")])
        dist = functools.partial(CompositeDistribution,
                                 distribution_map={"g": d.Gamma, "k": d.Kumaraswamy,
                                                   "m": mixture}, name_map=names)
        policy = ProbabilisticTensorDictSequential(make, ProbabilisticTensorDictModule(
            in_keys=["params"], out_keys=list(names.values()), distribution_class=dist,
            return_log_prob=True))
        value = Seq(WrapModule(lambda td: td.set("state_value", torch.zeros(*td.shape, 1)),
                               out_keys=["state_value"]))
        torch.manual_seed(0)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            data = policy(TensorDict(batch_size=[B]))
        data["advantage"] = torch.randn(B, 1)
        data["value_target"] = torch.zeros(B, 1)
        with torch.no_grad():
            params["g_c"].add_(0.3)
            params["k0"].sub_(0.2)
            params["m_loc"].add_(0.4)
        lp_keys = {"g": ("agent0", "action", "g_log_prob"), "k": ("agent1", "action_log_prob"),
                   "m": "agent2_log_prob"}
        coef = {lp_keys["g"]: 0.02, lp_keys["k"]: 0.01, lp_keys["m"]: 0.03}
        loss = KLPENPPOLoss(policy, value, entropy_coeff=coef, samples_mc_kl=16)
        loss.set_keys(action=list(names.values()), sample_log_prob=list(lp_keys.values()))
        torch.manual_seed(3)
        out = loss(data.clone())
        with torch.no_grad():
            old = policy.build_dist_from_params(data)
            new = policy.get_dist(data.clone())
        torch.manual_seed(3)
        mc = [monte_carlo_kl(old.dists[names[h]], new.dists[names[h]], 16,
                             reparameterize=False).sum(-1) for h in ("k", "m")]
        expect = d.kl_divergence(old.dists[names["g"]], new.dists[names["g"]]) + mc[0] + mc[1]
    assert out["kl"].shape == (B, 1)
    assert torch.allclose(out["kl"].squeeze(-1), expect, atol=1e-5)
    # the entropy term is TorchRL's own code path (per-head coefficients, a sampled entropy for
    # the mixture): present, finite, one number
    assert out["loss_entropy"].shape == () and torch.isfinite(out["loss_entropy"])
    assert set(out["composite_entropy"].keys(True, True)) == set(lp_keys.values())


@pytest.mark.parametrize("cls", ["KLPENPPOLoss", "KLipPPOLoss"])
def test_a_log_probability_of_the_wrong_shape_names_its_key(cls):
    import klppo.integrations.torchrl as K

    heads = ("tanh", "cat")
    with set_composite_lp_aggregate(False):
        actor, value = composite_actor(heads), critic()
        td = collect(actor, value)
        td["action", "tanh_log_prob"] = torch.zeros(td.shape[0], 5)
        loss = loss_keys(getattr(K, cls)(actor, value), heads)
        with pytest.raises(RuntimeError, match=r"the log-probabilities it reads have shapes "
                                               r"\('action', 'tanh_log_prob'\): \[32, 5\], "
                                               r"\('action', 'cat_log_prob'\): \[32\], the "
                                               r"batch \[32\]"):
            loss(td)
