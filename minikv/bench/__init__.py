"""The benchmark (`python -m minikv bench`, docs/benchmarks.md): minikv against transformers on one workload.

`benchmark.py` runs it over `systems.py`'s runners; `report.py` and `plot.py` show it; `roofline.py`,
`memory.py`, `prefix.py` and `transfer.py` measure one thing each; `serving.py` is `bench --serve`.
"""
