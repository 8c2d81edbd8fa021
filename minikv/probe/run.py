"""Running the probe: open a session on the endpoint, run the four checks, collect the report."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from minikv.probe.canary import check_canary
from minikv.probe.client import CannotProbe, OutOfBudget, ProbeClient, mask
from minikv.probe.command import DEFAULT_BUDGET, DEFAULT_ROUNDS, DEFAULT_TIME_LIMIT_S
from minikv.probe.honesty import check_honesty
from minikv.probe.over_length import check_over_length
from minikv.probe.prefix_cache import check_prefix_cache
from minikv.probe.report import INCOMPLETE, PASS, CheckResult, exit_status
from minikv.probe.session import ProbeSession, calibrate


def checks(rounds: int) -> list[tuple[str, Callable[[ProbeSession, CheckResult], None]]]:
    """In the order they run: the canary first, while the pool holds little but key A's note."""
    return [
        ("canary", check_canary),
        ("over-length", check_over_length),
        ("prompt-token honesty", check_honesty),
        ("shared prefix cache", lambda s, r: check_prefix_cache(s, r, rounds)),
    ]


@dataclass
class ProbeReport:
    """Every check's result, and what the probe learned about the endpoint."""

    endpoint: str
    model: str | None
    context: int | None
    keys: list[str]  # masked
    requests_sent: int = 0
    results: list[CheckResult] = field(default_factory=list)

    @property
    def status(self) -> int:
        return exit_status(self.results)

    def verdicts(self) -> dict[str, str]:
        return {r.name: r.verdict for r in self.results}

    def to_json(self) -> dict:
        return {"endpoint": self.endpoint, "model": self.model, "context": self.context, "keys": self.keys,
                "requests_sent": self.requests_sent, "checks": [r.to_json() for r in self.results],
                "exit_status": self.status}

    def summary(self) -> str:
        failed = [r.name for r in self.results if r.verdict != PASS]
        return (f"{self.requests_sent} requests to {self.endpoint} ({self.model}, window {self.context:,} tokens): "
                + ("all checks passed" if not failed else f"not passed: {', '.join(failed)}"))


def open_session(client: ProbeClient, key_a: str, key_b: str, model: str | None, context: int | None,
                 seed: int | None) -> ProbeSession:
    """Both keys accepted, the model and its window known, the token scale measured."""
    listed = client.models(key_a)
    client.models(key_b)
    card = next((m for m in listed if m.get("id") == model), None) if model else (listed[0] if listed else None)
    if card is None and not model:
        raise CannotProbe("/v1/models lists no model; pass --model")
    client.model = model or card["id"]
    context = context or (card or {}).get("max_model_len") or (card or {}).get("context_length")
    if not isinstance(context, int) or context < 64:
        raise CannotProbe("the endpoint does not advertise its context window (max_model_len); pass --context N")
    rng = random.Random(seed)
    return ProbeSession(client, key_a, key_b, context, calibrate(client, key_a, rng), rng)


def probe_endpoint(url: str, key_a: str, key_b: str, model: str | None = None, context: int | None = None,
                   budget: int = DEFAULT_BUDGET, time_limit_s: float = DEFAULT_TIME_LIMIT_S, rounds: int = DEFAULT_ROUNDS,
                   seed: int | None = None, on_result: Callable[[CheckResult], None] | None = None,
                   transport: httpx.BaseTransport | None = None) -> ProbeReport:
    """Run every check against `url`; CannotProbe if the endpoint cannot be probed at all."""
    client = ProbeClient(url, budget, time_limit_s, transport)
    try:
        session = open_session(client, key_a, key_b, model, context, seed)
        report = ProbeReport(client.base, client.model, session.context, [mask(key_a), mask(key_b)])
        for name, check in checks(rounds):
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
