"""The checkers of notebooks 09 and 10 pass a right answer and reject wrong ones with a hint."""

from __future__ import annotations

import pytest

from minikv.attacks.cached_tokens import recover_secret
from minikv.exercises.nb09_shared_prefixes import check_cached_tokens, check_recover
from minikv.exercises.nb10_salt_leaves_open import check_auc, check_bob_evicted


def longest_cached(earlier, prompt, page_size, keep_last=True):
    limit = (len(prompt) - 1) // page_size if keep_last else len(prompt) // page_size
    best = 0
    for e in earlier:
        n = 0
        while n < limit and (n + 1) * page_size <= len(e) and e[: (n + 1) * page_size] == prompt[: (n + 1) * page_size]:
            n += 1
        best = max(best, n)
    return best * page_size


def test_cached_tokens_checker_accepts_whole_leading_pages(capsys):
    """Whole pages, matched from the start, never the last token: passes."""
    check_cached_tokens(longest_cached)
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [
    lambda e, p, ps: 0,  # a constant
    lambda e, p, ps: longest_cached(e, p, ps, keep_last=False),  # forgets that the last token is computed
    lambda e, p, ps: longest_cached(e, p, 1),  # token by token whatever the page size
])
def test_cached_tokens_checker_rejects_wrong_answers(wrong):
    """A constant, a forgotten last token and ignoring the page size are all caught, with a hint."""
    with pytest.raises(AssertionError, match="full pages"):
        check_cached_tokens(wrong)


def recover(cached_tokens_of, known, alphabet):
    """The project's own attack (prefix_probe.recover_secret) at 1-token pages, as a learner's answer."""
    oracle = lambda prompts, hit_at: [cached_tokens_of(p) >= hit_at for p in prompts]  # noqa: E731
    return recover_secret(oracle, page_size=1, known=known, alphabet=alphabet)[0]


def test_recover_checker_accepts_the_attack(capsys):
    """One round per character, stop at the full stop: recovers every hidden secret."""
    check_recover(recover)
    assert "exactly" in capsys.readouterr().out


def test_recover_checker_rejects_a_constant_and_an_off_by_one():
    """A fixed answer, and a probe without the extra last token (which can never hit), fail."""
    with pytest.raises(AssertionError, match="expected"):
        check_recover(lambda oracle, known, alphabet: "0912")
    with pytest.raises(AssertionError, match="expected"):
        check_recover(lambda oracle, known, alphabet: recover(lambda p: oracle(p[:-1]), known, alphabet))


def evicted(num_pages, tenants, bob_parked, alice_parked, holds, partitioned, see_partition=True, see_alice=True):
    """Bob's holds take what is free to him first (the shared stack, or his quota's room), then his oldest pages."""
    if partitioned and see_partition:
        room = num_pages // tenants - bob_parked
    else:
        room = num_pages - bob_parked - (alice_parked if see_alice else 0)
    return min(bob_parked, max(0, holds - room))


def test_bob_evicted_checker_accepts_the_pools_rule(capsys):
    """The stack (or the quota's room) first, then Bob's own oldest pages: passes."""
    check_bob_evicted(evicted)
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [
    lambda *args: evicted(*args, see_partition=False),  # the partition ignored: Alice's pages still count
    lambda *args: evicted(*args, see_alice=False),  # Alice's parked pages ignored on the shared stack
    lambda n, t, b, a, h, p: max(0, h - (n // t - b if p else n - b - a)),  # more than Bob has
])
def test_bob_evicted_checker_rejects_wrong_answers(wrong):
    """Each wrong model of the pool is caught, with a hint naming the stack and the quota."""
    with pytest.raises(AssertionError, match="quota"):
        check_bob_evicted(wrong)


def auc_by_pairs(miss, hit, tie=0.5):
    return sum(1.0 if m > h else tie if m == h else 0.0 for m in miss for h in hit) / (len(miss) * len(hit))


def test_auc_checker_accepts_the_pair_count(capsys):
    """Every (miss, hit) pair, a tie as a half: passes."""
    check_auc(auc_by_pairs)
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [
    lambda miss, hit: auc_by_pairs(miss, hit, tie=0.0),  # ties dropped
    lambda miss, hit: auc_by_pairs(hit, miss),  # the hits' side
    lambda miss, hit: float(sum(miss) / len(miss) > sum(hit) / len(hit)),  # the means compared, once
])
def test_auc_checker_rejects_wrong_answers(wrong):
    """Ties not halved, the sides swapped and a comparison of means all fail, with the pair-count hint."""
    with pytest.raises(AssertionError, match="pairs"):
        check_auc(wrong)
