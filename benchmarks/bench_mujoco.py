"""MuJoCo speed: klppo vs SB3 PPO (matched settings) and vs the raw stepping rate.

Usage: python benchmarks/bench_mujoco.py [--tasks Hopper-v5 Humanoid-v5] [--steps 32768]
       [--repeats 1] [--no-sb3]

Per task, one thread per process, run one after another (never side by side on two cores):

* **raw**: the bare MuJoCo env (``env.unwrapped``) stepped with uniform random actions, resetting
  on termination: the physics rate, the ceiling of any trainer;
* **raw (gym)**: the issue's raw rate: ``gym.make(task)`` (its standard wrappers) stepped with
  ``env.action_space.sample()``, resetting on termination or truncation;
* **klppo**: ``klppo train --preset klip/<task>`` (1 env x 2048 steps, 10 epochs of minibatch
  64, observation and reward normalisation) as a whole process, imports included; and, from its
  metrics, the **collection rate** (steps / ``time_collect``) and the in-loop rate;
* **sb3**: Stable-Baselines3 PPO with the same settings (VecNormalize for obs and reward, 2x64
  tanh actor and critic, lr 3e-4 annealed, clip 0.2, value clip 0.2, GAE 0.99/0.95), as a whole
  process (``pip install 'klppo[bench]'``).

Prints the rates and the ratios the targets are stated in: klppo / sb3, collection / raw, and
the whole run's time over its physics time (steps / raw rate).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from _proc import run

RAW = """
import time, numpy as np, gymnasium as gym
env = gym.make({task!r}).unwrapped
env.reset(seed=0)
low, high = env.action_space.low, env.action_space.high
rng = np.random.default_rng(0)
acts = rng.uniform(low, high, size=(4096, len(low))).astype(np.float32)
n = {n}
t = time.perf_counter()
for i in range(n):
    _, _, term, _, _ = env.step(acts[i % 4096])
    if term:
        env.reset()
print("RESULT", n / (time.perf_counter() - t))
"""

RAW_GYM = """
import time, gymnasium as gym
env = gym.make({task!r})
env.reset(seed=0)
env.action_space.seed(0)
n = {n}
t = time.perf_counter()
for i in range(n):
    _, _, term, trunc, _ = env.step(env.action_space.sample())
    if term or trunc:
        env.reset()
print("RESULT", n / (time.perf_counter() - t))
"""

KLPPO = """
import torch; torch.set_num_threads(1)
import json, dataclasses, klppo.rl as rl
c = dataclasses.replace(rl.preset({preset!r}), total_steps={steps}, tensorboard=False,
                        out={out!r})
r = rl.train(c)
collect = sum(m["time_collect"] for m in r.metrics)
update = sum(m["time_update"] for m in r.metrics)
print("RESULT", r.metrics[-1]["global_step"], collect, update)
"""

SB3 = """
import torch; torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
env = VecNormalize(make_vec_env({task!r}, n_envs=1, seed=0), norm_obs=True, norm_reward=True,
                   clip_obs=10.0, clip_reward=10.0, gamma=0.99)
model = PPO("MlpPolicy", env, n_steps=2048, batch_size=64, n_epochs=10,
            learning_rate=lambda f: 3e-4 * f, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
            clip_range_vf=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
            policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]),
                               activation_fn=torch.nn.Tanh, log_std_init=0.0),
            seed=0, device="cpu", verbose=0)
model.learn(total_timesteps={steps})
print("RESULT", model.num_timesteps)
"""


def bench_task(task: str, steps: int, sb3: bool) -> dict:
    preset = "klip/" + task.split("-")[0].lower()
    _, (raw,) = run(RAW.format(task=task, n=20_000))
    raw = float(raw)
    _, (raw_gym,) = run(RAW_GYM.format(task=task, n=20_000))
    raw_gym = float(raw_gym)
    with tempfile.TemporaryDirectory() as d:
        wall, (done, collect, update) = run(KLPPO.format(preset=preset, steps=steps,
                                                         out=os.path.join(d, "run")))
    done, collect, update = int(done), float(collect), float(update)
    r = {"task": task, "steps": done, "raw": raw, "raw_gym": raw_gym, "klppo_wall": wall,
         "klppo": done / wall,
         "collection": done / collect, "in_loop": done / (collect + update),
         "update_s_per_2048": update / (done / 2048)}
    if sb3:
        sb3_wall, (sb3_steps,) = run(SB3.format(task=task, steps=steps))
        r.update(sb3_wall=sb3_wall, sb3=int(sb3_steps) / sb3_wall)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["Hopper-v5", "Humanoid-v5"])
    ap.add_argument("--steps", type=int, default=32_768, help="steps per training run")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-sb3", action="store_true", help="skip Stable-Baselines3")
    args = ap.parse_args()
    for _ in range(args.repeats):
        for task in args.tasks:
            r = bench_task(task, args.steps, not args.no_sb3)
            line = (f"{task:<14} raw {r['raw']:>6,.0f}/s (gym {r['raw_gym']:,.0f}/s)  klppo "
                    f"{r['klppo']:>6,.0f}/s (whole process; in loop {r['in_loop']:,.0f}/s, "
                    f"collection {r['collection']:,.0f}/s = {r['collection'] / r['raw']:.0%} of "
                    f"raw, {r['collection'] / r['raw_gym']:.0%} of gym; update "
                    f"{r['update_s_per_2048']:.3f} s per 2048 steps)  run / physics time "
                    f"{r['raw'] / r['klppo']:.2f}x (gym {r['raw_gym'] / r['klppo']:.2f}x)")
            if "sb3" in r:
                line += f"  sb3 {r['sb3']:,.0f}/s  klppo/sb3 {r['klppo'] / r['sb3']:.2f}x"
            print(line, flush=True)
            print("JSON", json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
