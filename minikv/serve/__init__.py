"""`python -m minikv serve`: the engine behind an OpenAI-compatible HTTP API, one module per part
(docs/serve.md); `python -m minikv peer`: vLLM beside it, in a venv of its own (docs/peers.md)."""
