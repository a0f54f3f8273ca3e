"""The KL the controller is fed is the KL beta multiplies, for every GRPO ``loss_type``.

One training step of the real GRPOTrainer per loss type on a batch with unequal completion
lengths; the loss call's inputs and the policy's weights are recorded. Then, independently:

* by hand: the completions scored by that policy, TRL's k3 per token (``e^r - r - 1``, r the
  reference's minus the policy's log-probability, float64), reduced with the loss type's
  normaliser written out here from TRL's loss code;
* by TRL: its own ``_compute_loss`` on the same inputs at beta 1 minus at beta 0, which is the
  KL term alone (the loss is linear in beta);

and both equal ``kl_penalised``, the value klppo fed (``unit`` left at its default).
"""

import copy
import warnings

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

from klppo.integrations.trl import LOSS_UNITS, attach  # noqa: E402
from tests.integrations.trl_setup import make_trainer, tiny_lm_dir  # noqa: E402

MAX_LEN = 8  # make_trainer's max_completion_length


def _by_hand(loss_type: str, kl: torch.Tensor, mask: torch.Tensor, num_items: float) -> float:
    """TRL 1.16 ``_compute_loss``'s reduction of a per-token term, for one process, one
    gradient-accumulation step and one step per generation."""
    m = mask.double()
    tokens_per_seq = m.sum(1).clamp(min=1.0)
    if loss_type in ("grpo", "sapo"):
        return float(((kl * m).sum(1) / tokens_per_seq).mean())
    if loss_type == "bnpo":
        return float((kl * m).sum() / m.sum())
    if loss_type == "dr_grpo":
        return float((kl * m).sum() / (kl.shape[0] * MAX_LEN))
    if loss_type == "luspo":
        return float((kl * m).sum(1).mean())
    return float((kl * m).sum() / num_items)  # dapo, cispo, vespo


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return tiny_lm_dir(tmp_path_factory.mktemp("trl_loss_types"))


@pytest.mark.parametrize("loss_type", sorted(LOSS_UNITS))
def test_the_fed_kl_is_the_kl_term_of_trls_loss(loss_type, lm_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", perturb=0.05, eos_bias=4.0,
                           max_steps=1, loss_type=loss_type)
    cb = attach(trainer, "proportional", target=0.5, beta_min=1e-3)
    assert cb.unit == cb.penalised_unit == LOSS_UNITS[loss_type]
    seen = {}
    loss_fn = cb.tap._loss_fn

    def record(model, inputs):
        seen.setdefault("call", (copy.deepcopy(inputs), copy.deepcopy(model.state_dict())))
        return loss_fn(model, inputs)

    cb.tap._loss_fn = record
    trainer.train()
    fed = cb.history[0]["kl_penalised"]
    assert cb.history[0]["kl"] == fed
    inputs, weights = seen["call"]
    mask = inputs["completion_mask"].bool()
    lengths = mask.sum(1)
    assert lengths.min() < lengths.max()  # unequal lengths: the reductions differ

    # by hand
    policy = AutoModelForCausalLM.from_pretrained(lm_dir)
    policy.load_state_dict(weights)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    n = mask.shape[1]
    with torch.no_grad():
        logits = policy(input_ids=ids, attention_mask=attn).logits[:, -n - 1:-1].double()
    logp = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    r = inputs["ref_per_token_logps"].double() - logp
    kl = torch.exp(r) - r - 1
    hand = _by_hand(loss_type, kl, mask, float(inputs["num_items_in_batch"]))
    assert fed == pytest.approx(hand, rel=1e-5)

    # by TRL: its loss at beta 1 minus at beta 0 is the KL term
    model = trainer.model
    model.load_state_dict(weights)
    model.train()
    terms = []
    for beta in (0.0, 1.0):
        trainer.beta = beta
        with torch.no_grad():
            terms.append(float(GRPOTrainer._compute_loss(trainer, model, inputs)))
    assert terms[1] - terms[0] == pytest.approx(fed, rel=1e-4, abs=1e-7)
    assert fed > 1e-3


def test_the_units_differ_on_unequal_lengths_and_each_is_exact(lm_dir, tmp_path):
    """One run, the controller in per_sequence_sum (GRPO default loss, dapo): the record's
    token mean is TRL's logged KL and its per-sequence sum the token mean times the mean length
    (exact here: one loss call per generation batch)."""
    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", perturb=0.05, eos_bias=4.0,
                           max_steps=2)
    cb = attach(trainer, "proportional", unit="per_sequence_sum", target=0.5, beta_min=1e-3)
    trainer.train()
    for rec in cb.history:
        assert rec["penalised_unit"] == "per_token_mean"
        assert rec["kl_penalised"] == pytest.approx(rec["kl_logged"], rel=1e-6)
        assert rec["kl"] == pytest.approx(rec["kl_logged"] * rec["mean_length"], rel=1e-6)


def test_gradient_accumulation_and_several_passes_are_read_exactly(lm_dir, tmp_path):
    """Settings under which a mean length could not convert the logged KL (several loss calls
    per log) are served: the window pools every call's tokens."""
    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", perturb=0.05, eos_bias=4.0,
                           max_steps=2, gradient_accumulation_steps=2, num_iterations=2,
                           per_device_train_batch_size=2, loss_type="grpo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # token-level bias correction: no gradient warning
        cb = attach(trainer, "proportional", target=0.5, beta_min=1e-3)
    trainer.train()
    assert cb.tap.calls == 4 and len(cb.history) == 2
    assert all(r["kl"] is not None and r["kl"] > 0 for r in cb.history)


WINDOWS = [  # (gradient_accumulation_steps, steps_per_generation, num_iterations, logging_steps)
    (2, 2, 1, 1),  # TRL's default windowing, two micro-batches per step
    (1, 2, 1, 1),  # a generation batch spans two optimiser steps
    (2, 4, 1, 1),
    (2, 4, 2, 2),  # a log spans two optimiser steps, each batch seen twice
]


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: "ga{}-s{}-it{}-log{}".format(*w))
@pytest.mark.parametrize("loss_type", sorted(LOSS_UNITS))
def test_the_fed_kl_is_trls_term_over_whole_optimiser_steps(loss_type, window, lm_dir,
                                                            tmp_path):
    """Every loss call of the run recorded (inputs, weights, accumulation steps); TRL's own
    ``_compute_loss`` at beta 1 minus beta 0 on each, summed over a log's calls and divided by
    its optimiser steps, is ``kl_penalised`` for every log. The micro-batches' KLs differ."""
    from trl import GRPOTrainer

    ga, spg, iters, log_every = window
    trainer = make_trainer("grpo", lm_dir, tmp_path / "o", perturb=0.05, eos_bias=4.0,
                           max_steps=2 * log_every, loss_type=loss_type,
                           per_device_train_batch_size=2, gradient_accumulation_steps=ga,
                           steps_per_generation=spg, num_iterations=iters,
                           logging_steps=log_every)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cb = attach(trainer, "proportional", target=0.5, beta_min=1e-3)
    calls = []
    loss_fn = cb.tap._loss_fn

    def record(model, inputs):
        calls.append((copy.deepcopy(inputs), copy.deepcopy(model.state_dict()),
                      trainer.current_gradient_accumulation_steps, trainer.state.global_step,
                      trainer.beta))
        return loss_fn(model, inputs)

    cb.tap._loss_fn = record
    trainer.train()
    assert len(cb.history) == 2 and len(calls) == 2 * log_every * ga

    model = trainer.model
    model.train()
    terms, per_call_kl = [], []
    for inputs, weights, call_ga, _, _ in calls:
        model.load_state_dict(weights)
        trainer.current_gradient_accumulation_steps = call_ga
        losses = []
        for beta in (0.0, 1.0):
            trainer.beta = beta
            with torch.no_grad():
                losses.append(float(GRPOTrainer._compute_loss(trainer, model, inputs)))
        terms.append(losses[1] - losses[0])
        per_call_kl.append(terms[-1] * call_ga)
    assert max(per_call_kl) > 1.05 * min(per_call_kl)  # unequal micro-batch KLs
    per_log = len(calls) // 2
    for i, rec in enumerate(cb.history):
        expect = sum(terms[i * per_log:(i + 1) * per_log]) / log_every
        assert rec["kl_penalised"] == pytest.approx(expect, rel=1e-4, abs=1e-7)
        assert rec["kl"] == rec["kl_penalised"]
