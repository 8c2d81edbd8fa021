"""`python -m minikv <command>`: the command line lives in minikv/cli.py."""

from minikv.cli import main

raise SystemExit(main())
