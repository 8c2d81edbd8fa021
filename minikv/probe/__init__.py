"""`python -m minikv probe URL --key KEY_A --key KEY_B`: black-box isolation checks of an endpoint.

Only the public OpenAI-compatible API and two keys the user owns are used, so the same checks
run against minikv, a vLLM or SGLang server, or a hosted provider.

    options.py       what a run is asked to do: the checks, the budget, the time limit, --salt-per-key
    client.py        the HTTP client: streaming completions, time to first token, a budget and a deadline
    replies.py       what comes back, every field checked: a malformed reply is one line, never a FAIL
    prompts.py       random-letter prompts (Gu et al.) and the endpoint's tokens-per-word scale
    report.py        a check's exchanges, figures and verdict, printed or as JSON; the exit status
    over_length.py   past the advertised window: refused; at its top: read, not answered blind
    honesty.py       usage.prompt_tokens matches what was sent; time to first token grows with it
    canary.py        key A's random canary never comes back to key B
    prefix_cache.py  is the prefix cache shared across keys? timing (KS test) and cached_tokens
    eviction.py      is the eviction order shared across keys? prime and probe on B's cached_tokens
    token_gaps.py    B's inter-token gaps during A's prefill: hit from miss, as ROC AUC (a residual)
    run.py           a session on the endpoint, the chosen checks in order, the report
    command.py       the command line
"""
