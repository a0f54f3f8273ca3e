"""One RLHF experiment in memory: policy + value head, frozen reference, optimiser, controller and
every random generator; :meth:`Experiment.iterate` runs one PPO iteration.

One iteration: sample prompts (windows of training text) -> generate responses with a KV cache
-> score (task reward; policy, value and reference log-probs in one full forward each) -> per-token
KL(policy || reference) and rewards -> GAE -> PPO epochs (the core's clipped loss) -> controller
update on the measured KL (in ``kl_unit``) -> metrics.

:meth:`Experiment.state_dict` holds everything the next iteration depends on (weights, Adam
state, controller, the sampling generator, the numpy prompt generator, torch's and Python's
global generators, the iteration), so a run restored from it continues exactly.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.core.advantages import gae
from klppo.core.controller_base import BoundWatch
from klppo.core.controllers import RUN_HORIZON_FRACTION, make_controller
from klppo.core.covariance import ClipCov
from klppo.core.kl import per_sequence_sum, per_token_mean
from klppo.core.kl_loss import kl_loss_terms
from klppo.core.loss import PPOLoss
from klppo.core.mismatch import mismatch_stats, mismatch_weights
from klppo.core.monitor import KLMonitor
from klppo.core.sequence_objectives import Segments
from klppo.lm.config import ConfigError, RLHFConfig, controller_options, kl_loss_form
from klppo.lm.config_checks import objective_knobs, validate_rlhf
from klppo.lm.model import (
    PolicyWithValue,
    frozen_reference,
    load_lm,
    mix_reference,
    rollout_copy,
    sync_rollout,
)
from klppo.lm.past import checked_past, cpu_copy
from klppo.lm.pretrain import perplexity
from klppo.lm.reward import RewardFn, checked, make_reward
from klppo.lm.sampling import generate, response_mask
from klppo.lm.scoring import distinct_n, per_token_kl, score_sequences, token_rewards
from klppo.lm.setup import (
    KL_UNITS,
    check_lengths,
    corpus_ids,
    measure_kl,
    say_what_the_choices_mean,
)
from klppo.runs.checkpoint import checkpoint_file
from klppo.runs.device import resolve_device

log = logging.getLogger(__name__)

__all__ = ["Experiment", "TIMING_KEYS", "STATE_KEYS", "corpus_ids", "measure_kl", "KL_UNITS"]

#: metrics that measure wall time; everything else is deterministic for a given config.
TIMING_KEYS = frozenset({"tokens_per_second_generation", "tokens_per_second_scoring",
                         "tokens_per_second_training"})
#: what :meth:`Experiment.state_dict` holds
STATE_KEYS = ("iteration", "policy", "opt", "ctrl", "gen", "rng", "torch_rng", "python_rng")


class Experiment:
    """Everything one RLHF run holds in memory. Construction loads and checks all inputs (the
    config, the model, the reward) and raises ``ConfigError`` naming the field on bad ones."""

    def __init__(self, cfg: RLHFConfig, reward: RewardFn | None = None) -> None:
        self.cfg = validate_rlhf(cfg)
        torch.manual_seed(cfg.seed)
        lm, self.tok = load_lm(cfg.model)
        check_lengths(cfg, lm)
        self.device = resolve_device(cfg.device)
        self.ref = frozen_reference(lm).to(self.device)
        self.policy = PolicyWithValue(lm).to(self.device)
        self.policy.train()
        self.rollout_lm = None
        if cfg.rollout_dtype != "float32" or cfg.staleness:
            self.rollout_lm = rollout_copy(self.policy.lm, getattr(torch, cfg.rollout_dtype))
        # the policy after each of the last staleness + 1 updates (update 0: the initial one)
        self.past: deque[dict[str, torch.Tensor]] = deque(maxlen=cfg.staleness + 1)
        if cfg.staleness:
            self.past.append(cpu_copy(self.policy.lm.state_dict()))
        self.reward = reward or make_reward(cfg.reward)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr, eps=1e-5)
        try:
            self.ctrl = make_controller(cfg.controller, **controller_options(cfg))
        except ValueError as e:
            raise ConfigError(f"controller={cfg.controller!r}: {e}") from None
        self.loss = PPOLoss(cfg.objective, eps=cfg.eps, eps_low=cfg.eps_low,
                            eps_high=cfg.eps_high, vf_coef=cfg.vf_coef,
                            value_clip=cfg.value_clip, normalize_advantage="none",
                            knobs=objective_knobs(cfg))
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._bounds = BoundWatch()
        if cfg.cov_selection == "random":  # Clip-Cov's uniform draw, checkpointed with gen
            assert isinstance(self.loss.policy, ClipCov)  # validate_rlhf: clip_cov only
            self.loss.policy.generator = self.gen
        self.rng = np.random.default_rng(cfg.seed)
        self.train_ids, self.held_ids = corpus_ids(self.tok)
        if len(self.train_ids) <= cfg.prompt_len:
            raise ConfigError(f"prompt_len={cfg.prompt_len!r}: longer than the training text")
        self.eos = self.tok.eos_token_id
        self.ppl_initial = perplexity(self.policy.lm, self.held_ids, cfg.eval_seq_len,
                                      cfg.eval_windows)
        self.kl_monitor = KLMonitor(cfg.target, cfg.monitor_high, cfg.monitor_low,
                                    cfg.monitor_patience, KL_UNITS[cfg.kl_unit],
                                    cfg.monitor_warmup)
        say_what_the_choices_mean(cfg)
        self.iteration = 0
        self.ref_resets = 0

    # ------------------------------------------------ the run lifecycle's Trainer protocol
    @property
    def num_iterations(self) -> int:
        return self.cfg.iterations

    @property
    def checkpoint_every(self) -> int:
        return self.cfg.checkpoint_every

    def describe(self, m: dict[str, Any]) -> str:
        return f"score {m['score']:.4g} kl {m['kl']:.4g} ({m['kl_unit']}) beta {m['beta']:.4g}"

    def check(self, m: dict[str, Any]) -> list[str]:
        return []  # the KL monitor warns in iterate (it sees the measured KL first)

    def checkpoint(self, run_dir: Path) -> list[tuple[Path, bytes]]:
        """Export the policy (a Hugging Face directory), then give the checkpoint to write:
        a checkpoint on disk implies a policy export at least as new."""
        tmp, final = run_dir / ".policy.tmp", run_dir / "policy"
        shutil.rmtree(tmp, ignore_errors=True)
        self.policy.lm.save_pretrained(tmp)
        self.tok.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return [checkpoint_file(run_dir, self.state_dict())]

    def close(self) -> None:
        """Nothing to release (the models are freed with the object)."""

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "policy": self.policy.state_dict(),
                "opt": self.opt.state_dict(), "ctrl": self.ctrl.state_dict(),
                "gen": self.gen.get_state(), "rng": self.rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                "ppl_initial": self.ppl_initial, "kl_monitor": self.kl_monitor.state_dict(),
                # the reference only once a reset has moved it (else the model file has it)
                "ref": self.ref.state_dict() if self.ref_resets else None,
                "ref_resets": self.ref_resets, "past_policies": list(self.past),
                "config": dataclasses.asdict(self.cfg)}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.policy.load_state_dict(s["policy"])
        self.opt.load_state_dict(s["opt"])
        self.ctrl.load_state_dict(s["ctrl"])
        self.gen.set_state(s["gen"])
        self.rng.bit_generator.state = s["rng"]
        torch.set_rng_state(s["torch_rng"])
        random.setstate(s["python_rng"])
        self.ppl_initial = float(s.get("ppl_initial", self.ppl_initial))
        if "kl_monitor" in s:
            self.kl_monitor.load_state_dict(s["kl_monitor"])
        self.past.clear()
        self.past.extend(checked_past(s.get("past_policies", []), self.cfg.staleness,
                                      self.policy.lm.state_dict()))
        self.ref_resets = int(s.get("ref_resets", 0))
        if self.ref_resets:
            self.ref.load_state_dict(s["ref"])
        self.iteration = int(s["iteration"])

    def reset_reference(self, it: int, measured: float) -> dict[str, Any]:
        """After the update of iteration ``it``: move the reference towards the policy when
        ``ref_reset_every`` divides ``it`` or the measured KL exceeds ``ref_reset_kl``; the
        metrics ``ref_reset`` (0 / 1) and ``ref_resets`` (the run's count), when either is on."""
        c = self.cfg
        if c.ref_reset_every is None and c.ref_reset_kl is None:
            return {}
        due = (c.ref_reset_every is not None and it % c.ref_reset_every == 0) or (
            c.ref_reset_kl is not None and measured > c.ref_reset_kl)
        if due:
            mix_reference(self.ref, self.policy.lm, c.ref_reset_mix)
            self.ref_resets += 1
        return {"ref_reset": int(due), "ref_resets": self.ref_resets}

    # ---------------------------------------------------------------- phases
    def prompts(self) -> torch.Tensor:
        c = self.cfg
        starts = self.rng.integers(0, len(self.train_ids) - c.prompt_len, c.batch_size)
        ids = np.stack([self.train_ids[s:s + c.prompt_len] for s in starts])
        return torch.from_numpy(ids).to(self.device)

    def iterate(self) -> dict[str, Any]:
        """Run iteration ``self.iteration + 1``; return its metrics."""
        c, it = self.cfg, self.iteration + 1
        beta = self.ctrl.value
        t0 = time.perf_counter()
        prompts = self.prompts()                                            # 1. collect
        self.policy.eval()
        sampler = self.policy.lm
        if self.rollout_lm is not None and c.staleness:  # the policy staleness updates back
            sampler = self.rollout_lm
            sampler.load_state_dict(self.past[0])
        elif self.rollout_lm is not None:  # the inference engine's copy, in its precision
            sampler = sync_rollout(self.rollout_lm, self.policy.lm)
        responses, logp_rollout = generate(sampler, prompts, c.response_len, self.gen,
                                           c.temperature)
        t1 = time.perf_counter()
        b = self.score(prompts, responses, beta)                            # 2. score, GAE
        b.update(self.mismatch(b, logp_rollout.cpu()))
        b["logp_sampler"] = logp_rollout.cpu() if self.rollout_lm is not None else None
        t2 = time.perf_counter()
        stats = self.update(prompts, responses, b, beta)                    # 3. update
        if c.staleness:
            self.past.append(cpu_copy(self.policy.lm.state_dict()))
        t3 = time.perf_counter()
        measured = measure_kl(b["kl"], b["mask"], c.kl_unit)
        self.warn_held(it)
        self.ctrl.update(measured, n_steps=c.batch_size)                    # 4. controller
        self.warn_bound(it)
        reset = self.reset_reference(it, measured)
        alarm = self.kl_monitor.update(measured)
        if alarm.message:
            log.warning("iteration %d: %s", it, alarm.message)
        self.iteration = it
        n_tok = int(b["mask"].sum())
        m: dict[str, Any]
        m = {**self.metrics(it, beta, measured, b, responses),              # 5. log
             **alarm.as_metrics(), **reset, **b["mismatch"],
             "tokens_per_second_generation": n_tok / max(t1 - t0, 1e-9),
             "tokens_per_second_scoring": n_tok / max(t2 - t1, 1e-9),
             "tokens_per_second_training": n_tok * c.ppo_epochs / max(t3 - t2, 1e-9),
             **stats}
        if it % c.eval_every == 0 or it == 1 or it == c.iterations:
            m["held_out_perplexity"] = perplexity(self.policy.lm, self.held_ids, c.eval_seq_len,
                                                  c.eval_windows)
            m["held_out_perplexity_initial"] = self.ppl_initial  # before any update
            m["samples"] = [{"prompt": p, "response": r, "score": float(x)} for p, r, x
                            in list(zip(b["texts_p"], b["texts_r"], b["score"].tolist()))[:4]]
        return m

    def score(self, prompts: torch.Tensor, responses: torch.Tensor,
              beta: float) -> dict[str, Any]:
        """Task score, per-token KL and rewards, GAE advantages (normalised) and returns."""
        c = self.cfg
        s = {k: v.cpu() for k, v in score_sequences(self.policy, self.ref, prompts,
                                                    responses).items()}  # the rest on the CPU
        prompts, responses = prompts.cpu(), responses.cpu()
        mask = response_mask(responses, self.eos, c.stop_at_eos)
        texts_p, texts_r = self.tok.batch_decode(prompts), self.tok.batch_decode(responses)
        score = torch.tensor(checked(self.reward, texts_p, texts_r), dtype=torch.float32)
        kl = per_token_kl(c.kl_estimator, s["logp"], s["logp_ref"], mask, s["logits"],
                          s["logits_ref"])
        rewards = token_rewards(kl, score, mask, beta, c.kl_placement == "reward")
        last = mask.long().sum(1) - 1
        term = torch.zeros_like(mask)
        term[torch.arange(len(last)), last] = True
        values = torch.where(mask, s["values"], torch.zeros(()))
        nxt = torch.cat([values[:, 1:], torch.zeros(len(values), 1)], 1)
        adv, ret = gae(rewards.T.contiguous(), values.T.contiguous(), nxt.T.contiguous(),
                       term.T.contiguous(), torch.zeros_like(term).T.contiguous(), c.gamma,
                       c.lam)
        adv, ret = adv.T, ret.T
        valid = adv[mask]
        adv = torch.where(mask, (adv - valid.mean()) / (valid.std() + 1e-8), torch.zeros(()))
        return {"mask": mask, "s": s, "score": score, "kl": kl, "adv": adv, "ret": ret,
                "texts_p": texts_p, "texts_r": texts_r}

    def mismatch(self, b: dict[str, Any], logp_rollout: torch.Tensor) -> dict[str, Any]:
        """The per-token weights of the mismatch correction (``weights``, None when there is
        nothing to correct) and the mismatch's size (``mismatch``: metrics)."""
        c = self.cfg
        if self.rollout_lm is None and c.mismatch_correction == "none":
            return {"weights": None, "mismatch": {}}
        log_ratio = b["s"]["logp"] - logp_rollout
        w = mismatch_weights(log_ratio, b["mask"], c.mismatch_correction, c.mismatch_upper,
                             c.mismatch_lower, c.mismatch_reject)
        return {"weights": None if c.mismatch_correction == "none" else w,
                "mismatch": mismatch_stats(log_ratio, b["mask"], w)}

    def warn_held(self, it: int) -> None:
        """Say once, ``RUN_HORIZON_FRACTION`` into a run whose KL has never reached the target,
        that the start beta (held or not) may be too strong for it to get there."""
        c, ctrl = self.cfg, self.ctrl
        if (c.controller == "fixed" or c.target is None or ctrl.reached
                or it != math.floor(RUN_HORIZON_FRACTION * c.iterations) + 1):
            return
        held = ctrl.info is not None and ctrl.info.held
        if held and c.hold_limit is not None:
            return  # the limit releases it
        log.warning("iteration %d: beta %s %g: the KL (%s) has not reached its target %g in "
                    "%d%% of the run; a beta this strong may never let it (start lower%s)", it,
                    "is still held at" if held else "is", ctrl.value, c.kl_unit, c.target,
                    round(100 * RUN_HORIZON_FRACTION),
                    ", set hold_limit, or run without hold" if held else "")

    def warn_bound(self, it: int) -> None:
        """Say once per bound when the rule has asked for a beta past it for a tenth of the run
        in a row (at least 3 iterations); not ``beta_min`` before the KL first reaches the
        target (the KL starts at 0: a rule without a hold lowers beta while it ramps up)."""
        info, need = self.ctrl.info, max(3, self.cfg.iterations // 10)
        bound = info.at_bound if info is not None else None
        if bound == "beta_min" and not self.ctrl.reached:
            bound = None
        if self._bounds.see(bound, it, need) and info is not None and bound is not None:
            log.warning("iteration %d: the %s rule has asked for a beta past %s = %g for %d "
                        "iterations in a row: within its bounds beta cannot move the KL to its "
                        "target %g (%s) meanwhile (KL %.4g)", it, self.cfg.controller, bound,
                        getattr(self.cfg, bound), need, self.cfg.target, self.cfg.kl_unit,
                        info.observed)

    def metrics(self, it: int, beta: float, measured: float, b: dict[str, Any],
                responses: torch.Tensor) -> dict[str, Any]:
        c, mask, kl, score, s = self.cfg, b["mask"], b["kl"], b["score"], b["s"]
        k1 = per_token_kl("k1", s["logp"], s["logp_ref"], mask)
        k3 = per_token_kl("k3", s["logp"], s["logp_ref"], mask)
        info = self.ctrl.info
        assert info is not None  # iterate updated the controller before logging
        return {
            "iteration": it, "global_step": it * c.batch_size, "episodes": it * c.batch_size,
            "score": float(score.mean()), "kl": measured, "kl_unit": c.kl_unit,
            "kl_estimator": c.kl_estimator,
            **({"kl_loss_form": kl_loss_form(c)} if c.kl_placement == "loss" else {}),
            "kl_k1_per_sequence_sum": float(per_sequence_sum(k1, mask).mean()),
            "kl_k3_per_sequence_sum": float(per_sequence_sum(k3, mask).mean()),
            "kl_k1_per_token_mean": float(per_token_mean(k1, mask)),
            "kl_k3_per_token_mean": float(per_token_mean(k3, mask)),
            "kl_target": c.target,
            "kl_abs_error": None if c.target is None else abs(measured - c.target),
            "beta": beta, "beta_after": info.beta_after,
            "kl_relative_error": info.relative_error,
            "kl_error_clipped": float(info.error_clipped),
            "held": float(info.held), "at_bound": info.at_bound,
            "score_minus_beta_kl": float((score - beta * per_sequence_sum(kl, mask)).mean()),
            "distinct_2": distinct_n(responses.tolist(), 2),
        }

    def token_weights(self, weights: torch.Tensor | None, idx: torch.Tensor, mk: torch.Tensor,
                      seq: torch.Tensor) -> torch.Tensor | None:
        """The per-token weight on a minibatch's objective (None: 1): the mismatch
        correction's, times ``N / (S L_i)`` under loss_reduction seq_mean_token_mean (the token
        mean of the weighted objective is then the mean over responses of their token means)."""
        w = None if weights is None else weights.to(mk.device)[idx][mk]
        if self.cfg.loss_reduction == "seq_mean_token_mean":
            per_response = Segments(seq).weight(torch.float32)
            w = per_response if w is None else w * per_response
        return w

    def update(self, prompts: torch.Tensor, responses: torch.Tensor, b: dict[str, Any],
               beta: float) -> dict[str, float]:
        c, dev = self.cfg, self.device
        s, mask, adv, ret = b["s"], b["mask"].to(dev), b["adv"].to(dev), b["ret"].to(dev)
        self.policy.train()
        logp_old, v_old = s["logp"].detach().to(dev), s["values"].detach().to(dev)
        logp_ratio = logp_old  # what the objective's ratio divides by
        if self.loss.policy.ratio_to_sampler and b["logp_sampler"] is not None:
            logp_ratio = b["logp_sampler"].to(dev)  # TOPR: the ratio to the behaviour policy
        logp_ref = s["logp_ref"].to(dev)
        sums: dict[str, float] = {}
        n = 0
        for _ in range(c.ppo_epochs):
            perm = torch.randperm(c.batch_size, generator=self.gen, device=dev)
            for i in range(0, c.batch_size, c.minibatch_size):
                idx = perm[i:i + c.minibatch_size]
                cur = score_sequences(self.policy, None, prompts[idx], responses[idx], grad=True)
                mk = mask[idx]
                seq = mk.nonzero()[:, 0]  # each token's sequence
                w = self.token_weights(b["weights"], idx, mk, seq)
                out = self.loss(cur["logp"][mk], logp_ratio[idx][mk], adv[idx][mk],
                                cur["values"][mk], ret[idx][mk], v_old[idx][mk],
                                sequence_ids=seq, sample_weight=w)
                loss = out["loss"]
                if c.kl_placement == "loss":  # beta * the kl_loss form, mean over responses
                    kl_loss = kl_loss_terms(kl_loss_form(c), cur["logp"], logp_ref[idx],
                                            logp_old[idx], mk).mean()
                    loss = loss + beta * kl_loss
                    out["kl_loss"] = kl_loss.detach()
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.max_grad_norm)
                self.opt.step()
                for k in ("loss", "loss_objective", "loss_critic", "clip_fraction", "kl_k3",
                          "frac_kill", "kl_loss"):
                    if k in out:
                        sums[k] = sums.get(k, 0.0) + float(out[k].detach())
                n += 1
        renamed = {"kl_k3": "kl_old_new_k3"}
        return {renamed.get(k, k): v / n for k, v in sums.items()}
