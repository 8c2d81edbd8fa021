"""Property-based fuzzing of the disaggregated pair: safe means no cross-tenant read, ever."""

from __future__ import annotations

from hypothesis import HealthCheck, find, given, settings

from minikv.disagg.fuzz import run_workload, safe_for_fuzzing, tiny_random_model, workloads
from minikv.disagg.switches import SafetySwitches

MODEL, TOK = tiny_random_model()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(workloads())
def test_safe_preset_never_reads_across_tenants(workload):
    """Random arrivals, over-length prompts, cancels and late transfers: zero cross reads,
    zero pages left owned, every request answered exactly once."""
    out = run_workload(MODEL, TOK, workload, safe_for_fuzzing())
    assert out.cross_tenant_reads == 0 and out.violations == 0
    assert out.leaked_pages == 0
    assert len(out.answers) == out.submitted and set(out.answers.values()) == {1}


def test_the_same_fuzzer_finds_the_leak_in_the_vulnerable_preset():
    """The check can fail: against the engine before the fix, the fuzzer finds a cross read."""
    vulnerable = SafetySwitches.preset("vulnerable")
    found = find(workloads(), lambda w: run_workload(MODEL, TOK, w, vulnerable).violations > 0,
                 settings=settings(max_examples=500, deadline=None, database=None, derandomize=True))
    assert run_workload(MODEL, TOK, found, vulnerable).violations > 0
