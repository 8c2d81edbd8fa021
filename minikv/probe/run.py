"""Running the probe: open a session on the endpoint, run the chosen checks, collect the report."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from minikv.probe.canary import check_canary
from minikv.probe.client import OutOfBudget, ProbeClient, mask
from minikv.probe.eviction import check_eviction
from minikv.probe.replies import CannotProbe
from minikv.probe.honesty import check_honesty
from minikv.probe.options import ProbeOptions
from minikv.probe.over_length import check_over_length
from minikv.probe.prefix_cache import check_prefix_cache
from minikv.probe.report import INFO, INCOMPLETE, PASS, CheckResult, exit_status
from minikv.probe.session import MARGIN_TOKENS, ProbeSession, calibrate
from minikv.probe.token_gaps import check_token_gaps

MIN_CONTEXT = 64
MAX_CONTEXT = 1 << 20  # the probe writes prompts up to the window: about 2 MB of letters at this size
MAX_PROMPT_WORDS = 2 * MAX_CONTEXT  # a random letter and a space are at least half a token on any tokenizer


def checks(options: ProbeOptions) -> list[tuple[str, Callable[[ProbeSession, CheckResult], None]]]:
    """The chosen checks in the order they run: the canary first, while the pool holds little but key A's note."""
    every = {
        "canary": ("canary", check_canary),
        "over-length": ("over-length", check_over_length),
        "honesty": ("prompt-token honesty", check_honesty),
        "prefix-cache": ("shared prefix cache", lambda s, r: check_prefix_cache(s, r, options.rounds)),
        "eviction": ("shared eviction order", check_eviction),
        "token-gaps": ("inter-token gap", check_token_gaps),
    }
    return [every[name] for name in every if name in options.checks]


@dataclass
class ProbeReport:
    """Every check's result, and what the probe learned about the endpoint."""

    endpoint: str
    model: str | None
    context: int | None
    keys: list[str]  # masked
    salt_per_key: bool = False
    requests_sent: int = 0
    results: list[CheckResult] = field(default_factory=list)

    @property
    def status(self) -> int:
        return exit_status(self.results)

    def verdicts(self) -> dict[str, str]:
        return {r.name: r.verdict for r in self.results}

    def to_json(self) -> dict:
        return {"endpoint": self.endpoint, "model": self.model, "context": self.context, "keys": self.keys,
                "salt_per_key": self.salt_per_key, "requests_sent": self.requests_sent,
                "checks": [r.to_json() for r in self.results], "exit_status": self.status}

    def summary(self) -> str:
        failed = [r.name for r in self.results if r.verdict not in (PASS, INFO)]
        measured = [r.name for r in self.results if r.verdict == INFO]
        salted = ", a cache_salt per key" if self.salt_per_key else ""
        return (f"{self.requests_sent} requests to {self.endpoint} ({self.model}, window {self.context:,} tokens{salted}): "
                + ("all checks passed" if not failed else f"not passed: {', '.join(failed)}")
                + (f"; measured, not judged: {', '.join(measured)}" if measured else ""))


def pick_model(listed: list[dict], model: str | None) -> tuple[str, dict | None]:
    """The model to probe and its card from /v1/models (None if --model names one it does not list)."""
    if model:
        return model, next((m for m in listed if m.get("id") == model), None)
    if not listed:
        raise CannotProbe("/v1/models lists no model; pass --model")
    first = listed[0].get("id")
    if not isinstance(first, str) or not first:
        raise CannotProbe(f"the first model /v1/models lists has no id string (id {first!r}); pass --model")
    return first, listed[0]


def advertised_context(card: dict | None, model: str) -> int:
    """max_model_len (or context_length) from the model's card; CannotProbe if missing or not a count."""
    if card is None:
        raise CannotProbe(f"/v1/models does not list {model!r}, so its context window is unknown; pass --context N")
    value = card.get("max_model_len", card.get("context_length"))
    if value is None:
        raise CannotProbe(f"the endpoint does not advertise the context window of {model!r} (no max_model_len "
                          "in /v1/models); pass --context N")
    if type(value) is not int:
        raise CannotProbe(f"/v1/models gives max_model_len {value!r} for {model!r}, not a token count; pass --context N")
    return value


def open_session(client: ProbeClient, key_a: str, key_b: str, options: ProbeOptions) -> ProbeSession:
    """Both keys accepted, the model and its window known, the token scale measured."""
    listed = client.models(key_a)
    client.models(key_b)
    client.model, card = pick_model(listed, options.model)
    given = options.context is not None
    context = options.context if given else advertised_context(card, client.model)
    source = f"--context {context}" if given else f"max_model_len {context:,}"
    if context < MIN_CONTEXT:
        raise CannotProbe(f"{source} is below the {MIN_CONTEXT} tokens the probe needs to fit its prompts")
    if context > MAX_CONTEXT:
        raise CannotProbe(f"{source} is more than the probe can fill: it writes prompts up to {MAX_CONTEXT:,} tokens")
    rng = random.Random(options.seed)
    scale = calibrate(client, key_a, rng)
    if scale.words_over(context + MARGIN_TOKENS) > MAX_PROMPT_WORDS:
        raise CannotProbe(f"usage.prompt_tokens grows by {scale.per_word:.3g} per word: filling the {context:,}-token "
                          f"window would take more than {MAX_PROMPT_WORDS:,} words")
    return ProbeSession(client, key_a, key_b, context, scale, rng)


def probe_endpoint(url: str, key_a: str, key_b: str, on_result: Callable[[CheckResult], None] | None = None,
                   transport: httpx.BaseTransport | None = None, **settings) -> ProbeReport:
    """Run the chosen checks against `url`; `settings` are ProbeOptions' fields (rounds=, seed=, checks=, ...).

    CannotProbe if the endpoint cannot be probed at all, or answers something the API does not allow.
    """
    options = ProbeOptions(**settings)
    client = ProbeClient(url, options.budget, options.time_limit_s, transport, options.salt_per_key)
    try:
        session = open_session(client, key_a, key_b, options)
        report = ProbeReport(client.base, client.model, session.context, [mask(key_a), mask(key_b)], options.salt_per_key)
        for name, check in checks(options):
            result = CheckResult(name)
            report.results.append(result)
            try:
                check(session, result)
            except OutOfBudget as e:
                result.decide(INCOMPLETE, str(e))
            if on_result:
                on_result(result)
    except OutOfBudget as e:
        raise CannotProbe(str(e)) from None
    finally:
        client.close()
    report.requests_sent = client.sent
    return report
