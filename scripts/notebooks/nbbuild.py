"""Build a notebook from a list of cells, then execute it in a fresh kernel.

Notebook sources live here as Python so that they review like code; the executed .ipynb in
notebooks/ is what learners open and what nbval re-runs. Usage:
    python scripts/notebooks/01_kv_caching.py   # writes and executes notebooks/01_*.ipynb
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(text.strip())


def solution(text: str) -> nbformat.NotebookNode:
    """A code cell whose source starts collapsed: the exercise's hidden solution."""
    cell = code(text)
    cell.metadata["jupyter"] = {"source_hidden": True}
    cell.metadata["tags"] = ["solution"]
    return cell


def exercise(signature: str, checker: str) -> nbformat.NotebookNode:
    """The learner's cell: a stub of `signature` to fill in, run through `checker` once it is."""
    name = signature.split("(")[0]
    return code(f"""
def {signature}:
    raise NotImplementedError  # your code here

try:
    {checker}({name})
except NotImplementedError:
    print("not solved yet: write {name}, then run this cell again")
""")


def build(name: str, cells: list[nbformat.NotebookNode], execute: bool = True) -> Path:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = ROOT / "notebooks" / name
    nbformat.write(nb, path)
    if execute:
        subprocess.run(
            [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
             "--ExecutePreprocessor.timeout=600", str(path)],
            check=True, cwd=path.parent, env={**os.environ, "OMP_NUM_THREADS": "1"},  # as under pytest
        )
    return path
