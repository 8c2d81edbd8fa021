"""The prefix probe with a stopwatch only: a PIN from times to first token, and cache_salt's answer."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from minikv.model.checkpoint import load_model
from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.attacks.cached_tokens import recover_secret
from minikv.attacks.scenarios import run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.attacks.timing import (
    DIGITS,
    fastest_if_significant,
    rank_sum_p_value,
    ranks_within_cycles,
    timing_attack,
)
from minikv.engine.engine import Engine

MODEL, TOK = load_model(device="cpu")
POOL = 1024  # 1-token pages: the smallest pool that holds the 1,024-token window, so flushes stay cheap
FLUSH = POOL + POOL // 10  # the attacker's filler: more tokens than the pool holds
BUSY = {"max_cycles": 40}  # a longer horizon than the default 24: other jobs share this machine's 2 cores


def synthetic_times(seed: int, guesses: int, cycles: int, faster: int | None, shift: float) -> list[list[float]]:
    """Burst times (s) of a busy machine: per-cycle load, jitter, a few 10x outliers; `faster` saves `shift`."""
    rng = random.Random(seed)
    times: list[list[float]] = [[] for _ in range(guesses)]
    for _ in range(cycles):
        load = rng.uniform(1.0, 2.0)  # the whole cycle runs slower or faster
        for g in range(guesses):
            t = 0.023 * load * rng.lognormvariate(0, 0.05) * (1 - shift if g == faster else 1)
            times[g].append(t * 10 if rng.random() < 0.03 else t)
    return times


@pytest.mark.parametrize("cycles, guesses", [(1, 5), (3, 4), (4, 3), (6, 2)])
def test_rank_sum_p_value_agrees_with_counting_every_ranking(cycles, guesses):
    """The convolution gives the same null probabilities as enumerating all guesses**cycles rankings."""
    sums = [sum(ranks) for ranks in itertools.product(range(1, guesses + 1), repeat=cycles)]
    for s in range(cycles, cycles * guesses + 1):
        assert rank_sum_p_value(s, cycles, guesses) == pytest.approx(sum(x <= s for x in sums) / len(sums))


def test_ranks_within_cycles_put_the_fastest_burst_first():
    """Each cycle is ranked on its own: a slow cycle changes nothing."""
    assert ranks_within_cycles([[1.0, 50.0], [2.0, 40.0], [3.0, 60.0]]) == [[1, 2], [2, 1], [3, 3]]


@pytest.mark.parametrize("seed", range(5))
def test_decision_rule_finds_the_guess_that_is_faster(seed):
    """A guess 15% faster than the others, under load and outliers, is found in 12 cycles."""
    faster = seed % 11
    assert fastest_if_significant(synthetic_times(seed, 11, 12, faster, 0.15), alpha=0.001)[0] == faster


@pytest.mark.parametrize("seed", range(20))
def test_decision_rule_without_a_faster_guess_reports_no_hit(seed):
    """No guess faster than the others: no hit, rather than the luckiest guess."""
    assert fastest_if_significant(synthetic_times(seed, 11, 16, None, 0.0), alpha=0.001)[0] is None


def pin_engine(cache_salt: bool) -> Engine:
    """A single-node engine at 1-token pages (SGLang's default granularity)."""
    return Engine(MODEL, TOK, EngineConfig(page_size=1, num_pages=POOL, cache_salt=cache_salt, event_log=False))


def test_times_to_first_token_alone_give_back_a_random_pin():
    """No cache_salt: a random 3-digit PIN comes back exactly from the probes' ttft_s alone."""
    rng = random.Random(1)
    pin = "".join(rng.choice(DIGITS) for _ in range(3))
    out = timing_attack(pin_engine(cache_salt=False), pin, 1, FLUSH, DIGITS, random.Random(1), **BUSY)
    assert out.recovered == pin
    assert out.cycles >= 5 * (len(pin) + 1)  # every round took at least min_cycles samples per guess


def test_cache_salt_leaves_the_stopwatch_nothing():
    """cache_salt on: no guess is faster, the attack recovers nothing and no cache hit crosses tenants."""
    server = pin_engine(cache_salt=True)
    out = timing_attack(server, "482", 1, FLUSH, DIGITS, random.Random(0), max_cycles=8)
    assert out.recovered == "" and out.cycles == 8
    assert server.audit.cross_tenant_cache_hits == 0


def test_at_larger_pages_the_timing_oracle_times_whole_page_guesses():
    """2-token pages: a round guesses a whole page (two bits, one bit and '.', '.\\n') and still hits."""
    server = Engine(MODEL, TOK, EngineConfig(page_size=2, num_pages=POOL // 2, cache_salt=False, event_log=False))
    out = timing_attack(server, "10", 2, FLUSH, "01", random.Random(3), **BUSY)
    assert out.recovered == "10"


def test_the_disaggregated_pair_gives_a_pin_back_to_the_stopwatch():
    """Through the pair's front door (the demo's server): the PIN comes back, and no read crosses tenants."""
    config = ClusterConfig(page_size=1, prefill_pages=POOL, decode_pages=POOL, transfer_pages_per_tick=64)
    pair = Cluster(MODEL, TOK, config, SafetySwitches.preset("vulnerable"))
    out = timing_attack(pair, "9", 1, FLUSH, DIGITS, random.Random(2), **BUSY)
    assert out.recovered == "9" and pair.cross_tenant_reads == 0 and pair.cross_tenant_cache_hits > 0


def test_demo_json_names_the_oracle_and_the_time():
    """prefix-probe's JSON adds "oracle" and "seconds" (the attack's own time, within the call's) beside the rest."""
    start = time.perf_counter()
    data = run_scenario("prefix-probe", MODEL, TOK, SafetySwitches.preset("vulnerable"), secret="9",
                        alphabet="digits").to_json()
    wall_s = time.perf_counter() - start
    assert data["recovered"] == "9" and data["probes"] == 2 * 11 and data["oracle"] == "cached"
    assert 0 < data["seconds"] <= wall_s and "cycles" not in data


@pytest.mark.parametrize("args, message", [
    (["--scenario", "prefix-probe", "--alphabet", "digits", "--secret", "Zq7"], "outside the digits alphabet"),
    (["--scenario", "over-length", "--oracle", "timing"], "options of the prefix-probe scenario"),
])
def test_demo_rejects_an_oracle_or_alphabet_that_cannot_apply(capsys, args, message):
    """A secret outside --alphabet, or --oracle on another scenario: one `error:` line, exit 2."""
    from minikv.cli import main

    code = main(["demo", *args, "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_recover_secret_stops_when_the_oracle_reports_no_hit():
    """The oracle contract: no True answer ends the attack with what was recovered so far."""
    assert recover_secret(lambda prompts, hit_at: [False] * len(prompts), 1, alphabet=DIGITS) == ("", 11)
