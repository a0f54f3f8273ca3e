import dataclasses
import json
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from klppo.core.kl_gradient_claims import KLGradientWarning  # noqa: E402
from klppo.lm.config import ConfigError, RLHFConfig, kl_gradient_warning  # noqa: E402
from klppo.lm.config_checks import validate_rlhf  # noqa: E402
from klppo.lm.model import (  # noqa: E402
    PolicyWithValue,
    frozen_reference,
    load_lm,
    small_gpt2,
    train_tokenizer,  # noqa: E402
)
from klppo.lm.reward import checked  # noqa: E402
from klppo.lm.rlhf import (  # noqa: E402
    distinct_n,
    per_token_kl,
    rlhf,
    score_sequences,
    token_rewards,
)
from klppo.lm.sampling import generate, response_mask, token_logprobs  # noqa: E402


def tiny(vocab=64, seed=0):
    return small_gpt2(vocab, n_positions=64, n_embd=16, n_layer=2, n_head=2, seed=seed)


def test_kv_cache_logprobs_match_a_full_forward():
    model = tiny().eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 64, (5, 7), generator=gen)
    responses, logp = generate(model, prompts, 9, gen)
    assert responses.shape == logp.shape == (5, 9)
    policy = PolicyWithValue(model)
    s = score_sequences(policy, None, prompts, responses)
    assert torch.allclose(s["logp"], logp, atol=1e-5)
    full = model(input_ids=torch.cat([prompts, responses], 1)).logits
    assert torch.allclose(token_logprobs(full[:, 6:15], responses), logp, atol=1e-5)


def test_kl_to_the_reference_is_exactly_zero_at_step_0():
    model = tiny()
    policy, ref = PolicyWithValue(model), frozen_reference(model)
    prompts = torch.randint(0, 64, (4, 6))
    responses, _ = generate(model, prompts, 8, torch.Generator().manual_seed(1))
    s = score_sequences(policy, ref, prompts, responses)
    mask = torch.ones_like(responses, dtype=torch.bool)
    for est in ("k1", "k3", "full"):
        kl = per_token_kl(est, s["logp"], s["logp_ref"], mask, s["logits"], s["logits_ref"])
        assert torch.equal(kl, torch.zeros_like(kl)), est


def test_padding_and_prompt_tokens_never_enter_kl_or_rewards():
    torch.manual_seed(0)
    B, R, V = 3, 6, 11
    logp, logp_ref = -torch.rand(B, R), -torch.rand(B, R)
    logits, logits_ref = torch.randn(B, R, V), torch.randn(B, R, V)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]).bool()
    nan = torch.tensor(float("nan"))
    for est in ("k1", "k3", "full"):
        clean = per_token_kl(est, logp, logp_ref, mask, logits, logits_ref)
        dirty = per_token_kl(est, torch.where(mask, logp, nan), torch.where(mask, logp_ref, nan),
                             mask, torch.where(mask[..., None], logits, nan),
                             torch.where(mask[..., None], logits_ref, nan))
        assert torch.equal(clean, dirty) and bool((dirty[~mask] == 0).all())
    r = token_rewards(torch.ones(B, R), torch.tensor([1.0, 2.0, 3.0]), mask, 0.5, True)
    assert r[1].tolist() == [-0.5, -0.5, 1.5, 0, 0, 0] and r[2].tolist() == [2.5, 0, 0, 0, 0, 0]
    # the scored positions are the response positions only: changing prompt-position logits
    # of the reference (by changing the prompt) changes nothing but through the context
    model = tiny()
    policy, ref = PolicyWithValue(model), frozen_reference(model)
    s = score_sequences(policy, ref, torch.randint(0, 64, (2, 5)), torch.randint(0, 64, (2, 4)))
    assert s["logp"].shape == s["logp_ref"].shape == s["values"].shape == (2, 4)
    assert response_mask(torch.tensor([[3, 0, 5, 0]]), 0, True).tolist() == [[1, 1, 0, 0]]


def test_reward_interface_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 prompts but 3 responses"):
        checked(lambda p, r: [0.0] * len(r), ["a", "b"], ["x", "y", "z"])
    with pytest.raises(ValueError, match="3 responses but 2 scores"):
        checked(lambda p, r: [0.0, 1.0], ["a", "b", "c"], ["x", "y", "z"])
    with pytest.raises(ValueError, match="not finite"):
        checked(lambda p, r: [float("nan")], ["a"], ["x"])
    assert distinct_n([[1, 2, 1, 2]], 2) == pytest.approx(2 / 3)


def test_saved_model_loads_with_auto_classes(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.n_layer == 1
    assert AutoTokenizer.from_pretrained(tiny_model_dir).eos_token == "<|endoftext|>"
    model, tok = load_lm(tiny_model_dir)
    assert tok.pad_token is not None
    with pytest.raises(ValueError, match="model=.*no such directory.*klppo lm pretrain"):
        load_lm(tiny_model_dir / "nope")


@pytest.mark.parametrize("placement, estimator, form", [
    ("reward", "k1", None), ("loss", "k3", "k3"), ("loss", "k3", None), ("reward", "full", None)])
def test_two_iteration_run_writes_the_expected_metrics(tiny_model_dir, tmp_path, placement,
                                                       estimator, form):
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "run"), iterations=2,
                     batch_size=4, minibatch_size=2, prompt_len=6, response_len=5,
                     eval_every=1, eval_windows=2, controller="proportional", beta=0.1,
                     target=1.0, ppo_epochs=1, kl_placement=placement, kl_estimator=estimator,
                     kl_loss=form)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # counts every call, not only the first per place
        res = rlhf(cfg, reward=lambda p, r: [float(len(x) % 3) for x in r])
    said = [str(w.message) for w in caught if issubclass(w.category, KLGradientWarning)]
    if (placement, estimator) == ("reward", "k1") or (placement, form) == ("loss", None):
        assert said == []  # the unbiased ones (k1 in the reward, k1_to_go in the loss): silent
    else:  # once per run, naming the setting, the combination, its KL and the unbiased forms
        [msg] = said
        assert f"kl_estimator={estimator}, kl_placement={placement}" in msg
        assert {"loss": "k3 in the loss", "reward": f"{estimator} in the reward"}[placement] in msg
        assert "neither KL(policy || reference) nor KL(reference || policy)" in msg
        assert "unbiased forms of KL(policy || reference) here: kl_estimator=k1 with " \
               "kl_placement=reward or kl_placement=loss with kl_loss=k1_to_go or " \
               "kl_placement=loss with kl_loss=k2_sequence or kl_placement=loss with " \
               "kl_loss=k3_ratio" in msg
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    for k in ("score", "kl", "kl_unit", "kl_k1_per_sequence_sum", "kl_k3_per_sequence_sum",
              "kl_abs_error", "beta", "beta_after", "score_minus_beta_kl", "clip_fraction",
              "distinct_2", "held_out_perplexity_initial", "tokens_per_second_generation",
              "tokens_per_second_scoring", "tokens_per_second_training", "held_out_perplexity",
              "samples"):
        assert k in recs[1], k
    assert recs[0]["kl"] == 0.0 and recs[0]["kl_unit"] == "per_sequence_sum"
    assert recs[1]["beta"] == recs[0]["beta_after"]
    assert (res.run_dir / "policy" / "config.json").exists()
    assert ("kl_loss" in recs[1]) == (placement == "loss")
    if placement == "loss":
        assert recs[1]["kl_loss_form"] == (form or "k1_to_go")
    assert recs[1]["kl_estimator"] == estimator
    assert json.loads((res.run_dir / "status.json").read_text())["state"] == "finished"


def test_kl_gradient_warning_names_the_kl_each_setting_descends():
    warn = lambda **kw: kl_gradient_warning(RLHFConfig(**kw))
    assert warn(kl_estimator="k1", kl_placement="reward") is None
    # the loss is its kl_loss form whatever kl_estimator says (which then only measures the KL)
    for est in ("k1", "k3", "full"):
        msg = warn(kl_estimator=est, kl_placement="loss", kl_loss="k3", response_len=1)
        assert "k3 in the loss (per token, on-policy, 1 token)" in msg
        assert "KL(reference || policy), the forward KL" in msg
        for form in ("k1_to_go", "k2_sequence", "k3_ratio", None):  # unbiased, whole responses
            assert warn(kl_estimator=est, kl_placement="loss", kl_loss=form) is None
    msg = warn(kl_estimator="k3", kl_placement="loss", kl_loss="k3", response_len=24)
    assert "24 tokens" in msg and "(for a single token: KL(reference || policy)" in msg
    with pytest.raises(ConfigError, match=r"kl_loss='k3': only kl_placement=loss reads it"):
        validate_rlhf(RLHFConfig(kl_loss="k3"))
    for est in ("k3", "full", "k3_flipped", "tutorial"):
        assert f"{est} in the reward" in warn(kl_estimator=est, kl_placement="reward")


def test_classifier_reward_from_a_local_hf_model(tmp_path):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from klppo.lm.reward import ClassifierReward, make_reward

    tok = train_tokenizer("good bad fine awful lovely " * 100, vocab_size=280)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=8, n_layer=1, n_head=2,
                     num_labels=2, pad_token_id=tok.pad_token_id)
    GPT2ForSequenceClassification(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    r = ClassifierReward(tmp_path, label=1, probability=True)
    scores = checked(r, ["a", "b"], ["good lovely", "awful"])
    assert len(scores) == 2 and all(0 <= x <= 1 for x in scores)
    assert checked(make_reward(f"classifier:{tmp_path}:0"), ["a"], ["fine"])
    with pytest.raises(ValueError, match="reward="):
        make_reward("imdb")


def test_the_proportional_horizon_never_lets_one_update_zero_beta():
    # default: iterations * batch_size / 30, at least batch_size (one update moves beta by at
    # most the rule's clip); 2 iterations of 32 gave 2.13 episodes, and beta went 0.1 -> 0
    assert RLHFConfig(iterations=2, batch_size=32).effective_horizon == 32.0
    assert RLHFConfig(iterations=150, batch_size=32).effective_horizon == 160.0
    assert RLHFConfig(iterations=2, horizon=7.0).effective_horizon == 7.0
    with pytest.raises(ConfigError, match=r"horizon=6\.4: must exceed batch_size x 0\.2 = 6\.4 "
                                          r"episodes"):
        validate_rlhf(RLHFConfig(batch_size=32, horizon=6.4))
    validate_rlhf(RLHFConfig(batch_size=32, horizon=6.5))
    validate_rlhf(RLHFConfig(batch_size=32, horizon=1.0, controller="step"))  # not read


def test_a_two_iteration_run_keeps_a_positive_beta(tiny_model_dir, tmp_path):
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "run"), iterations=2,
                     batch_size=4, minibatch_size=2, prompt_len=6, response_len=5,
                     eval_every=1, eval_windows=2, beta=0.1, target=100.0, ppo_epochs=1)
    res = rlhf(cfg, reward=lambda p, r: [0.0 for _ in r])
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["beta_after"] for r in recs] == pytest.approx([0.08, 0.064])  # -20% each


def test_hold_keeps_beta_until_the_kl_reaches_the_target_and_warns_at_a_quarter(
        tiny_model_dir, tmp_path, caplog):
    # a target no run of 8 iterations reaches: held beta every iteration, one warning after
    # iteration 2 (a quarter of 8), naming the held beta; the same run without hold moves beta
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "held"), iterations=8,
                     batch_size=4, minibatch_size=2, prompt_len=6, response_len=5,
                     eval_every=8, eval_windows=2, beta=0.1, target=100.0, ppo_epochs=1,
                     hold=True)
    with caplog.at_level("WARNING", logger="klppo.lm.experiment"):
        res = rlhf(cfg, reward=lambda p, r: [0.0 for _ in r])
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["beta_after"] for r in recs] == [0.1] * 8
    assert [r["held"] for r in recs] == [1.0] * 8
    held = [m for m in caplog.messages if "still held" in m]
    assert len(held) == 1 and held[0].startswith("iteration 3: beta is still held at 0.1")
    free = rlhf(dataclasses.replace(cfg, out=str(tmp_path / "free"), hold=False),
                reward=lambda p, r: [0.0 for _ in r])
    recs = [json.loads(x) for x in (free.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["beta_after"] < 0.1 and recs[0]["held"] == 0.0


def test_a_hold_limit_releases_beta_after_its_iterations_without_the_warning(
        tiny_model_dir, tmp_path, caplog):
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(tmp_path / "held"), iterations=4,
                     batch_size=4, minibatch_size=2, prompt_len=6, response_len=5,
                     eval_every=4, eval_windows=2, beta=0.1, target=100.0, ppo_epochs=1,
                     hold=True, hold_limit=2)
    with caplog.at_level("WARNING", logger="klppo.lm.experiment"):
        res = rlhf(cfg, reward=lambda p, r: [0.0 for _ in r])
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["held"] for r in recs] == [1.0, 1.0, 0.0, 0.0]
    assert [r["beta_after"] for r in recs][:2] == [0.1, 0.1] and recs[2]["beta_after"] < 0.1
    assert not [m for m in caplog.messages if "still held" in m]


def test_a_hold_limit_needs_hold():
    with pytest.raises(ConfigError, match=r"^hold_limit=3: bounds a hold: set hold"):
        validate_rlhf(RLHFConfig(hold_limit=3, target=1.0))


def test_hold_needs_a_target():
    with pytest.raises(ConfigError, match=r"^hold=True: .*set a target"):
        validate_rlhf(RLHFConfig(hold=True, target=None))


def _bound_run(tiny_model_dir, path, caplog, **kw):
    cfg = RLHFConfig(model=str(tiny_model_dir), out=str(path), batch_size=4, minibatch_size=2,
                     prompt_len=6, response_len=5, eval_windows=2, ppo_epochs=1,
                     **{"beta": 0.1, **kw})
    with caplog.at_level("WARNING", logger="klppo.lm.experiment"):
        res = rlhf(cfg, reward=lambda p, r: [float(i % 2) for i in range(len(r))])
    return [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_rule_pushing_beta_past_its_bound_says_so_once(tiny_model_dir, tmp_path, caplog):
    # a target of 1e-9 nats, reached once the policy moves, and beta_max = beta held until
    # then: the rule asks for more when the KL is above it
    recs = _bound_run(tiny_model_dir, tmp_path / "run", caplog, iterations=6, eval_every=6,
                      beta_max=0.1, target=1e-9, hold=True, lr=0.05)
    assert [r["at_bound"] for r in recs].count("beta_max") >= 3
    bound = [m for m in caplog.messages if "cannot move the KL" in m]
    assert len(bound) == 1 and "beta past beta_max = 0.1 for 3 iterations in a row" in bound[0]


def test_beta_at_its_floor_while_the_kl_ramps_up_is_not_out_of_reach(
        tiny_model_dir, tmp_path, caplog):
    # a target of 100 nats and beta_min = beta: the rule asks for less every iteration, as it
    # should while the KL has not reached its target; one warning at a quarter of the run says
    # the target has not been reached, none calls it out of reach
    recs = _bound_run(tiny_model_dir, tmp_path / "run", caplog, iterations=4, eval_every=4,
                      beta_min=0.1, target=100.0)
    assert [r["at_bound"] for r in recs] == ["beta_min"] * 4
    assert not [m for m in caplog.messages if "cannot move the KL" in m]
    late = [m for m in caplog.messages if "has not reached" in m]
    assert len(late) == 1 and late[0].startswith("iteration 2: beta is 0.1: ")


def test_pid_without_gains_runs_on_the_relative_gains_of_its_target(tiny_model_dir, tmp_path,
                                                                     caplog):
    # the run's betas replayed from its own KLs by PIDKL with relative_pid_gains(target)
    from klppo.core.controllers import PIDKL, relative_pid_gains

    recs = _bound_run(tiny_model_dir, tmp_path / "run", caplog, iterations=4, eval_every=4,
                      controller="pid", beta=0.5, target=0.002)
    ref = PIDKL(beta=0.5, target=0.002, **relative_pid_gains(0.002))
    assert [r["beta_after"] for r in recs] == [ref.update(r["kl"]) for r in recs]
    assert len({r["beta_after"] for r in recs}) > 1


def test_the_pid_gains_of_an_rlhf_config():
    from klppo.lm.config import controller_options

    opts = controller_options(validate_rlhf(RLHFConfig(controller="pid", target=4.0, ki=0.5)))
    assert (opts["kp"], opts["ki"], opts["kd"]) == (0.25, 0.5, 0.0)
    with pytest.raises(ConfigError, match=r"^kp=1.0: a gain of the pid controller"):
        validate_rlhf(RLHFConfig(controller="proportional", kp=1.0))
