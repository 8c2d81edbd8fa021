"""Build the notebooks from their jupytext sources (notebooks/sources/) and execute each in a fresh kernel.

    python scripts/build_notebooks.py                  # every notebook
    python scripts/build_notebooks.py 05 06            # those whose names start so
    python scripts/build_notebooks.py --no-execute 09  # write the cells only

`tests/test_notebook_sources.py` checks that every .ipynb holds exactly its source's cells.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks" / "sources"
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def notebook_path(source: Path) -> Path:
    return ROOT / "notebooks" / f"{source.stem}.ipynb"


def build(source: Path, execute: bool = True) -> Path:
    """Write notebooks/<name>.ipynb from its source; execute it top to bottom if asked."""
    nb = jupytext.read(source)
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:03d}"  # stable ids, so a rebuild's diff shows only what changed
    path = notebook_path(source)
    nbformat.write(nb, path)
    if execute:
        subprocess.run(
            [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
             "--ExecutePreprocessor.timeout=600", "--ExecutePreprocessor.record_timing=False", str(path)],
            check=True, cwd=path.parent, env={**os.environ, "OMP_NUM_THREADS": "1"},  # as under pytest
        )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 05 (default: all)")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    args = parser.parse_args(argv)
    sources = sorted(SOURCES.glob("*.py"))
    chosen = [s for s in sources if not args.names or any(s.stem.startswith(n) for n in args.names)]
    if not chosen:
        print(f"error: no source in {SOURCES} starts with {' or '.join(args.names)}", file=sys.stderr)
        return 2
    for source in chosen:
        print(f"building {notebook_path(source).relative_to(ROOT)}", flush=True)
        build(source, execute=not args.no_execute)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
