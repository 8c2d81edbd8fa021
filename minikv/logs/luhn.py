"""The Luhn check digit that every payment card number ends with (ISO/IEC 7812).

From the right, double every second digit (the check digit itself is not doubled), subtract 9
from any result above 9, and add everything up: a valid number's total is a multiple of 10.
The scanner uses `luhn_ok` to tell a card number from any other run of digits; the synthetic log
uses `luhn_check_digit` to write card numbers that the scanner must find.
"""

from __future__ import annotations


def _luhn_total(digits: str, double_first: bool) -> int:
    """The Luhn sum of `digits` read from the right, doubling the rightmost when `double_first`."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if (i % 2 == 0) == double_first else 1)
        total += d - 9 if d > 9 else d
    return total


def luhn_check_digit(payload: str) -> int:
    """The digit that makes `payload` + digit pass the check."""
    return -_luhn_total(payload, double_first=True) % 10


def luhn_ok(digits: str) -> bool:
    """Does this card-length run of digits (13-19 of them) pass the check?"""
    if not (13 <= len(digits) <= 19 and digits.isascii() and digits.isdigit()):
        return False
    return _luhn_total(digits, double_first=False) % 10 == 0
