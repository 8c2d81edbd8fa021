"""The benchmark (`python -m minikv bench`, docs/benchmarks.md): `benchmark.py` runs `systems.py`'s runners,
`report.py` and `plot.py` show it, the others measure one thing each; `serving.py` is `bench --serve`."""
