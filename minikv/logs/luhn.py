"""The Luhn check digit that every payment card number ends with (ISO/IEC 7812).

From the right, double every second digit (not the check digit itself), subtract 9 from any
result above 9, and add everything up: a valid number's total is a multiple of 10. The scanner
uses `luhn_ok` to tell a card number from any other run of digits; the synthetic log uses
`luhn_check_digit` to write card numbers that the scanner must find.
"""

from __future__ import annotations


def _luhn_total(digits: str) -> int:
    """The Luhn sum of `digits`, the rightmost of them taken as the check digit."""
    doubled = (int(ch) * (1 + i % 2) for i, ch in enumerate(reversed(digits)))
    return sum(d - 9 if d > 9 else d for d in doubled)


def luhn_check_digit(payload: str) -> int:
    """The digit that makes `payload` + digit pass the check."""
    return -_luhn_total(payload + "0") % 10


def luhn_ok(digits: str) -> bool:
    """Does this card-length run of digits (13-19 of them) pass the check?"""
    return 13 <= len(digits) <= 19 and digits.isascii() and digits.isdigit() and _luhn_total(digits) % 10 == 0
