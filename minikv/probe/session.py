"""What every check shares: the client, the two keys, the window, and the endpoint's token scale."""

from __future__ import annotations

import random
from dataclasses import dataclass
from http import HTTPStatus

from minikv.probe.client import ProbeClient, mask
from minikv.probe.replies import CannotProbe, Observation
from minikv.probe.prompts import TokenScale, random_words

CALIBRATION_WORDS = (8, 40)
MARGIN_TOKENS = 16  # room for the token scale's rounding, past or below a window's edge


@dataclass
class ProbeSession:
    client: ProbeClient
    key_a: str
    key_b: str
    context: int  # the advertised window, in tokens
    scale: TokenScale
    rng: random.Random

    def words(self, words: int) -> str:
        return random_words(self.rng, words)

    def send(self, key: str, words: int, max_tokens: int) -> tuple[str, Observation]:
        """A fresh random prompt of `words` words; (its description, what came back)."""
        obs = self.client.complete(key, self.words(words), max_tokens)
        return self.describe(key, words, max_tokens), obs

    def describe(self, key: str, words: int, max_tokens: int) -> str:
        who = "key A" if key == self.key_a else "key B"
        return f"{who} ({mask(key)}): {self.scale.tokens(words):,}-token prompt, max_tokens {max_tokens}"


def calibrate(client: ProbeClient, key: str, rng: random.Random) -> TokenScale:
    """Two short prompts -> tokens per word; CannotProbe if the endpoint reports no prompt_tokens."""
    counts = []
    for words in CALIBRATION_WORDS:
        obs = client.complete(key, random_words(rng, words), 1)
        if obs.status != HTTPStatus.OK or obs.prompt_tokens is None:
            raise CannotProbe(f"a calibration prompt of {words} words got {obs.summary()}: the probe needs usage.prompt_tokens")
        counts.append(obs.prompt_tokens)
    if counts[1] <= counts[0]:
        raise CannotProbe(f"usage.prompt_tokens does not grow with the prompt ({counts[0]} for {CALIBRATION_WORDS[0]} words, "
                          f"{counts[1]} for {CALIBRATION_WORDS[1]})")
    return TokenScale.fit(CALIBRATION_WORDS, (counts[0], counts[1]))


def fastest_ms(values: list[float]) -> float:
    """The fastest of several timings: load on the machine only ever adds time, so the minimum is
    the steadiest estimate of what the request itself costs."""
    return 1e3 * min(values)
