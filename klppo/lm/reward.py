"""Rewards for the RLHF experiment: any ``(prompts, responses) -> scores`` function.

* :class:`VaderReward`: the VADER sentiment compound score in [-1, 1] of the continuation
  (``vaderSentiment``, MIT, offline): the offline stand-in for the IMDB sentiment classifier of
  Ziegler et al. and TRL.
* :class:`ClassifierReward`: a Hugging Face sequence-classification model from a local path
  (the logit, or the probability, of one label).
* any callable with the same signature, wrapped by :func:`checked`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path

from klppo.runs.install import install_hint

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
    return [_score(fn, i, s) for i, s in enumerate(scores)]


def _score(fn: RewardFn, i: int, s: object) -> float:
    """Score ``i`` as a float: a real number (numpy and torch scalars too), finite; never a
    string or a bool (``"1.0"`` is refused, not read as 1.0)."""
    if hasattr(s, "item") and getattr(s, "ndim", None) == 0:  # numpy / torch scalars
        s = s.item()
    who = getattr(fn, "__name__", type(fn).__name__)
    if isinstance(s, bool) or not isinstance(s, numbers.Real):
        raise ValueError(f"reward {who}: score {i} is {s!r} (a {type(s).__name__}), not a "
                         "number")
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"reward {who}: score {i} is not finite ({v})")
    return v


class VaderReward:
    """VADER compound sentiment of each response (the prompt is ignored)."""

    def __init__(self) -> None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError:
            raise ImportError(f"the VADER reward needs the lm extra: {install_hint('lm')}") \
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
        if self.tok.pad_token is None:  # GPT-2-like tokenizers: batches pad with EOS
            self.tok.pad_token = self.tok.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tok.pad_token_id
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
        return _classifier(name, path, int(rest[0]) if rest else 1)
    raise ConfigError(f"reward={name!r}: use 'vader' or 'classifier:PATH[:LABEL]'")


def _classifier(name: str, path: str, label: int) -> ClassifierReward:
    """The classifier of ``reward=name``, checked before any run: a sequence-classification
    model (not a causal LM) with the label, that scores a batch of two texts."""
    from transformers import AutoConfig

    from klppo.lm.config import ConfigError
    from klppo.lm.model import check_model_dir

    check_model_dir(path, f"reward={name!r}: model", kind="classifier")
    labels = AutoConfig.from_pretrained(path).num_labels
    if label >= labels:
        raise ConfigError(f"reward={name!r}: the classifier has {labels} labels; LABEL {label} "
                          "is none")
    try:
        reward = ClassifierReward(path, label)
        checked(reward, ["A probe", "A longer probe of"], ["text.", "two texts."])
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise ConfigError(f"reward={name!r}: the classifier cannot be loaded or run "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    return reward
