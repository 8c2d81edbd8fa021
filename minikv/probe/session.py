"""The session every check shares: the client, the two keys, the window and the endpoint's token scale.
Prompts are random letters separated by spaces (Gu et al., ICML 2025): no two share a prefix by accident; two
calibration prompts measure tokens per word from `usage.prompt_tokens`, since the tokenizer is not visible."""

import math
import random
import statistics
import string
from dataclasses import dataclass
from http import HTTPStatus

from minikv.probe.client import ProbeClient, mask
from minikv.probe.replies import CannotProbe, Observation
from minikv.probe.report import Incomplete, ProbeOptions

CALIBRATION_WORDS = (8, 40)
MARGIN_TOKENS = 16  # room for the token scale's rounding, past or below a window's edge
MIN_CONTEXT = 64
MAX_CONTEXT = 1 << 20  # the probe writes prompts up to the window: about 2 MB of letters at this size
MAX_PROMPT_WORDS = 2 * MAX_CONTEXT  # a random letter and a space are at least half a token on any tokenizer


def random_words(rng: random.Random, words: int) -> str:
    """`words` random lowercase letters separated by spaces, ending in a newline."""
    return " ".join(rng.choice(string.ascii_lowercase) for _ in range(words)) + "\n"


@dataclass(frozen=True)
class TokenScale:
    """prompt_tokens = overhead + per_word x words, fitted on this endpoint."""

    overhead: float
    per_word: float

    @classmethod
    def fit(cls, words: tuple[int, int], tokens: tuple[int, int]) -> "TokenScale":
        per_word = (tokens[1] - tokens[0]) / (words[1] - words[0])
        return cls(tokens[0] - per_word * words[0], per_word)

    def tokens(self, words: int) -> int:
        return round(self.overhead + self.per_word * words)

    def words_for(self, tokens: int) -> int:
        """The most words whose prompt stays within `tokens` (at least 1)."""
        return max(1, math.floor((tokens - self.overhead) / self.per_word))

    def words_over(self, tokens: int) -> int:
        """The fewest words whose prompt is longer than `tokens`."""
        return max(1, math.floor((tokens - self.overhead) / self.per_word) + 1)


@dataclass
class ProbeSession:
    """What every check is given: the client, both keys, the window, the token scale, a seeded rng."""

    client: ProbeClient
    key_a: str
    key_b: str
    context: int  # the advertised window, in tokens
    scale: TokenScale
    rng: random.Random

    def words(self, words: int) -> str:
        return random_words(self.rng, words)

    def send(self, key: str, words: int, max_tokens: int) -> tuple[str, Observation]:
        """A fresh random prompt of `words` words; (what was sent, for the report; what came back)."""
        who = "key A" if key == self.key_a else "key B"
        sent = f"{who} ({mask(key)}): {self.scale.tokens(words):,}-token prompt, max_tokens {max_tokens}"
        return sent, self.client.complete(key, self.words(words), max_tokens)


def served(obs: Observation) -> Observation:
    """`obs` if it was answered 200; else Incomplete: a check cannot measure what was not served."""
    if obs.status != HTTPStatus.OK:
        raise Incomplete(f"a request of the check was not served ({obs.summary()})")
    return obs


def fastest_ms(values: list[float]) -> float:
    """The fastest of several timings: load only ever adds time, so the minimum is the steadiest estimate."""
    return 1e3 * min(values)


def median_ms(values: list[float]) -> str:
    return f"median {1e3 * statistics.median(values):.1f} ms (n={len(values)})" if values else "none measured"


def open_session(client: ProbeClient, key_a: str, key_b: str, options: ProbeOptions) -> ProbeSession:
    """Both keys accepted, the model and its window known, the token scale measured; else CannotProbe."""
    listed = client.models(key_a)
    client.models(key_b)
    client.model, context = model_and_window(listed, options)
    if not options.model:
        client.met(f"no --model given: the model id {client.model!r} was taken from /v1/models")
    source = f"--context {context}" if options.context is not None else f"max_model_len {context:,}"
    if context < MIN_CONTEXT:
        raise CannotProbe(f"{source} is below the {MIN_CONTEXT} tokens the probe needs to fit its prompts")
    if context > MAX_CONTEXT:
        raise CannotProbe(f"{source} is more than the probe can fill: it writes prompts up to {MAX_CONTEXT:,} tokens")
    rng = random.Random(options.seed)
    scale = calibrate(client, key_a, rng)
    if scale.words_over(context + MARGIN_TOKENS) > MAX_PROMPT_WORDS:
        raise CannotProbe(f"usage.prompt_tokens grows by {scale.per_word:.3g} per word: filling the {context:,}-token "
                          f"window would take more than {MAX_PROMPT_WORDS:,} words")
    return ProbeSession(client, key_a, key_b, context, scale, rng)


def model_and_window(listed: list[dict], options: ProbeOptions) -> tuple[str, int]:
    """--model (else the first model /v1/models lists) and --context (else its card's max_model_len, or
    context_length); CannotProbe if either cannot be known."""
    model, card = options.model, next((m for m in listed if m.get("id") == options.model), None)
    if not model:
        if not listed:
            raise CannotProbe("/v1/models lists no model; pass --model")
        model, card = listed[0].get("id"), listed[0]
        if not isinstance(model, str) or not model:
            raise CannotProbe(f"the first model /v1/models lists has no id string (id {model!r}); pass --model")
    if options.context is not None:
        return model, options.context
    if card is None:
        raise CannotProbe(f"/v1/models does not list {model!r}, so its context window is unknown; pass --context N")
    value = card.get("max_model_len", card.get("context_length"))
    if value is None:
        raise CannotProbe(f"the endpoint does not advertise the context window of {model!r} (no max_model_len "
                          "in /v1/models); pass --context N")
    if type(value) is not int:
        raise CannotProbe(f"/v1/models gives max_model_len {value!r} for {model!r}, not a token count; "
                          "pass --context N")
    return model, value


def calibrate(client: ProbeClient, key: str, rng: random.Random) -> TokenScale:
    """Two short prompts -> tokens per word; CannotProbe if the endpoint reports no prompt_tokens."""
    counts = []
    for words in CALIBRATION_WORDS:
        obs = client.complete(key, random_words(rng, words), 1)
        if obs.status != HTTPStatus.OK or obs.prompt_tokens is None:
            raise CannotProbe(f"a calibration prompt of {words} words got {obs.summary()}: "
                              "the probe needs usage.prompt_tokens")
        counts.append(obs.prompt_tokens)
    if counts[1] <= counts[0]:
        raise CannotProbe(f"usage.prompt_tokens does not grow with the prompt ({counts[0]} for "
                          f"{CALIBRATION_WORDS[0]} words, {counts[1]} for {CALIBRATION_WORDS[1]})")
    return TokenScale.fit(CALIBRATION_WORDS, (counts[0], counts[1]))
