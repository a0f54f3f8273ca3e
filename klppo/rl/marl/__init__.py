"""Multi-agent PPO on PettingZoo's parallel API: one learner (objective, controller, target) per
policy over one env loop (``env: pettingzoo:MODULE``; see :mod:`klppo.rl.marl.spec`)."""
