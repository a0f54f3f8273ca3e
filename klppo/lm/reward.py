"""Rewards for the RLHF experiment: any ``(prompts, responses) -> scores`` function.

* :class:`VaderReward`: the VADER sentiment compound score in [-1, 1] of the continuation
  (``vaderSentiment``, MIT, offline): the offline stand-in for the IMDB sentiment classifier of
  Ziegler et al. and TRL.
* :class:`ClassifierReward`: a Hugging Face sequence-classification model from a local path
  (the logit, or the probability, of one label).
* any callable with the same signature, wrapped by :func:`checked`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["RewardFn", "VaderReward", "ClassifierReward", "checked", "make_reward"]

RewardFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


def checked(fn: RewardFn, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Call a reward function and check its contract: one finite score per response."""
    if len(prompts) != len(responses):
        raise ValueError(f"reward: {len(prompts)} prompts but {len(responses)} responses")
    scores = list(fn(prompts, responses))
    if len(scores) != len(responses):
        raise ValueError(f"reward: {len(responses)} responses but {len(scores)} scores; a reward "
                         f"function must return one score per response")
    out = []
    for i, s in enumerate(scores):
        v = float(s)
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"reward: score {i} is not finite ({v})")
        out.append(v)
    return out


class VaderReward:
    """VADER compound sentiment of each response (the prompt is ignored)."""

    def __init__(self) -> None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError:
            raise ImportError("the VADER reward needs the lm extra: pip install 'klppo[lm]'") \
                from None
        self._sia = SentimentIntensityAnalyzer()

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        return [self._sia.polarity_scores(r)["compound"] for r in responses]


class ClassifierReward:
    """Score of ``label`` from a local Hugging Face sequence-classification model.

    ``use_prompt`` scores prompt + response instead of the response alone; ``probability``
    returns the softmax probability of the label instead of its logit.
    """

    def __init__(self, path: str | Path, label: int = 1, use_prompt: bool = False,
                 probability: bool = False, batch_size: int = 32) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path).eval()
        self.label, self.use_prompt, self.probability = label, use_prompt, probability
        self.batch_size = batch_size

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        import torch

        texts = [p + r for p, r in zip(prompts, responses)] if self.use_prompt else list(
            responses)
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                               truncation=True)
                logits = self.model(**enc).logits
                vals = torch.softmax(logits, -1) if self.probability else logits
                out += vals[:, self.label].tolist()
        return out


def make_reward(name: str) -> RewardFn:
    """``vader``, or ``classifier:PATH[:LABEL]`` for a local HF classifier. A bad spec or a
    classifier that cannot be loaded raises ``ConfigError`` naming ``reward`` and the spec."""
    from klppo.lm.config import ConfigError

    if name == "vader":
        return VaderReward()
    if name.startswith("classifier:"):
        _, path, *rest = name.split(":")
        if len(rest) > 1 or (rest and not rest[0].isdigit()):
            raise ConfigError(f"reward={name!r}: use 'classifier:PATH[:LABEL]' with an integer "
                              f"LABEL")
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"reward={name!r}: {path!r} is not a Hugging Face model directory "
                              f"(no config.json)")
        label = int(rest[0]) if rest else 1
        try:
            reward = ClassifierReward(path, label)
        except Exception as e:  # noqa: BLE001 - transformers raises many kinds
            raise ConfigError(f"reward={name!r}: the classifier cannot be loaded "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        if label >= reward.model.config.num_labels:
            raise ConfigError(f"reward={name!r}: the classifier has "
                              f"{reward.model.config.num_labels} labels; LABEL {label} is none")
        return reward
    raise ConfigError(f"reward={name!r}: use 'vader' or 'classifier:PATH[:LABEL]'")
