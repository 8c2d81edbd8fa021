"""The prefix-probe scenario: the side channel through cached_tokens, end to end."""

from __future__ import annotations

import random
import string

import pytest

from minikv.model.checkpoint import load_model
from minikv.attacks.cached_tokens import page_guesses, recover_secret
from minikv.attacks.scenarios import run_scenario
from minikv.disagg.switches import SafetySwitches

MODEL, TOK = load_model(device="cpu")
VULNERABLE = SafetySwitches.preset("vulnerable")


@pytest.mark.parametrize("seed", range(4))
def test_vulnerable_preset_recovers_random_secrets_exactly(seed):
    """Random letters and digits: the attacker's probes give back exactly the victim's secret."""
    rng = random.Random(seed)
    secret = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(rng.randint(1, 8)))
    result = run_scenario("prefix-probe", MODEL, TOK, VULNERABLE, secret=secret, seed=seed)
    assert result.recovered == secret
    assert result.cross_tenant_reads == 0 and result.cross_tenant_cache_hits > 0


def test_safe_preset_recovers_nothing_and_sees_no_cross_tenant_hit():
    """Safe preset: cache_salt keeps alice's pages out of mallory's reach."""
    result = run_scenario("prefix-probe", MODEL, TOK, SafetySwitches.preset("safe"), secret="Zq7")
    assert result.recovered == "" and result.cross_tenant_cache_hits == 0
    assert result.victim.text == "saved key Zq7."  # alice herself is served as always


def test_cache_salt_alone_closes_the_probe():
    """Only the salt matters here: the vulnerable preset plus cache_salt recovers nothing."""
    result = run_scenario("prefix-probe", MODEL, TOK, VULNERABLE.with_switches(enable=["cache_salt"]), secret="Zq7")
    assert result.recovered == "" and result.cross_tenant_cache_hits == 0


def test_larger_pages_cost_whole_page_guesses():
    """At page size p a round guesses up to p characters at once; the attack still succeeds."""
    assert len(page_guesses(1, "01")) == 3  # '0', '1', '.'
    assert len(page_guesses(2, "01")) == 4 + 2 + 1  # two digits; one digit and '.'; '.\n'
    victim = "alice: save key 0110.\n"

    def oracle(prompts, hit_at):  # a perfect cache at page size 2 holding only the victim's prompt
        return [p[:hit_at] == victim[:hit_at] and len(p) > hit_at for p in prompts]

    assert recover_secret(oracle, page_size=2, alphabet="01") == ("0110", 3 * 7)


def test_shipped_model_answers_the_same_with_and_without_prefix_caching():
    """Shared system prompts, the shipped model: caching off, shared, and salted give the same replies."""
    from minikv.bench.prefix import MODES, serve, shared_prefix_workload

    workload = shared_prefix_workload(6, seed=1, system_chars=300)
    runs = {mode: serve(MODEL, TOK, workload, mode) for mode in MODES}
    assert runs["shared"].texts == runs["cache_salt"].texts == runs["off"].texts
    assert runs["shared"].cached_tokens >= runs["cache_salt"].cached_tokens > 0 == runs["off"].cached_tokens
