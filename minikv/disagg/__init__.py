"""Disaggregated serving: a prefill node and a decode node, each with its own page pool,
joined by an RDMA-like KV transfer. Names follow SGLang's disaggregation package so that a
learner can open the real code afterwards and recognise it.
"""
