"""`python -m minikv probe URL --key KEY_A --key KEY_B`: black-box isolation checks of an endpoint.

Only the public OpenAI-compatible API and two keys the user owns are used, so the same checks
run against minikv, a vLLM or SGLang server, or a hosted provider.

    client.py        the HTTP client: streaming completions, time to first token, a request budget
    prompts.py       random-letter prompts (Gu et al.) and the endpoint's tokens-per-word scale
    report.py        a check's exchanges and verdict, printed or as JSON; the exit status
    over_length.py   past the advertised window: refused; at its top: read, not answered blind
    honesty.py       usage.prompt_tokens matches what was sent; time to first token grows with it
    canary.py        key A's random canary never comes back to key B
    prefix_cache.py  is the prefix cache shared across keys? timing (KS test) and cached_tokens
    run.py           a session on the endpoint, the checks in order, the report
    command.py       the command line
"""
