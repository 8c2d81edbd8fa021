"""The Luhn check digit every payment card number ends with (ISO/IEC 7812): the scanner checks it, the
synthetic log writes it."""

def _luhn_total(digits: str) -> int:
    """From the right, every second digit doubled (less 9 above 9), all added: 0 mod 10 if valid."""
    doubled = (int(ch) * (1 + i % 2) for i, ch in enumerate(reversed(digits)))
    return sum(d - 9 if d > 9 else d for d in doubled)


def luhn_check_digit(payload: str) -> int:
    """The digit that makes `payload` + digit pass the check."""
    return -_luhn_total(payload + "0") % 10


def luhn_ok(digits: str) -> bool:
    """Does this card-length run of digits (13-19 of them) pass the check?"""
    return 13 <= len(digits) <= 19 and digits.isascii() and digits.isdigit() and _luhn_total(digits) % 10 == 0
