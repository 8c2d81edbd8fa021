"""Disaggregated serving: a prefill node and a decode node, each with its own page pool, joined by an
RDMA-like KV transfer; names follow SGLang's disaggregation package (docs/disagg.md).
"""
