"""Gateway timestamps: `datetime.fromisoformat`, converted to UTC, a missing zone reported, a date alone refused."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from minikv.logs.gateway_log import parse_timestamp


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "text, when, zone_assumed",
    [
        ("2026-08-27T00:00:00Z", utc(2026, 8, 27), False),
        ("2026-08-27 00:00:00+00:00", utc(2026, 8, 27), False),
        ("2026-09-09T23:59:59,25Z", utc(2026, 9, 9, 23, 59, 59, 250_000), False),
        ("2026-09-09T23:59:59.999999999Z", utc(2026, 9, 9, 23, 59, 59, 999_999), False),  # cut, not rounded
        ("2026-09-10T01:30:00+0200", utc(2026, 9, 9, 23, 30), False),  # the offset moves it a day back
        ("2026-08-26T22:00:00-03:00", utc(2026, 8, 27, 1), False),
        ("20260827T013000+0130", utc(2026, 8, 27), False),
        ("2026-08-27T00:00", utc(2026, 8, 27), True),
    ],
)
def test_accepted_forms_give_the_same_utc_time(text: str, when: datetime, zone_assumed: bool):
    """Each documented form gives this UTC instant (and says when no zone was given)."""
    assert parse_timestamp(text) == (when, zone_assumed)


@pytest.mark.parametrize("text", ["2026-08-27", "20260827", "2026-08-27T24:00:00Z", "2026-08-27T23:59:60Z",
                                  "2026-02-30T00:00:00Z", "2026-08-27T00:00:00+24:00", "2026-08-27T00:00:00Z\n",
                                  "２０２６-08-27T00:00:00Z", "yesterday", ""])
def test_other_forms_are_refused(text: str):
    """A date alone (it would read as midnight), out-of-range fields, stray characters: ValueError."""
    with pytest.raises(ValueError):
        parse_timestamp(text)


def test_an_offset_that_leaves_the_calendar_is_an_overflow():
    """Year 1 minus an offset has no UTC time: OverflowError, which the reader turns into a bad line."""
    with pytest.raises(OverflowError):
        parse_timestamp("0001-01-01T00:00:00+05:00")
