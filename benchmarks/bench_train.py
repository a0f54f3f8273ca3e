"""klppo vs Stable-Baselines3 PPO on CartPole-v1: whole-process steps per second.

Usage: python benchmarks/bench_train.py [--setting preset|throughput|both] [--repeats 1]

Each run is a separate Python process with one torch thread (OMP/MKL threads 1), timed from
process start to exit (imports included), run one after another so they do not compete for the
two cores. Settings are matched: 2x64 tanh actor and critic, Adam lr 3e-4 annealed linearly,
eps 0.2, value clip 0.2, vf 0.5, no entropy, grad clip 0.5, GAE 0.99 / 0.95, advantage
normalisation. "preset" is klppo's klip/cartpole (4 envs x 128 steps, 10 epochs, minibatch 64,
100k steps); "throughput" is 64 envs x 128 steps, 4 epochs, 4 minibatches (of 2048), 524,288
steps. Also prints the raw stepping rate of the vector env, the ceiling for any trainer.
Needs the bench extra: pip install 'klppo[bench]'.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from _proc import run

SETTINGS = {
    "preset": dict(envs=4, steps=128, epochs=10, minibatch=64, total=100_000),
    "throughput": dict(envs=64, steps=128, epochs=4, minibatch=2048, total=524_288),
}

KLPPO = """
import torch; torch.set_num_threads(1)
import klppo.rl as rl, dataclasses
c = rl.preset("klip/cartpole")
c = dataclasses.replace(c, out={out!r}, total_steps={total}, tensorboard=False,
    rollout=dataclasses.replace(c.rollout, num_envs={envs}, num_steps={steps}),
    ppo=dataclasses.replace(c.ppo, update_epochs={epochs}, minibatch_size={minibatch}))
r = rl.train(c)
print("RESULT", r.metrics[-1]["global_step"], r.final_return)
"""

SB3 = """
import torch; torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
env = make_vec_env("CartPole-v1", n_envs={envs}, seed=0)
model = PPO("MlpPolicy", env, n_steps={steps}, batch_size={minibatch}, n_epochs={epochs},
            learning_rate=lambda f: 3e-4 * f, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
            clip_range_vf=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
            policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]),
                               activation_fn=torch.nn.Tanh), seed=0, device="cpu", verbose=0)
model.learn(total_timesteps={total})
print("RESULT", model.num_timesteps, None)
"""

VEC = """
import numpy as np, time, gymnasium as gym
from klppo.rl.envs import make_vector_env
env = make_vector_env("CartPole-v1", {envs}, 0)
acts = np.zeros({envs}, dtype=np.int64)
n = max(2000, 400_000 // {envs})
t = time.perf_counter()
for i in range(n):
    env.step(acts ^ (i & 1))
print("RESULT", n * {envs} / (time.perf_counter() - t), None)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", choices=["preset", "throughput", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    names = list(SETTINGS) if args.setting == "both" else [args.setting]
    print(f"{'setting':<11} {'trainer':<8} {'steps':>8} {'wall s':>7} {'steps/s':>9} "
          f"{'final return':>12}")
    for name in names:
        s = SETTINGS[name]
        rates = {}
        for _ in range(args.repeats):
            for trainer, code in (("klppo", KLPPO), ("sb3", SB3)):
                with tempfile.TemporaryDirectory() as d:
                    wall, (steps, ret) = run(code.format(out=os.path.join(d, "run"), **s))
                rate = int(steps) / wall
                rates.setdefault(trainer, []).append(rate)
                print(f"{name:<11} {trainer:<8} {int(steps):>8} {wall:>7.1f} {rate:>9.0f} "
                      f"{ret:>12}", flush=True)
        _, (vec_rate, _) = run(VEC.format(**s))
        best = {k: max(v) for k, v in rates.items()}
        # each klppo run is paired with the SB3 run right after it: the pair shares the
        # machine's state, which drifts by +-20% here over minutes
        pairs = sorted(k / b for k, b in zip(rates["klppo"], rates["sb3"]))
        median = pairs[len(pairs) // 2] if len(pairs) % 2 else \
            (pairs[len(pairs) // 2 - 1] + pairs[len(pairs) // 2]) / 2
        print(f"{name:<11} ratio klppo/sb3: median of pairs {median:.2f}x "
              f"(pairs {', '.join(f'{r:.2f}' for r in pairs)}), best/best "
              f"{best['klppo'] / best['sb3']:.2f}x  "
              f"(vector env alone: {float(vec_rate):,.0f} steps/s)", flush=True)


if __name__ == "__main__":
    main()
