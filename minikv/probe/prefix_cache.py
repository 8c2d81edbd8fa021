"""Shared prefix cache: can key B tell that key A sent a prompt? (Gu et al., ICML 2025; docs/serve.md)
Each round key A sends a prompt twice (the second, a control: caching at all), key B the same (hit) and a
fresh one (miss); B's hits faster (a Kolmogorov-Smirnov test) or with `cached_tokens` mean a shared cache."""

import statistics

from scipy.stats import ks_2samp

from minikv.probe.report import FAIL, PASS, CheckResult, Incomplete
from minikv.probe.session import ProbeSession, median_ms, served

ALPHA = 0.01  # significance of the KS test
MAX_TOKENS = 1
PREFIX_FRACTION = 1 / 2  # of the window: long enough that skipping its prefill shows
MAX_PREFIX_TOKENS = 2048
REQUESTS_PER_ROUND = 4  # A primes, A repeats, B hits, B misses
MIN_ROUNDS = 5


def check_prefix_cache(s: ProbeSession, result: CheckResult, rounds: int) -> None:
    budget_rounds = (s.client.budget - s.client.sent) // REQUESTS_PER_ROUND
    rounds = min(rounds, budget_rounds)
    if rounds < MIN_ROUNDS:
        raise Incomplete(f"the budget leaves {budget_rounds} rounds; the test needs at least {MIN_ROUNDS}")
    words = s.scale.words_for(min(MAX_PREFIX_TOKENS, int(s.context * PREFIX_FRACTION)))
    ttft: dict[str, list[float]] = {"own": [], "hit": [], "miss": []}
    cached: dict[str, list[int]] = {"own": [], "hit": [], "miss": []}
    for _ in range(rounds):
        prompt = s.words(words)
        served(s.client.complete(s.key_a, prompt, MAX_TOKENS))  # key A primes the cache: not measured
        steps = [("own", s.key_a, prompt)]
        cross = [("hit", s.key_b, prompt), ("miss", s.key_b, s.words(words))]
        steps += cross if s.rng.random() < 0.5 else cross[::-1]  # the order varies, as in the audit
        for label, key, text in steps:
            obs = served(s.client.complete(key, text, MAX_TOKENS))
            ttft[label].append(obs.first_token_s)
            if obs.cached_tokens is not None:
                cached[label].append(obs.cached_tokens)
    tests = {label: ks_2samp(ttft[label], ttft["miss"]) for label in ("hit", "own")}
    result.note(f"{rounds} rounds of {s.scale.tokens(words):,}-token random prompts: key A primes; key B sends the "
                "same prompt (hit) and a fresh one (miss); key A repeats its own (control)",
                f"TTFT hit {median_ms(ttft['hit'])}, miss {median_ms(ttft['miss'])}, "
                f"A's repeat {median_ms(ttft['own'])}; KS p={tests['hit'].pvalue:.2g} (hit vs miss), "
                f"p={tests['own'].pvalue:.2g} (A's repeat vs miss)")
    result.note("usage.prompt_tokens_details.cached_tokens",
                f"hit: max {max(cached['hit'], default=0)}, miss: max {max(cached['miss'], default=0)}, "
                f"A's repeat: max {max(cached['own'], default=0)}" if any(cached.values()) else "not reported")
    timed = {label: tests[label].pvalue < ALPHA and statistics.median(ttft[label]) < statistics.median(ttft["miss"])
             for label in tests}
    counted = {label: max(cached[label], default=0) > 0 for label in tests}
    if timed["hit"] or counted["hit"]:
        oracle = _oracle(counted["hit"], timed["hit"])
        verdict, reason = FAIL, "key B's requests hit the cache key A filled: the prefix cache is shared across keys"
    elif timed["own"] or counted["own"]:
        oracle = _oracle(counted["own"], timed["own"])
        verdict, reason = PASS, "the endpoint caches prefixes, but per key: key B never hit key A's prompts"
    else:
        oracle = _oracle(bool(cached["own"]), True)
        verdict, reason = PASS, "no prefix caching seen at all, so nothing to share"
    result.figures.update(oracle=oracle, first_token_s=ttft, cached_tokens=cached)
    result.decide(verdict, f"{reason} (decided by {oracle})")


def _oracle(counted: bool, timed: bool) -> str:
    """Which of the two signals showed what the verdict says."""
    signals = (("cached_tokens", counted), ("time to first token (KS test)", timed))
    return " and ".join(name for name, on in signals if on)
