"""The token-gap check's two signals (minikv/probe/token_gaps.py): B's largest gap and B's summed extra delay, and
the ROC AUC that scores them."""

from __future__ import annotations

import random

import pytest

from minikv.probe.token_gaps import extra_delay, largest_gap, roc_auc


def test_roc_auc_is_the_pairwise_definition():
    """scipy's Mann-Whitney U over n1 n2 is the chance a random miss exceeds a random hit, ties half."""
    rng = random.Random(0)
    for _ in range(20):
        misses = [rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(rng.randint(1, 9))]
        hits = [rng.choice([1.0, 2.0, rng.random()]) for _ in range(rng.randint(1, 9))]
        pairwise = sum((m > h) + 0.5 * (m == h) for m in misses for h in hits) / (len(misses) * len(hits))
        assert roc_auc(misses, hits) == pytest.approx(pairwise)


def test_summed_extra_delay_holds_a_chunked_prefill():
    """Chunks spread A's prefill over several gaps: the largest gap is small, the summed excess is not."""
    steady = tuple(0.01 * i for i in range(20))
    chunked = steady[:5] + tuple(0.05 + 0.03 * i for i in range(5)) + tuple(0.19 + 0.01 * i for i in range(10))
    assert extra_delay(steady, 0.045, 0.12) == pytest.approx(0.0)
    assert extra_delay(chunked, 0.045, 0.165) == pytest.approx(4 * 0.02)  # 4 gaps of 30 ms, the median 10 ms
    assert largest_gap(chunked, 0.045, 0.165) == pytest.approx(0.03)
    assert extra_delay(chunked, 0.045, 0.5) is None  # B's stream ended before A's request did
