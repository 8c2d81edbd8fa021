"""The benchmark (`python -m minikv bench`, docs/benchmarks.md): minikv against transformers on one workload.

`benchmark.py` (the workload, the checks, the timed runs), `systems.py` (the runners), `report.py`
and `plot.py` (table, JSON, figure), `roofline.py`, `memory.py` (KV reserved against filled),
`prefix.py` (shared prefixes), `transfer.py` (the distributed KV transfer over loopback),
`serving.py` (`bench --serve`: minikv serve against vLLM over HTTP).
"""
