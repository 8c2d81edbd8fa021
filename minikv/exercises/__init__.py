"""Exercise checkers, one module per notebook (`nb01_kv_caching.py` serves notebook 01, ...).

A checker tries a learner's function on several cases, some of them generated from a seed, so
that no constant answer passes. It never computes the answer with the solution's formula: it
asks the engine's own code, or enumerates the situation step by step. It prints one line when
everything passes and raises AssertionError naming the case, what was expected and what came
back. `tests/test_exercises.py` runs every checker against constant stubs (they must fail) and
against the notebook's hidden solution (it must pass).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def expect(got: Any, want: Any, case: str, hint: str = "") -> None:
    """Raise AssertionError saying, for `case`, what was expected and what came back."""
    if got != want or type(got) is bool and type(want) is not bool:
        raise AssertionError(f"{case}: expected {want!r}, got {got!r}." + (f" {hint}" if hint else ""))


def try_exercise(checker: Callable[[Callable], None], answer: Callable) -> None:
    """Run `checker` on the learner's `answer`; while it is still the stub, say so instead of failing."""
    try:
        checker(answer)
    except NotImplementedError:
        print(f"not solved yet: write {answer.__name__}, then run this cell again")
