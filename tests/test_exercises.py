"""Every exercise's checker fails constant answers and passes the notebook's hidden solution."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import jupytext
import pytest

import minikv.exercises

SOURCES = sorted((Path(__file__).resolve().parents[1] / "notebooks" / "sources").glob("*.py"))
CONSTANT_ANSWERS = [0, 1, 49, 672, True, False, None, "", "MRN", set(), [], 1_000_000.0]
CONSTANT_PATTERNS = ["", "MRN", "Patient", r"\d{8}", "MRN \\d+", ".*"]


def checkers() -> dict:
    """Every check_* function of every module in minikv.exercises."""
    found = {}
    for info in pkgutil.iter_modules(minikv.exercises.__path__):
        module = importlib.import_module(f"minikv.exercises.{info.name}")
        found |= {name: obj for name, obj in vars(module).items()
                  if name.startswith("check_") and getattr(obj, "__module__", None) == module.__name__}
    return found


def solutions() -> list[tuple[str, str, str, str]]:
    """(notebook, checker name, answer name, the solution cell's definitions) for every hidden solution cell."""
    found = []
    for source in SOURCES:
        for cell in jupytext.read(source).cells:
            if "solution" not in cell.metadata.get("tags", []):
                continue
            tree = ast.parse(cell.source)
            kept = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))
                    or isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]
            calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                     and isinstance(n.value.func, ast.Name) and n.value.func.id.startswith("check_")]
            assert len(calls) == 1, f"{source.name}: a solution cell must call exactly one checker"
            found.append((source.stem[:2], calls[0].func.id, calls[0].args[0].id, ast.unparse(ast.Module(kept, []))))
    return found


SOLUTIONS = solutions()


def test_every_checker_has_a_hidden_solution():
    """No checker in minikv.exercises is left without a solution cell that calls it."""
    assert sorted(checkers()) == sorted(name for _, name, _, _ in SOLUTIONS)


@pytest.mark.parametrize("notebook, checker, answer, code", SOLUTIONS, ids=[f"{s[0]}-{s[1]}" for s in SOLUTIONS])
def test_hidden_solution_passes(notebook, checker, answer, code):
    """The notebook's hidden solution, run on its own, satisfies its checker."""
    namespace: dict = {}
    exec(compile(code, f"<solution of {notebook}>", "exec"), namespace)
    checkers()[checker](namespace[answer])


@pytest.mark.parametrize("notebook, checker, answer, code", SOLUTIONS, ids=[f"{s[0]}-{s[1]}" for s in SOLUTIONS])
def test_constant_answers_fail(notebook, checker, answer, code):
    """No constant (a function that ignores its input, or a fixed pattern) passes the checker."""
    namespace: dict = {}
    exec(compile(code, f"<solution of {notebook}>", "exec"), namespace)
    if isinstance(namespace[answer], str):
        stubs = CONSTANT_PATTERNS
    else:
        stubs = [lambda *args, value=value, **kwargs: value for value in CONSTANT_ANSWERS]
    for stub in stubs:
        with pytest.raises(AssertionError, match="expected"):
            checkers()[checker](stub)


def test_try_exercise_says_not_solved_for_the_stub_and_checks_an_answer(capsys):
    """The learner's stub prints "not solved yet"; a real answer goes to the checker, failures included."""
    from minikv.exercises import try_exercise

    def stub(x):
        raise NotImplementedError

    def checker(fn):
        assert fn(2) == 4, "expected 4"
        print("correct")

    try_exercise(checker, stub)
    assert capsys.readouterr().out == "not solved yet: write stub, then run this cell again\n"
    try_exercise(checker, lambda x: x * 2)
    assert capsys.readouterr().out == "correct\n"
    with pytest.raises(AssertionError, match="expected 4"):
        try_exercise(checker, lambda x: x)
