"""Every relative path the README, docs/ or a notebook names exists in the repository, and none
points outside it (a learner's clone has no shared/ folder)."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks" / "sources").glob("*.py"))
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # markdown [text](target)
CODE = re.compile(r"`([^`\n]+)`")  # `inline code`
PATH = re.compile(r"^(?:\.\./)?[\w.-]+(?:/[\w.-]+)+/?$|^[\w.-]+\.(?:md|py|png|ipynb|json|jsonl\.gz|txt|toml|cfg)$")


def prose(path: Path) -> str:
    """What a reader reads: the file itself, or a notebook's markdown cells."""
    if path.suffix == ".py":
        return "\n".join(c.source for c in jupytext.read(path).cells if c.cell_type == "markdown")
    return path.read_text()


def named_paths(text: str) -> list[tuple[str, bool]]:
    """(path, is_link) for every markdown link target and every path-shaped word in inline code."""
    found = [(t, True) for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]
    for code in CODE.findall(text):
        found += [(word, False) for word in code.split() if PATH.match(word)]
    return found


def exists_by_name(name: str) -> bool:
    """A bare file name (`engine.py`, in a table of one package's files) names some file in the repository."""
    return "/" not in name and any(ROOT.glob(f"*/**/{name}"))


def missing(path: Path) -> list[str]:
    """Named paths that exist neither beside the file (links) nor from the repository root."""
    base = ROOT / "notebooks" if path.suffix == ".py" else path.parent
    lost = []
    for name, is_link in named_paths(prose(path)):
        candidates = [base / name] if is_link else [ROOT / name, base / name]
        if name.startswith("/") or not (any(c.exists() for c in candidates) or (not is_link and exists_by_name(name))):
            lost.append(name)
    return lost


@pytest.mark.parametrize("path", DOCUMENTS + SOURCES, ids=lambda p: p.name)
def test_every_named_path_exists(path: Path):
    """A path named in the README, docs/ or a notebook is in the repository."""
    assert not missing(path), f"{path.relative_to(ROOT)} names paths that do not exist: {missing(path)}"


@pytest.mark.parametrize("path", DOCUMENTS + SOURCES + sorted((ROOT / "minikv").rglob("*.py")), ids=lambda p: p.name)
def test_nothing_points_outside_the_repository(path: Path):
    """No README, doc, notebook or module points at shared/ or the project's private notes."""
    text = path.read_text()
    assert not re.search(r"\bshared/|INCIDENT\.md|DESIGN\.md", text), f"{path.relative_to(ROOT)} points outside the repository"


OUTSIDE_NUMBER = re.compile(r"CVE-\d{4}-\d+|GHSA(?:-[a-z0-9]{4}){3}|#\d{3,5}\b")  # "#999999" is a colour


@pytest.mark.parametrize("path", SOURCES + DOCUMENTS, ids=lambda p: p.name)
def test_every_cve_advisory_and_pr_number_has_its_source(path: Path):
    """A CVE, advisory or PR/issue number a learner reads is listed, with its source, in docs/sources.md."""
    listed = set(OUTSIDE_NUMBER.findall((ROOT / "docs" / "sources.md").read_text()))
    unlisted = sorted(set(OUTSIDE_NUMBER.findall(path.read_text())) - listed)
    assert not unlisted, f"{path.name} names {unlisted}: add each to docs/sources.md with its public source"
