"""`python -m minikv probe URL --key KEY_A --key KEY_B`: black-box isolation checks of an endpoint.

Only the public OpenAI-compatible API and two keys the user owns are used, so the same checks run
against minikv, vLLM, SGLang or a hosted provider (docs/serve.md, "The probe"). command.py reads
the command line; run.py opens a session (session.py) through the client (client.py, replies.py)
and runs the checks, one file each, into a report (report.py).
"""
