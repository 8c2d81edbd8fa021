"""Running the probe: open a session on the endpoint, run the chosen checks in order, collect the report."""

from collections.abc import Callable
from functools import partial

import httpx

from minikv.probe.canary import check_canary
from minikv.probe.client import OutOfBudget, ProbeClient, mask
from minikv.probe.eviction import check_eviction
from minikv.probe.honesty import check_honesty
from minikv.probe.over_length import check_over_length
from minikv.probe.prefix_cache import check_prefix_cache
from minikv.probe.replies import CannotProbe
from minikv.probe.report import CHECKS, INCOMPLETE, CheckResult, Incomplete, ProbeOptions, ProbeReport
from minikv.probe.session import ProbeSession, open_session
from minikv.probe.token_gaps import check_token_gaps


def checks(options: ProbeOptions) -> list[tuple[str, Callable[[ProbeSession, CheckResult], None]]]:
    """(title, check) of the chosen checks: the canary first, while the pool holds little but key A's note."""
    run = {"canary": check_canary, "over-length": check_over_length, "honesty": check_honesty,
           "prefix-cache": partial(check_prefix_cache, rounds=options.rounds), "eviction": check_eviction,
           "token-gaps": check_token_gaps}
    return [(title, run[name]) for name, title in CHECKS.items() if name in options.checks]


def probe_endpoint(url: str, key_a: str, key_b: str, on_result: Callable[[CheckResult], None] | None = None,
                   transport: httpx.BaseTransport | None = None, **settings) -> ProbeReport:
    """Run the chosen checks against `url`; `settings` are ProbeOptions' fields (rounds=, seed=, ...).
    CannotProbe if the endpoint cannot be probed at all, or answers something the API does not allow."""
    options = ProbeOptions(**settings)
    client = ProbeClient(url, options.budget, options.time_limit_s, transport, options.salt_per_key)
    try:
        session = open_session(client, key_a, key_b, options)
        report = ProbeReport(client.base, client.model, session.context, [mask(key_a), mask(key_b)],
                             options.salt_per_key, not_run=[name for name in CHECKS if name not in options.checks])
        for name, check in checks(options):
            result = CheckResult(name)
            report.results.append(result)
            try:
                check(session, result)
            except Incomplete as e:  # a request not served, the budget or the time limit spent
                result.decide(INCOMPLETE, str(e))
            if on_result:
                on_result(result)
    except OutOfBudget as e:
        raise CannotProbe(str(e)) from None
    finally:
        client.close()
    report.requests_sent, report.quirks = client.sent, list(client.quirks)
    return report
