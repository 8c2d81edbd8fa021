"""`python -m minikv serve`: the engine behind an OpenAI-compatible HTTP API.

    app.py          the FastAPI routes: /v1/completions, /v1/chat/completions, /v1/models, /health
    schemas.py      what a client may send (checked before it reaches the engine) and the reply bodies
    errors.py       OpenAI's error shape, and the status and code of each refusal
    auth.py         bearer API keys -> tenants
    engine_loop.py  the one thread that owns the engine and steps it for every connection
    gateway.py      the gateway log, one JSON line per call, in the schema `scan-logs` reads
    command.py      the command line: build the engine or the cluster, start uvicorn, stop cleanly
    launch.py       a server on a free port, as a child process or on a thread (tests, notebook 10)
"""
