"""Notebook 13's audit: its model of what each switch does to the audit's requests holds on real mystery servers, and
its checkers accept verdicts that follow the evidence and reject constants, all-on, and guesses."""

from __future__ import annotations

import pytest

from minikv.exercises.nb13_audit import (EVERY_DRAW, SWITCHES, check_every_endpoint, check_predictions,
                                         score_verdicts, decided,
                                         eviction_sign, expected_evidence, explain, gather_evidence, never_acted)
from minikv.probe.run import probe_endpoint
from minikv.serve.launch import ServerThread
from minikv.serve.mystery import draw

KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-0002"}
KEY_ARGS = [a for tenant, key in KEYS.items() for a in ("--api-key", f"{tenant}={key}")]
# seeds whose evidence takes every value the model gives: a leak, 200s over pages nobody wrote, each refusal, shared
# and own caches, the eviction check failing and passing
SEEDS = [0, 1, 2, 4, 5, 6, 11, 12, 13, 36]
EVICTION_SEEDS = [15, 12, 5]


def test_the_seeds_cover_every_kind_of_evidence():
    """Each value expected_evidence gives for any draw is given by one of SEEDS (or EVICTION_SEEDS for eviction)."""
    every = {(k, v) for s in EVERY_DRAW for k, v in expected_evidence(s).items() if k != "eviction"}
    every.discard(("B 500", "not read"))  # a quota-cut prompt let through: seed 13 below
    covered = {(k, v) for seed in SEEDS for k, v in expected_evidence(draw(seed)).items() if k != "eviction"}
    assert every - covered <= {("B 500", "200")} and ("B 500", "not read") in covered
    assert {expected_evidence(draw(s))["eviction"] for s in EVICTION_SEEDS} == {"shared", "no sign"}


@pytest.fixture(scope="module")
def observed(tiny):
    """The audit's requests on a fresh mystery server for each seed (the probe's eviction check on some)."""
    model, tok = tiny
    seen = {}
    for seed in sorted(set(SEEDS + EVICTION_SEEDS)):
        with ServerThread(["--mystery", str(seed), *KEY_ARGS], model, tok) as server:
            evidence, _ = gather_evidence(server.base_url, KEYS["alice"], KEYS["bob"], "tiny-llama")
            if seed in EVICTION_SEEDS:
                report = probe_endpoint(server.url, KEYS["alice"], KEYS["bob"], seed=0, checks=("eviction",))
                evidence["eviction"] = eviction_sign(report)
        seen[seed] = evidence
    return seen


@pytest.mark.parametrize("seed", sorted(set(SEEDS + EVICTION_SEEDS)))
def test_real_servers_give_the_expected_evidence(observed, seed):
    """What a fresh server answers is what expected_evidence says its drawn switches give."""
    want = expected_evidence(draw(seed))
    assert observed[seed] == {k: want[k] for k in observed[seed]}


def test_each_switch_is_decided_somewhere_but_deferred_release():
    """transfer_batch_cap and scrub_on_free always show; deferred_release never; the rest on some draws."""
    share = {n: sum(decided(expected_evidence(s))[n] is not None for s in EVERY_DRAW) / len(EVERY_DRAW)
             for n in SWITCHES}
    assert share["transfer_batch_cap"] == share["scrub_on_free"] == 1 and share["deferred_release"] == 0
    assert all(0 < share[n] < 1 for n in SWITCHES if n not in ("transfer_batch_cap", "scrub_on_free",
                                                                 "deferred_release"))


def test_the_evidence_decides_only_what_every_matching_draw_agrees_on():
    """Where decided() gives a value, every draw with the same evidence has it; where None, draws differ."""
    for s in EVERY_DRAW[::7]:
        evidence, verdicts = expected_evidence(s), decided(expected_evidence(s))
        alike = [t for t in EVERY_DRAW if expected_evidence(t) == evidence]
        for n, v in verdicts.items():
            values = {getattr(t, n) for t in alike}
            assert values == {v} if v is not None else values == {True, False}


def test_verdicts_that_follow_the_evidence_pass(capsys):
    """decided(evidence) passes on every seed, and explains all nine switches."""
    for seed in range(8):
        score_verdicts(decided, seed, expected_evidence(draw(seed)))
    out = capsys.readouterr().out
    assert out.count("verdicts the evidence decides are right") == 8 and out.count("deferred_release") == 8


@pytest.mark.parametrize("seed", range(12))
def test_constant_and_all_on_verdicts_are_rejected(seed):
    """All on fails wherever a decided switch is off, all off wherever one is on, all None everywhere."""
    evidence = expected_evidence(draw(seed))
    decided_values = {on for _, on, decides, _ in explain(seed) if decides is not None}
    for constant in (True, False, None):
        verdicts = {n: constant for n in SWITCHES}
        if constant is None or (not constant) in decided_values:
            with pytest.raises(AssertionError, match="wrong or missing"):
                score_verdicts(lambda e: verdicts, seed, evidence)
        else:
            score_verdicts(lambda e: verdicts, seed, evidence)  # seed 11: the server is all off, and says so


def test_both_constants_fail_on_most_seeds_and_the_notebooks():
    """On the notebook's seed (0) and on most others something decided is on and something off."""
    mixed = [seed for seed in range(32) if len({on for _, on, d, _ in explain(seed) if d is not None}) == 2]
    assert 0 in mixed and len(mixed) >= 24


def test_a_guess_where_the_evidence_cannot_tell_fails_the_every_endpoint_check():
    """Answering deferred_release (never decided) is wrong on some endpoint; so is a constant."""
    with pytest.raises(AssertionError, match="deferred_release"):
        check_every_endpoint(lambda e: decided(e) | {"deferred_release": False})
    with pytest.raises(AssertionError):
        check_every_endpoint(lambda e: {n: True for n in SWITCHES})
    check_every_endpoint(decided)


def test_evidence_from_another_server_is_refused():
    """Verdicts scored against evidence this seed's server cannot give: the checker says restart."""
    with pytest.raises(AssertionError, match="restart"):
        score_verdicts(decided, 0, expected_evidence(draw(5)))


def test_a_fix_that_never_acted_is_named():
    """With reject_check on and a pool smaller than the window, the KV checks never see a request."""
    s = next(d for d in EVERY_DRAW if d.reject_check and not d.startup_check and d.kv_checksum and d.kv_canary)
    assert {"kv_checksum", "kv_canary", "deferred_release"} <= set(never_acted(s))
    assert "reject_check" not in never_acted(s) and "transfer_batch_cap" not in never_acted(s)


def test_predictions_are_checked_on_every_draw(capsys):
    """expected_evidence itself passes; one that forgets the scrub's effect on the cache fails."""
    check_predictions(expected_evidence)
    assert "512 draws" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="switches on"):
        check_predictions(lambda s: expected_evidence(s) | {"A repeats": "cached"})
