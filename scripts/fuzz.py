"""Run the disaggregation fuzzer for many examples and report the count.

    python scripts/fuzz.py --examples 2000            # safe preset: must find nothing
    python scripts/fuzz.py --preset vulnerable        # must find a cross-tenant read

Exit status 0 when the preset behaved as it should (safe: no violation in any example;
vulnerable: a violation found), 1 otherwise.
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
    args = parser.parse_args()
    model, tok = tiny_random_model()
    switches = safe_for_fuzzing() if args.preset == "safe" else SafetySwitches.preset("vulnerable")
    stats = {"examples": 0, "requests": 0, "violations": 0, "first": None}

    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(workloads())
    def explore(workload):
        out = run_workload(model, tok, workload, switches)
        stats["examples"] += 1
        stats["requests"] += out.submitted
        bad = out.violations > 0 or out.leaked_pages > 0 or set(out.answers.values()) != {1} \
            or len(out.answers) != out.submitted
        if bad:
            stats["violations"] += 1
            stats["first"] = stats["first"] or workload
            if args.preset == "vulnerable":
                raise AssertionError("found")  # stop at the first one

    started = time.perf_counter()
    try:
        explore()
    except AssertionError:
        pass
    elapsed = time.perf_counter() - started
    print(f"{args.preset}: {stats['examples']} examples, {stats['requests']} requests, "
          f"{stats['violations']} with a violation, in {elapsed:.0f} s")
    if args.preset == "safe":
        if stats["first"]:
            print("first failing workload:", stats["first"])
        return 0 if stats["violations"] == 0 else 1
    return 0 if stats["violations"] else 1


if __name__ == "__main__":
    sys.exit(main())
