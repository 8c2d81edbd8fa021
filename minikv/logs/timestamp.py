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

_FRACTION = r"(?:[.,](?P<fraction>[0-9]{1,9}))?"
_EXTENDED = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt ]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})" + _FRACTION + r")?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_h>[0-9]{2})(?::?(?P<off_m>[0-9]{2}))?)?"
)
_BASIC = re.compile(
    r"(?P<year>[0-9]{4})(?P<month>[0-9]{2})(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2})(?P<minute>[0-9]{2})(?:(?P<second>[0-9]{2})" + _FRACTION + r")?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_h>[0-9]{2})(?P<off_m>[0-9]{2})?)?"
)


def parse_timestamp(text: str) -> tuple[datetime, bool]:
    """ISO 8601 text -> (aware UTC datetime, True when the text had no zone and UTC was assumed).

    Raises ValueError for anything outside the forms in the module docstring, and
    OverflowError when the offset moves the time outside years 1 to 9999.
    """
    match = _EXTENDED.fullmatch(text) or _BASIC.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ISO 8601 date and time: {text[:40]!r}")
    part = match.groupdict()
    microsecond = int((part["fraction"] or "0")[:6].ljust(6, "0"))
    when = datetime(int(part["year"]), int(part["month"]), int(part["day"]), int(part["hour"]),
                    int(part["minute"]), int(part["second"] or 0), microsecond)  # ValueError if out of range
    if part["sign"] is None:
        return when.replace(tzinfo=timezone.utc), part["utc"] is None
    offset = timedelta(hours=int(part["off_h"]), minutes=int(part["off_m"] or 0))
    if offset >= timedelta(hours=24) or int(part["off_m"] or 0) > 59:
        raise ValueError(f"offset {text[match.start('sign'):]!r} is not a time zone")
    zone = timezone(offset if part["sign"] == "+" else -offset)
    return when.replace(tzinfo=zone).astimezone(timezone.utc), False
