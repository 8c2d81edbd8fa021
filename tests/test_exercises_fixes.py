"""The checkers of notebook 06 judge the learner's own sum, not the library that defines the answer."""

from __future__ import annotations

import zlib

import pytest

from minikv.exercises.nb06_fixes import check_adler32


def adler32_from_the_definition(data: bytes) -> int:
    """RFC 1950's Adler-32, one byte at a time."""
    a, b = 1, 0
    for byte in data:
        a = (a + byte) % 65521
        b = (b + a) % 65521
    return b * 65536 + a


def test_adler32_checker_accepts_the_definition(capsys):
    """A byte-by-byte sum passes."""
    check_adler32(adler32_from_the_definition)
    assert "correct" in capsys.readouterr().out


def test_adler32_checker_rejects_calling_zlib_and_restores_it():
    """The exercise says "from the definition": handing back zlib's own sum fails with a one-line reason,
    and zlib.adler32 works again once the checker returns."""
    with pytest.raises(AssertionError, match="from its definition"):
        check_adler32(lambda data: zlib.adler32(data))
    assert zlib.adler32(b"Wikipedia") == 0x11E60398
