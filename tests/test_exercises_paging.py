"""The checkers of notebooks 02 and 03 pass a right answer and reject a wrong one with a hint."""

from __future__ import annotations

import pytest

from minikv.exercises.nb02_page_pools import check_slot_mapping, check_stale_pages, check_wasted_slots, simulated_log
from minikv.exercises.nb03_admission import admitted, check_admission, check_safe_context_len


def test_slot_mapping_checker_accepts_page_times_size_plus_offset(capsys):
    """The textbook formula passes."""
    check_slot_mapping(lambda table, ps, pos: table[pos // ps] * ps + pos % ps)
    assert "correct" in capsys.readouterr().out


def test_slot_mapping_checker_rejects_ignoring_the_block_table():
    """Treating the pool as contiguous (slot = position) is caught, with a hint."""
    with pytest.raises(AssertionError, match="page \\* page_size \\+ offset"):
        check_slot_mapping(lambda table, ps, pos: pos)


def test_wasted_slots_checker_accepts_round_up_to_pages(capsys):
    """Reserved (whole pages) minus used passes."""
    check_wasted_slots(lambda lens, ps: sum(-(-n // ps) * ps - n for n in lens))
    assert "correct" in capsys.readouterr().out


def test_wasted_slots_checker_rejects_rounding_down():
    """Floor division forgets the partly filled last page."""
    with pytest.raises(AssertionError, match="round up"):
        check_wasted_slots(lambda lens, ps: sum((n // ps) * ps - n for n in lens))


def test_admitted_follows_the_engine_on_the_incident():
    """Scaled by 1/1024: bob's 800-token prompt fits the window but not the 42-page pool."""
    assert admitted(22, 48, 1024, 42, 16)
    assert not admitted(800, 48, 1024, 42, 16)
    assert admitted(800, 48, 1024, 125, 16)


def test_admission_checker_accepts_both_checks(capsys):
    """Window check plus whole-page pool check passes."""
    def fn(prompt, out, window, pages, ps):
        return prompt <= window - 1 and prompt + out <= window and -(-(prompt + out) // ps) * ps <= pages * ps
    check_admission(fn)
    assert "correct" in capsys.readouterr().out


def test_admission_checker_rejects_the_window_check_alone():
    """Checking only the advertised window is the incident's mistake: caught."""
    with pytest.raises(AssertionError, match="800 tokens"):
        check_admission(lambda prompt, out, window, pages, ps: prompt + out <= window)


def test_safe_context_len_checker(capsys):
    """min(window, pool tokens) passes; keeping the configured window fails."""
    check_safe_context_len(lambda pages, ps, window: min(window, pages * ps))
    assert "correct" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="lower it to the pool"):
        check_safe_context_len(lambda pages, ps, window: window)


def stale_pages(events, num_pages, giving_back=("free", "preempt")):
    """Owned until a give-back of the same request; stale when free and ever written."""
    owner, written = [None] * num_pages, [False] * num_pages
    for e in events:
        for p in e.pages:
            if e.kind == "allocate":
                owner[p] = e.request_id
            elif e.kind in giving_back and owner[p] == e.request_id:
                owner[p] = None
            elif e.kind == "write":
                written[p] = True
    return [p for p in range(num_pages) if owner[p] is None and written[p]]


def test_stale_pages_checker_accepts_free_and_preempt(capsys):
    """A page is given back by a free or a preempt: passes."""
    check_stale_pages(stale_pages)
    assert "correct" in capsys.readouterr().out


def test_stale_pages_checker_rejects_an_answer_that_ignores_preempt():
    """Treating a preempted request's pages as still held is caught (the logs hold preempts)."""
    assert any(e.kind == "preempt" for seed in range(6) for e in simulated_log(seed))
    with pytest.raises(AssertionError, match="expected"):
        check_stale_pages(lambda events, n: stale_pages(events, n, giving_back=("free",)))
