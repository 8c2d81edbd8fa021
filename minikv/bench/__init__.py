"""The benchmark: minikv against transformers on one workload, same model, greedy decoding.

- `benchmark.py`: the workload, the equality check, the interleaved timed runs (`run_bench`);
- `systems.py`: the runners (transformers three ways, minikv's engines and the pair);
- `static_batch.py`: the contiguous static-batch baseline, the serving engine before page pools;
- `report.py`: the table, the JSON and the targets; `plot.py`: the figure;
- `serving.py`: `bench --serve`, minikv serve against vLLM over HTTP (docs/benchmarks.md).
"""
