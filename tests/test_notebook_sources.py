"""Every notebook has a jupytext source, the committed .ipynb holds exactly its cells, and no paragraph is a wall of text."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))


def cells(nb: nbformat.NotebookNode) -> list[tuple[str, str, list[str]]]:
    """(type, source, tags) of every cell: what a reviewer reads and nbval runs."""
    return [(c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells]


def test_every_notebook_has_a_source():
    """No notebook is edited only as JSON."""
    missing = [p.name for p in NOTEBOOK_FILES if not (NOTEBOOKS / "sources" / f"{p.stem}.py").exists()]
    assert NOTEBOOK_FILES and not missing, f"notebooks without a source in notebooks/sources/: {missing}"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_notebook_matches_its_source(path: Path):
    """Rebuild with `python scripts/build_notebooks.py NAME` when this fails."""
    source = jupytext.read(NOTEBOOKS / "sources" / f"{path.stem}.py")
    built = nbformat.read(path, as_version=4)
    want, got = cells(source), cells(built)
    assert len(want) == len(got), f"{path.name}: {len(got)} cells, its source has {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        assert w == g, f"{path.name} cell {i} differs from its source:\n--- source\n{w[1]}\n--- notebook\n{g[1]}"


MAX_PARAGRAPH_WORDS = 150


@pytest.mark.parametrize("source", sorted((NOTEBOOKS / "sources").glob("*.py")), ids=lambda p: p.stem)
def test_no_markdown_paragraph_is_a_wall_of_text(source: Path):
    """Every block of markdown between blank lines (a paragraph, a list, a table) stays under 150 words."""
    blocks = [b for c in jupytext.read(source).cells if c.cell_type == "markdown"
              for b in re.split(r"\n\s*\n", c.source) if not b.lstrip().startswith("```")]
    long = [f"{len(b.split())} words: {b[:60]!r}" for b in blocks if len(b.split()) > MAX_PARAGRAPH_WORDS]
    assert not long, f"{source.name}: split these paragraphs: {long}"
