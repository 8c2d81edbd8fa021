"""Exercise checkers, one module per notebook (`nb01_kv_caching.py` serves notebook 01, ...). A checker tries
a learner's function on listed and seeded cases (so no constant passes) against the engine's own code or a
step-by-step count, never the solution's formula; it prints one line when all pass, else raises AssertionError
naming the case, what was expected and what came back."""

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

from minikv.model.llama import ModelConfig

TINY_MODEL = ModelConfig(vocab_size=4, hidden_size=4, intermediate_size=4, num_layers=1, num_heads=1,
                         num_kv_heads=1, head_dim=2, max_position_embeddings=8)  # only bookkeeping matters


@functools.cache
def shipped_model() -> tuple:
    """(model, tokenizer) of data/tiny-llama, loaded once for every checker that runs the engine."""
    from minikv.model.checkpoint import load_model
    return load_model()


def expect(got: Any, want: Any, case: str, hint: str = "") -> None:
    """Raise AssertionError saying, for `case`, what was expected and what came back (a float within 1e-9)."""
    close = isinstance(want, float) and isinstance(got, (int, float)) and abs(got - want) <= 1e-9
    if got != want and not close or type(got) is bool and type(want) is not bool:
        raise AssertionError(f"{case}: expected {want!r}, got {got!r}." + (f" {hint}" if hint else ""))


def expect_cases(fn: Callable, reference: Callable, cases: Sequence[tuple], case: str, hint: str,
                 done: str) -> None:
    """expect(fn(*args), reference(*args)) for every args in `cases` (`fn` gets its own copy), then print
    `done`; `case.format(*args)` names the case."""
    for args in cases:
        expect(fn(*copy.deepcopy(args)), reference(*args), case.format(*args), hint)
    print(done.format(len(cases)))


def try_exercise(checker: Callable[[Callable], None], answer: Callable) -> None:
    """Run `checker` on the learner's `answer`; while it is still the stub, say so instead of failing."""
    try:
        checker(answer)
    except NotImplementedError:
        print(f"not solved yet: write {answer.__name__}, then run this cell again")
