"""Gateway timestamps: one explicit ISO 8601 parser, so the affected set never depends on the Python
version (the accepted forms: docs/logs.md)."""

import re
from datetime import datetime, timedelta, timezone

# The extended and the basic form differ only in their separators: date, date-time, time, offset.
_FORMS = [re.compile(
    rf"(?P<year>[0-9]{{4}}){d}(?P<month>[0-9]{{2}}){d}(?P<day>[0-9]{{2}}){t}"
    rf"(?P<hour>[0-9]{{2}}){c}(?P<minute>[0-9]{{2}})(?:{c}(?P<second>[0-9]{{2}})(?:[.,](?P<fraction>[0-9]{{1,9}}))?)?"
    rf"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_h>[0-9]{{2}})(?:{o}(?P<off_m>[0-9]{{2}}))?)?"
) for d, t, c, o in (("-", "[Tt ]", ":", ":?"), ("", "[Tt]", "", ""))]


def parse_timestamp(text: str) -> tuple[datetime, bool]:
    """ISO 8601 text -> (aware UTC datetime, True when the text had no zone and UTC was assumed). ValueError
    for anything outside the forms, OverflowError when the offset moves the time outside years 1 to 9999."""
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
