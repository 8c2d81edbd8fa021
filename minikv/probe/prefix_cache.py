"""Shared prefix cache: can key B tell that key A sent a prompt? (Gu et al., ICML 2025)

The audit of "Auditing Prompt Caching in Language Model APIs": in each round key A sends a
random prompt (priming the cache if there is one), then key B sends the same prompt and times
its first token (the hit procedure), and key B sends a fresh random prompt of the same length
(the miss procedure). A two-sample Kolmogorov-Smirnov test compares the two sets of times; a
small p-value with faster "hits" means B's requests read A's cached prefix: the cache is shared
across keys, a side channel that reveals what other tenants send. A `cached_tokens` above zero
on B's request for A's prompt says the same without any timing. Key A's own repeat (A sends the
prompt twice) is the positive control: it shows whether the endpoint caches at all.
"""

from __future__ import annotations

import statistics
from http import HTTPStatus

from scipy.stats import ks_2samp

from minikv.probe.replies import Observation
from minikv.probe.report import FAIL, INCOMPLETE, PASS, CheckResult
from minikv.probe.session import ProbeSession

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
        result.decide(INCOMPLETE, f"the budget leaves {budget_rounds} rounds; the test needs at least {MIN_ROUNDS}")
        return
    words = s.scale.words_for(min(MAX_PREFIX_TOKENS, int(s.context * PREFIX_FRACTION)))
    samples: dict[str, list[float]] = {"own": [], "hit": [], "miss": []}
    cached: dict[str, list[int]] = {"own": [], "hit": [], "miss": []}
    for i in range(rounds):
        prompt = s.words(words)
        steps = [("prime", s.key_a, prompt), ("own", s.key_a, prompt)]
        cross = [("hit", s.key_b, prompt), ("miss", s.key_b, s.words(words))]
        steps += cross if s.rng.random() < 0.5 else cross[::-1]  # the order varies, as in the audit
        for label, key, text in steps:
            obs = s.client.complete(key, text, MAX_TOKENS)
            if obs.status != HTTPStatus.OK:
                result.note(f"round {i + 1}, {label}", obs.summary())
                result.decide(INCOMPLETE, f"a {s.scale.tokens(words):,}-token prompt was not served ({obs.status}): no audit")
                return
            if label != "prime":
                _record(samples, cached, label, obs)
    hit, miss, own = samples["hit"], samples["miss"], samples["own"]
    test = ks_2samp(hit, miss)
    own_test = ks_2samp(own, miss)
    tokens = s.scale.tokens(words)
    result.note(f"{rounds} rounds of {tokens:,}-token random prompts: key A primes; key B sends the same prompt (hit) "
                "and a fresh one (miss); key A repeats its own (control)",
                f"median TTFT hit {_ms(hit)}, miss {_ms(miss)}, A's repeat {_ms(own)}; KS p={test.pvalue:.2g} (hit vs miss), "
                f"p={own_test.pvalue:.2g} (A's repeat vs miss)")
    result.note("usage.prompt_tokens_details.cached_tokens",
                f"hit: max {max(cached['hit'], default=0)}, miss: max {max(cached['miss'], default=0)}, "
                f"A's repeat: max {max(cached['own'], default=0)}" if any(cached.values()) else "not reported")
    timing_shared = test.pvalue < ALPHA and statistics.median(hit) < statistics.median(miss)
    counted_shared = max(cached["hit"], default=0) > 0
    own_timed = own_test.pvalue < ALPHA and statistics.median(own) < statistics.median(miss)
    own_counted = max(cached["own"], default=0) > 0
    if timing_shared or counted_shared:
        oracle = _oracle(counted_shared, timing_shared)
        verdict, reason = FAIL, "key B's requests hit the cache key A filled: the prefix cache is shared across keys"
    elif own_timed or own_counted:
        oracle = _oracle(own_counted, own_timed)
        verdict, reason = PASS, "the endpoint caches prefixes, but per key: key B never hit key A's prompts"
    else:
        oracle = _oracle(bool(cached["own"]), True)
        verdict, reason = PASS, "no prefix caching seen at all, so nothing to share"
    result.figures.update(oracle=oracle, first_token_s=samples, cached_tokens=cached)
    result.decide(verdict, f"{reason} (decided by {oracle})")


def _oracle(counted: bool, timed: bool) -> str:
    """Which of the two signals showed what the verdict says."""
    return " and ".join(name for name, on in (("cached_tokens", counted), ("time to first token (KS test)", timed)) if on)


def _record(samples: dict[str, list[float]], cached: dict[str, list[int]], label: str, obs: Observation) -> None:
    samples[label].append(obs.first_token_s)
    if obs.cached_tokens is not None:
        cached[label].append(obs.cached_tokens)


def _ms(values: list[float]) -> str:
    return f"{1e3 * statistics.median(values):.1f} ms"
