"""``rlhf(config) -> RLHFResult``: PPO on a language model with a KL penalty to a reference.

One iteration: sample prompts (windows of training text) -> generate responses with a KV cache
-> score (task reward; policy, value and reference log-probs in one full forward each) -> per-token
KL(policy || reference) and rewards -> GAE -> PPO epochs (the core's clipped loss) -> controller
update on the measured KL (in ``kl_unit``) -> log. Prompt tokens and padding never enter the KL,
the rewards or the loss: everything is computed on response positions and masked.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.core.advantages import gae
from klppo.core.controllers import make_controller
from klppo.core.kl import full_kl, per_sequence_sum, per_token_mean, sampled_kl
from klppo.core.loss import PPOLoss
from klppo.lm.config import RLHFConfig, validate_rlhf
from klppo.lm.model import PolicyWithValue, frozen_reference, load_lm
from klppo.lm.pretrain import encode, perplexity
from klppo.lm.reward import RewardFn, checked, make_reward
from klppo.lm.sampling import generate, response_mask, token_logprobs
from klppo.runs import metrics as M
from klppo.runs import rundir as R

log = logging.getLogger(__name__)

__all__ = ["RLHFResult", "rlhf", "score_sequences", "per_token_kl", "token_rewards",
           "distinct_n"]


@dataclass
class RLHFResult:
    run_dir: Path
    metrics: list[dict[str, Any]]


def score_sequences(policy: PolicyWithValue, ref, prompts: torch.Tensor,
                    responses: torch.Tensor, grad: bool = False) -> dict[str, torch.Tensor]:
    """Full forward passes over prompt + response; everything at response positions only.

    Returns ``logp`` and ``values`` of the policy and ``logp_ref`` of the reference, each
    ``[B, R]`` (``values[:, t]`` is the value of the state before response token t), and the
    policy and reference logits ``[B, R, V]`` that predict the response tokens.
    """
    seq = torch.cat([prompts, responses], 1)
    P, R = prompts.shape[1], responses.shape[1]
    with torch.set_grad_enabled(grad):
        logits, values = policy(seq)
        logits = logits[:, P - 1:P - 1 + R]
        out = {"logp": token_logprobs(logits, responses), "values": values[:, P - 1:P - 1 + R],
               "logits": logits}
    if ref is not None:
        with torch.no_grad():
            ref_logits = ref(input_ids=seq).logits[:, P - 1:P - 1 + R]
            out["logits_ref"] = ref_logits
            out["logp_ref"] = token_logprobs(ref_logits, responses)
    return out


def per_token_kl(estimator: str, logp: torch.Tensor, logp_ref: torch.Tensor,
                 mask: torch.Tensor, logits: torch.Tensor | None = None,
                 logits_ref: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, R]`` per-token KL(policy || reference) on samples from the policy; 0 where
    ``mask`` is False. ``k1 = logp - logp_ref``; ``k3`` the unbiased non-negative form;
    ``full`` the exact KL over the vocabulary at each position."""
    if estimator == "full":
        kl = full_kl(logits, logits_ref, mask=mask)
    else:  # padded positions may hold anything: they are replaced before the estimator runs
        zero = torch.zeros((), dtype=logp.dtype)
        kl = sampled_kl(torch.where(mask, logp, zero), torch.where(mask, logp_ref, zero),
                        estimator)
    return torch.where(mask, kl, torch.zeros((), dtype=kl.dtype))


def token_rewards(kl: torch.Tensor, score: torch.Tensor, mask: torch.Tensor, beta: float,
                  in_reward: bool) -> torch.Tensor:
    """``r_t = -beta KL_t`` at every response token (if ``in_reward``) plus the task score at
    the last real token; 0 at padding."""
    r = -beta * kl if in_reward else torch.zeros_like(kl)
    last = mask.long().sum(1) - 1
    r = r.clone()
    r[torch.arange(len(score)), last] += score
    return torch.where(mask, r, torch.zeros((), dtype=r.dtype))


def distinct_n(token_rows: list[list[int]], n: int = 2) -> float:
    """Distinct-n: unique n-grams / all n-grams over the responses (diversity; 1 = no repeats)."""
    grams, total = set(), 0
    for row in token_rows:
        for i in range(len(row) - n + 1):
            grams.add(tuple(row[i:i + n]))
            total += 1
    return len(grams) / total if total else 0.0


class _RLHF:
    def __init__(self, cfg: RLHFConfig, run_dir: Path, reward: RewardFn | None) -> None:
        self.cfg = validate_rlhf(cfg)
        self.run_dir = run_dir
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        lm, self.tok = load_lm(cfg.model)
        self.ref = frozen_reference(lm)
        self.policy = PolicyWithValue(lm)
        self.policy.train()
        self.reward = reward or make_reward(cfg.reward)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr, eps=1e-5)
        self.ctrl = make_controller(cfg.controller, beta=cfg.beta, target=cfg.target,
                                    beta_min=cfg.beta_min, beta_max=cfg.beta_max,
                                    **({"horizon": cfg.effective_horizon}
                                       if cfg.controller == "proportional" else {}))
        self.loss = PPOLoss("clip", eps=cfg.eps, vf_coef=cfg.vf_coef, value_clip=cfg.value_clip,
                            normalize_advantage="none")
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        from klppo.lm.corpus import split_corpus

        split = split_corpus()
        self.train_ids = encode(self.tok, split.train)
        self.held_ids = encode(self.tok, split.held_out)
        self.eos = self.tok.eos_token_id
        self.ppl_initial = perplexity(self.policy.lm, self.held_ids, cfg.eval_seq_len,
                                      cfg.eval_windows)

    def prompts(self) -> torch.Tensor:
        c = self.cfg
        starts = self.rng.integers(0, len(self.train_ids) - c.prompt_len, c.batch_size)
        return torch.from_numpy(np.stack([self.train_ids[s:s + c.prompt_len] for s in starts]))

    def iterate(self, it: int) -> dict[str, Any]:
        c = self.cfg
        beta = self.ctrl.value
        t0 = time.perf_counter()
        prompts = self.prompts()
        self.policy.eval()
        responses, _ = generate(self.policy.lm, prompts, c.response_len, self.gen,
                                c.temperature)
        t1 = time.perf_counter()
        mask = response_mask(responses, self.eos, c.stop_at_eos)
        s = score_sequences(self.policy, self.ref, prompts, responses)
        texts_p = self.tok.batch_decode(prompts)
        texts_r = self.tok.batch_decode(responses)
        score = torch.tensor(checked(self.reward, texts_p, texts_r), dtype=torch.float32)
        kl = per_token_kl(c.kl_estimator, s["logp"], s["logp_ref"], mask, s["logits"],
                          s["logits_ref"])
        k1 = per_token_kl("k1", s["logp"], s["logp_ref"], mask)
        k3 = per_token_kl("k3", s["logp"], s["logp_ref"], mask)
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
        t2 = time.perf_counter()
        stats = self.update(prompts, responses, mask, s, adv, ret, beta)
        t3 = time.perf_counter()
        unit = per_sequence_sum if c.kl_unit == "per_sequence_sum" else None
        measured = float(unit(kl, mask).mean()) if unit else float(per_token_mean(kl, mask))
        self.ctrl.update(measured, n_steps=c.batch_size)
        info = self.ctrl.info
        n_tok = int(mask.sum())
        seq_k1 = per_sequence_sum(k1, mask)
        m = {
            "iteration": it, "global_step": it * c.batch_size, "episodes": it * c.batch_size,
            "score": float(score.mean()), "kl": measured, "kl_unit": c.kl_unit,
            "kl_estimator": c.kl_estimator,
            "kl_k1_per_sequence_sum": float(seq_k1.mean()),
            "kl_k3_per_sequence_sum": float(per_sequence_sum(k3, mask).mean()),
            "kl_k1_per_token_mean": float(per_token_mean(k1, mask)),
            "kl_k3_per_token_mean": float(per_token_mean(k3, mask)),
            "kl_target": c.target, "kl_abs_error": abs(measured - c.target),
            "beta": beta, "beta_after": info.beta_after,
            "kl_relative_error": info.relative_error,
            "kl_error_clipped": float(info.error_clipped),
            "score_minus_beta_kl": float((score - beta * per_sequence_sum(kl, mask)).mean()),
            "distinct_2": distinct_n(responses.tolist(), 2),
            "tokens_per_second_generation": n_tok / max(t1 - t0, 1e-9),
            "tokens_per_second_scoring": n_tok / max(t2 - t1, 1e-9),
            "tokens_per_second_training": n_tok * c.ppo_epochs / max(t3 - t2, 1e-9),
            **stats,
        }
        if it % c.eval_every == 0 or it == 1 or it == c.iterations:
            m["held_out_perplexity"] = perplexity(self.policy.lm, self.held_ids, c.eval_seq_len,
                                                  c.eval_windows)
            m["held_out_perplexity_initial"] = self.ppl_initial  # before any update
            m["samples"] = [{"prompt": p, "response": r, "score": float(x)}
                            for p, r, x in list(zip(texts_p, texts_r, score.tolist()))[:4]]
        return m

    def update(self, prompts, responses, mask, s, adv, ret, beta) -> dict[str, float]:
        c = self.cfg
        self.policy.train()
        logp_old, v_old, logp_ref = s["logp"].detach(), s["values"].detach(), s["logp_ref"]
        sums: dict[str, float] = {}
        n = 0
        for _ in range(c.ppo_epochs):
            perm = torch.randperm(c.batch_size, generator=self.gen)
            for i in range(0, c.batch_size, c.minibatch_size):
                idx = perm[i:i + c.minibatch_size]
                cur = score_sequences(self.policy, None, prompts[idx], responses[idx], grad=True)
                mk = mask[idx]
                out = self.loss(cur["logp"][mk], logp_old[idx][mk], adv[idx][mk],
                                cur["values"][mk], ret[idx][mk], v_old[idx][mk])
                loss = out["loss"]
                if c.kl_placement == "loss":  # GRPO: beta * k3(policy || reference) per token
                    kl_loss = sampled_kl(cur["logp"][mk], logp_ref[idx][mk], "k3").mean()
                    loss = loss + beta * kl_loss
                    out["kl_loss_k3"] = kl_loss.detach()
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.max_grad_norm)
                self.opt.step()
                for k in ("loss", "loss_objective", "loss_critic", "clip_fraction", "kl_k3",
                          "frac_kill", "kl_loss_k3"):
                    if k in out:
                        sums[k] = sums.get(k, 0.0) + float(out[k].detach())
                n += 1
        renamed = {"kl_k3": "kl_old_new_k3"}
        return {renamed.get(k, k): v / n for k, v in sums.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "opt": self.opt.state_dict(),
                "ctrl": self.ctrl.state_dict(), "gen": self.gen.get_state(),
                "rng": self.rng.bit_generator.state}


def rlhf(cfg: RLHFConfig, reward: RewardFn | None = None,
         on_iteration: Callable[[dict[str, Any]], None] | None = None) -> RLHFResult:
    """Run the experiment into a new run directory; return its per-iteration metrics."""
    validate_rlhf(cfg)
    out = cfg.out or str(Path("runs/rlhf") / R.default_run_name(
        "lm", f"{cfg.controller}-beta{cfg.beta:g}", cfg.seed))
    run_dir = R.create_run_dir(out)
    R.write_yaml(run_dir / "config.yaml", {"kind": "rlhf", **dataclasses.asdict(cfg)})
    R.write_metadata(run_dir, {"kind": "rlhf"})
    sink = M.JsonlSink(run_dir / "metrics.jsonl")
    R.write_status(run_dir, "running")
    try:
        exp = _RLHF(cfg, run_dir, reward)
        for it in range(1, cfg.iterations + 1):
            m = exp.iterate(it)
            sink.write(it, m)
            if on_iteration is not None:
                on_iteration(m)
            if it % cfg.checkpoint_every == 0 or it == cfg.iterations:
                from klppo.rl.checkpoint import save_checkpoint

                save_checkpoint(run_dir, {"iteration": it, **exp.state_dict()})
                exp.policy.lm.save_pretrained(run_dir / "policy")
    except BaseException as e:
        R.write_status(run_dir, "failed", error=repr(e), traceback=traceback.format_exc())
        raise
    finally:
        sink.close()
    R.write_status(run_dir, "finished", iteration=cfg.iterations)
    records, _ = M.read_metrics(run_dir / "metrics.jsonl")
    return RLHFResult(run_dir, records)
