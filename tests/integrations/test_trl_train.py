"""klppo controllers driving the real TRL GRPOTrainer and RLOOTrainer on a tiny CPU model.

* the betas in the trainer's logs are the controller's rule replayed on the KLs TRL logged;
* TRL itself used those betas (read where TRL reads them: GRPO's loss, RLOO's generation);
* the per-sequence-sum KL fed to the controller equals a hand computation on the first batch;
* ``resume_from_checkpoint`` continues the same betas as the uninterrupted run.
"""

import copy
import json

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

from klppo.core.controllers import make_controller  # noqa: E402
from klppo.core.kl import per_sequence_sum, sampled_kl  # noqa: E402
from klppo.integrations.trl import STATE_FILE, TRLIntegrationError, attach  # noqa: E402
from tests.integrations.trl_setup import klppo_logs, make_trainer, tiny_lm_dir  # noqa: E402

#: controller of each trainer's run (unit per_sequence_sum: GRPO's KL read per token, RLOO's
#: logged per-token mean converted with the logged mean completion length)
CONTROLLERS = {
    "grpo": ("proportional", dict(target=0.5, horizon=8.0, beta_min=1e-3)),
    "rloo": ("pid", dict(target=0.3, kp=0.05, ki=0.2, beta_min=1e-3)),
}
#: where TRL reads beta: GRPO in the loss, RLOO when it scores a generation batch
READS_BETA = {"grpo": "_compute_loss", "rloo": "_generate_and_score_completions"}


def _spy(trainer, kind, seen):
    """Record trainer.beta each time TRL reads it, and the first batch with the policy's
    weights at that moment (the weights its KL is computed with)."""
    method = READS_BETA[kind]
    original = getattr(trainer, method)
    gen_original = trainer._generate_and_score_completions

    def reads(*args, **kwargs):
        seen["beta"].append((trainer.state.global_step + 1, trainer.beta))
        return original(*args, **kwargs)

    def generates(*args, **kwargs):
        weights = copy.deepcopy(trainer.model.state_dict())
        out = (reads if method == "_generate_and_score_completions" else gen_original)(
            *args, **kwargs)
        seen.setdefault("batch", (out, weights))
        return out

    setattr(trainer, method, reads)
    trainer._generate_and_score_completions = generates


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return tiny_lm_dir(tmp_path_factory.mktemp("trl"))


@pytest.fixture(scope="module", params=["grpo", "rloo"])
def run(request, lm_dir, tmp_path_factory):
    """Four steps of each trainer with a controller attached, a checkpoint at step 2."""
    kind = request.param
    out = tmp_path_factory.mktemp(f"run_{kind}")
    trainer = make_trainer(kind, lm_dir, out, perturb=0.05, eos_bias=4.0, save_strategy="steps",
                           save_steps=2)
    name, options = CONTROLLERS[kind]
    cb = attach(trainer, name, unit="per_sequence_sum", **options)
    seen = {"beta": []}
    _spy(trainer, kind, seen)
    trainer.train()
    return dict(kind=kind, trainer=trainer, cb=cb, seen=seen, out=out, logs=klppo_logs(trainer))


def test_logged_betas_are_the_rule_replayed_on_the_logged_kls(run):
    name, options = CONTROLLERS[run["kind"]]
    replay = make_controller(name, beta=0.1, **options)
    logs = run["logs"]
    assert len(logs) == 4 and all(r["klppo/updated"] == 1 for r in logs)
    for r in logs:
        assert r["klppo/beta"] == replay.value
        replay.update(r["klppo/kl"], n_steps=4)  # 4 completions a step
        assert r["klppo/beta_next"] == replay.value
        # RLOO: the logged token mean times the mean length; GRPO: read per token, the same
        # number up to rounding (one loss call per generation batch)
        converted = r["kl"] * r["completions/mean_length"]
        if run["kind"] == "rloo":
            assert r["klppo/kl"] == converted
        else:
            assert r["klppo/kl"] == pytest.approx(converted, rel=1e-6)
        assert r["klppo/kl_target"] == options["target"]
    assert len({r["klppo/beta"] for r in logs}) == 4  # beta moved at every step
    assert run["trainer"].beta == replay.value
    # TRL read, at every step, the beta the controller had set after the step before
    assert run["seen"]["beta"] == [(r["step"], r["klppo/beta"]) for r in logs]


def test_the_converted_kl_is_the_per_sequence_sum_of_the_first_batch(run, lm_dir):
    """Hand computation, independent of TRL: the first batch's completions scored by the
    policy (as it was then) and the reference, TRL's estimator per token (GRPO k3, RLOO k1),
    summed per completion over its tokens, averaged over completions."""
    from transformers import AutoModelForCausalLM

    out, weights = run["seen"]["batch"]
    policy = AutoModelForCausalLM.from_pretrained(lm_dir)
    policy.load_state_dict(weights)
    ref = AutoModelForCausalLM.from_pretrained(lm_dir)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attn = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    mask = out["completion_mask"].bool()
    n = mask.shape[1]

    def logp(model):
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn).logits[:, -n - 1:-1].float()
        return torch.log_softmax(logits, -1).gather(-1, out["completion_ids"][..., None])[..., 0]

    est = {"grpo": "k3", "rloo": "k1"}[run["kind"]]
    kl = sampled_kl(logp(policy), logp(ref), est)
    by_hand = float(per_sequence_sum(kl, mask).mean())
    first = run["cb"].history[0]
    lengths = mask.sum(1).float()
    assert lengths.min() < lengths.max()  # the completions have different lengths
    assert first["mean_length"] == float(lengths.mean())
    assert first["kl"] == pytest.approx(by_hand, rel=1e-5, abs=1e-7)
    assert abs(by_hand) > 1e-3  # the policy differs from the reference at step 1


def test_resume_from_checkpoint_continues_the_same_betas(run, lm_dir):
    kind, out = run["kind"], run["out"]
    ckpt = out / "checkpoint-2"
    saved = json.loads((ckpt / STATE_FILE).read_text())
    assert saved["global_step"] == 2 and saved["controller"]["num_updates"] == 2
    assert saved["controller"]["beta"] == run["logs"][1]["klppo/beta_next"]
    trainer = make_trainer(kind, lm_dir, out, perturb=0.05, eos_bias=4.0,
                           save_strategy="steps", save_steps=2)
    name, options = CONTROLLERS[kind]
    attach(trainer, name, unit="per_sequence_sum", **options)
    trainer.train(resume_from_checkpoint=str(ckpt))
    resumed = klppo_logs(trainer)
    keys = ("kl", "klppo/beta", "klppo/beta_next")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the first two from trainer_state.json
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in run["logs"]]
    assert trainer.beta == run["trainer"].beta


@pytest.mark.parametrize("options, limit", [
    ({}, None),  # by name: held until the KL reaches the target, however long
    ({"hold_limit": 5}, 5), ({"hold": False}, None)])
def test_a_controller_built_by_name_is_held_and_a_hold_limit_passes_through(
        lm_dir, tmp_path, options, limit):
    trainer = make_trainer("grpo", lm_dir, tmp_path, max_steps=12)
    cb = attach(trainer, "proportional", unit="per_token_mean", target=0.5, beta_min=1e-3,
                **options)
    trainer.state.max_steps = 12  # what the trainer sets before it calls on_train_begin
    cb.on_train_begin(trainer.args, trainer.state, None)
    assert cb.controller.hold_limit == limit
    assert cb.controller.hold is (options.get("hold", True))


def test_the_pid_rule_built_by_name_is_not_held(lm_dir, tmp_path):
    """Its integral's floor at 0 does a hold's work for a weak start; a hold would keep a
    strong start (a KL that never reaches the target) at its beta for ever."""
    trainer = make_trainer("grpo", lm_dir, tmp_path, max_steps=12)
    cb = attach(trainer, "pid", unit="per_token_mean", target=0.5, kp=2.0, ki=0.3,
                beta_min=1e-4)
    assert cb.controller.hold is False
    cb.controller.update(0.0)  # far below the target: beta falls from the first update
    assert cb.controller.value < trainer.args.beta


@pytest.mark.parametrize("rule", ["pid", "proportional"])
def test_the_readme_s_attach_works_as_written(lm_dir, tmp_path, rule):
    """``attach(trainer, RULE, unit=..., target=...)``: a rule built by name gets beta_min 1e-4
    (beta 0 would drop TRL's KL for good); an explicit 0 is refused in one line."""
    trainer = make_trainer("grpo", lm_dir, tmp_path, max_steps=12)
    assert attach(trainer, rule, unit="per_token_mean", target=0.05).controller.beta_min == 1e-4
    with pytest.raises(TRLIntegrationError, match="beta_min=0.0: must be > 0"):
        attach(make_trainer("grpo", lm_dir, tmp_path / "b", max_steps=12), rule,
               unit="per_token_mean", target=0.05, beta_min=0.0)


def test_the_pid_rule_built_by_name_takes_gains_relative_to_its_target(lm_dir, tmp_path):
    """kp = 1 / target, ki = 0.15 / target (beta per nat), kd = 0; given gains are kept."""
    trainer = make_trainer("grpo", lm_dir, tmp_path, max_steps=12)
    ctrl = attach(trainer, "pid", unit="per_token_mean", target=0.05, beta_min=1e-4).controller
    assert (ctrl.kp, ctrl.ki, ctrl.kd) == (pytest.approx(20.0), pytest.approx(3.0), 0.0)
    trainer = make_trainer("grpo", lm_dir, tmp_path / "b", max_steps=12)
    ctrl = attach(trainer, "pid", unit="per_token_mean", target=0.5, beta_min=1e-4,
                  kp=7.0).controller
    assert (ctrl.kp, ctrl.ki) == (7.0, pytest.approx(0.3))
    trainer = make_trainer("grpo", lm_dir, tmp_path / "c", max_steps=12)  # a limit asks a hold
    ctrl = attach(trainer, "pid", unit="per_token_mean", target=0.5, beta_min=1e-4,
                  hold_limit=3).controller
    assert ctrl.hold is True and ctrl.hold_limit == 3
    with pytest.raises(TRLIntegrationError, match="controller='pid': .*target"):
        attach(make_trainer("grpo", lm_dir, tmp_path / "d", max_steps=12), "pid",
               unit="per_token_mean", target=-0.5, beta_min=1e-4)


@pytest.mark.parametrize("controller", ["pid", "proportional"])
def test_a_kl_that_never_reaches_its_target_is_named_once_and_the_ramp_is_no_bound(
        lm_dir, tmp_path, controller):
    """The KL to the reference ramps up from 0: a rule without a hold lowers beta to its floor
    meanwhile, which is no sign the target is out of reach; a KL that has not reached the
    target after a quarter of the run is, once."""
    import warnings

    from klppo.integrations.trl.callback import ControllerBoundWarning

    trainer = make_trainer("grpo", lm_dir, tmp_path, max_steps=8)
    start = trainer.beta
    attach(trainer, controller, unit="per_token_mean", target=50.0, beta_min=1e-4,
           **({"kp": 0.1, "ki": 0.1} if controller == "pid" else {}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.train()
    said = [str(w.message) for w in seen if issubclass(w.category, ControllerBoundWarning)]
    assert len(said) == 1 and "has not reached its target 50 in a quarter of the run" in said[0]
    assert ("held at its start" in said[0]) is (controller == "proportional")
    assert trainer.beta == (1e-4 if controller == "pid" else start)  # the floor, or held


def test_a_bound_is_named_once_when_pressed_on_for_a_tenth_of_the_run_in_a_row():
    from klppo.core.controller_base import BoundWatch

    w = BoundWatch()
    # a noisy KL dips under the target for an update or two: no warning
    seen = [w.see(b, step, 3) for step, b in enumerate(
        [None, "beta_min", "beta_min", None, "beta_min", None], start=1)]
    assert seen == [False] * 6
    # pressed on for 3 updates in a row: one warning, naming when it started; not again
    seen = [w.see("beta_min", step, 3) for step in range(7, 13)]
    assert seen == [False, False, True, False, False, False] and w.since == 7
    assert [w.see(None, 13, 3), w.see("beta_min", 14, 3)] == [False, False]
    assert [w.see("beta_max", s, 3) for s in (15, 16, 17)] == [False, False, True]


def test_a_bound_the_controller_keeps_pressing_on_is_named_once(lm_dir, tmp_path):
    import warnings

    from klppo.integrations.trl.callback import ControllerBoundWarning

    trainer = make_trainer("grpo", lm_dir, tmp_path, max_steps=8)
    attach(trainer, "pid", unit="per_token_mean", target=1e-9, beta_max=trainer.beta)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.train()
    said = [str(w.message) for w in seen if issubclass(w.category, ControllerBoundWarning)]
    assert len(said) == 1 and "beyond beta_max=0.1 for 3 updates in a row" in said[0], said
    assert trainer.beta == 0.1
