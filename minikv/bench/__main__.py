"""`python -m minikv.bench ...` is `python -m minikv bench ...`."""

import sys

from minikv.cli import main

raise SystemExit(main(["bench", *sys.argv[1:]]))
