"""Gateway timestamps: one explicit ISO 8601 parser, so the affected set never depends on Python.

`datetime.fromisoformat` changed in Python 3.11: it began to accept `Z`, fractions of any
length (`...59.9Z`), offsets without a colon (`+0200`) and the basic format
(`20260827T000000Z`), all of which 3.10 refused. A scan whose answer changes with the
interpreter is not an answer, so the forms below are written out and parsed here:

    2026-08-27T00:00:00Z           extended; `T`, `t` or a space between date and time
    2026-08-27T00:00:00.9+02:00    a fraction of 1-9 digits (`.` or `,`), cut to microseconds
    2026-08-27T00:00+0200          seconds optional; offset as +hh, +hh:mm or +hhmm; Z or z
    20260827T000000Z               basic: no separators in date or time (then none in the offset)
    2026-08-27T00:00:00            no zone: read as UTC, and the caller is told

A fraction is cut, never rounded, so 23:59:59.9999999 stays on its day. A date alone, hour 24,
second 60 and any non-ASCII digit are refused.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

# The extended and the basic form differ only in their separators: date, date-time, time, offset.
_FORMS = [re.compile(
    rf"(?P<year>[0-9]{{4}}){d}(?P<month>[0-9]{{2}}){d}(?P<day>[0-9]{{2}}){t}"
    rf"(?P<hour>[0-9]{{2}}){c}(?P<minute>[0-9]{{2}})(?:{c}(?P<second>[0-9]{{2}})(?:[.,](?P<fraction>[0-9]{{1,9}}))?)?"
    rf"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_h>[0-9]{{2}})(?:{o}(?P<off_m>[0-9]{{2}}))?)?"
) for d, t, c, o in (("-", "[Tt ]", ":", ":?"), ("", "[Tt]", "", ""))]


def parse_timestamp(text: str) -> tuple[datetime, bool]:
    """ISO 8601 text -> (aware UTC datetime, True when the text had no zone and UTC was assumed).

    Raises ValueError for anything outside the forms above, and OverflowError when the offset
    moves the time outside years 1 to 9999.
    """
    match = _FORMS[0].fullmatch(text) or _FORMS[1].fullmatch(text)
    if match is None:
        raise ValueError(f"not an ISO 8601 date and time: {text[:40]!r}")
    year, month, day, hour, minute, second, fraction, utc, sign, off_h, off_m = match.groups()
    microsecond = int(fraction[:6].ljust(6, "0")) if fraction else 0
    fields = (int(year), int(month), int(day), int(hour), int(minute), int(second or 0), microsecond)
    if sign is None:  # Z, or no zone at all (then UTC is assumed, and the caller told)
        return datetime(*fields, tzinfo=timezone.utc), utc is None  # ValueError if out of range
    offset = timedelta(hours=int(off_h), minutes=int(off_m or 0))
    if offset >= timedelta(hours=24) or int(off_m or 0) > 59:
        raise ValueError(f"offset {text[match.start('sign'):]!r} is not a time zone")
    zone = timezone(offset if sign == "+" else -offset)
    return datetime(*fields, tzinfo=zone).astimezone(timezone.utc), False
