"""Run the disaggregation fuzzer for many examples and report the count.

    python scripts/fuzz.py --examples 2000            # safe preset: must find nothing
    python scripts/fuzz.py --preset vulnerable        # must find a cross-tenant read
    python scripts/fuzz.py --preset safe --disable cache_salt   # must find a cross-tenant cache hit

Prefix caching is on (the prefill node's default). Exit status 0 when the switches behaved as
they should (safe: no violation and no cross-tenant cache hit in any example; vulnerable, or
cache_salt off: one found), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time

from hypothesis import HealthCheck, given, settings

from minikv.disagg.fuzz import run_workload, safe_for_fuzzing, tiny_random_model, workloads
from minikv.disagg.switches import SafetySwitches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--preset", choices=["safe", "vulnerable"], default="safe")
    parser.add_argument("--disable", action="append", default=[], metavar="SWITCH", help="turn a switch off")
    args = parser.parse_args()
    model, tok = tiny_random_model()
    switches = safe_for_fuzzing() if args.preset == "safe" else SafetySwitches.preset("vulnerable")
    switches = switches.with_switches(disable=args.disable)
    expect_clean = args.preset == "safe" and not args.disable
    stats = {"examples": 0, "requests": 0, "violations": 0, "cache_hits": 0, "first": None}

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(workloads())
    def explore(workload):
        out = run_workload(model, tok, workload, switches)
        stats["examples"] += 1
        stats["requests"] += out.submitted
        stats["cache_hits"] += out.cross_tenant_cache_hits
        bad = out.violations > 0 or out.leaked_pages > 0 or set(out.answers.values()) != {1} \
            or len(out.answers) != out.submitted or out.cross_tenant_cache_hits > 0
        if bad:
            stats["violations"] += 1
            stats["first"] = stats["first"] or workload
            if not expect_clean:
                raise AssertionError("found")  # stop at the first one

    started = time.perf_counter()
    try:
        explore()
    except AssertionError:
        pass
    elapsed = time.perf_counter() - started
    off = f" without {', '.join(args.disable)}" if args.disable else ""
    print(f"{args.preset}{off}: {stats['examples']} examples, {stats['requests']} requests, "
          f"{stats['violations']} with a violation or a cross-tenant cache hit "
          f"({stats['cache_hits']} cross-tenant cache hits), in {elapsed:.0f} s")
    if expect_clean:
        if stats["first"]:
            print("first failing workload:", stats["first"])
        return 0 if stats["violations"] == 0 else 1
    return 0 if stats["violations"] else 1


if __name__ == "__main__":
    sys.exit(main())
