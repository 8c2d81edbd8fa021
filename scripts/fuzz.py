"""Hunt each broken engine with the disaggregation fuzzer, then check the safe preset stays clean (docs/disagg.md).

    python scripts/fuzz.py                          # 10 hunts per broken engine, 2,000 safe workloads
    python scripts/fuzz.py --seeds 20 --safe 5000   # more of both

A hunt counts the seeded workloads until the first one served wrongly (no shrinking, no replays); the safe
run totals every invariant. Exit status 0 when every hunt found its engine within `--limit` workloads and
the safe preset broke nothing, 1 otherwise, 2 on bad arguments.
"""

import argparse
import random
import statistics
import sys
import time
from collections import Counter

from minikv.attacks.fuzz import (
    first_failing, random_workload, run_workload, safe_for_fuzzing, smallest_failing, targets, tiny_random_model,
)
from minikv.cli import positive_int


def hunt(model, tok, seeds: int, limit: int, show: bool) -> bool:
    """Print workloads-until-first-problem for each broken engine; True when every seed found it."""
    all_found = True
    for target in targets():
        found = [first_failing(model, tok, target, seed, limit) for seed in range(seeds)]
        counts = [f[0] for f in found if f]
        missed = seeds - len(counts)
        all_found &= missed == 0
        spread = f"median {statistics.median(counts):g}, max {max(counts)}" if counts else "never found"
        print(f"{target.name}: found after {', '.join(str(f[0]) if f else '-' for f in found)} workload(s) "
              f"(seeds 0-{seeds - 1}; {spread}" + (f"; {missed} seed(s) found nothing in {limit})" if missed else ")"))
        if show and found[0]:
            print("  smallest failing workload of seed 0:", smallest_failing(model, tok, found[0][1], target))
    return all_found


def safe_run(model, tok, workloads: int, seed: int) -> bool:
    """Play `workloads` seeded workloads on the safe preset and print the totals; True when clean."""
    rng, switches, totals = random.Random(seed), safe_for_fuzzing(), Counter()
    started = time.perf_counter()
    for n in range(1, workloads + 1):
        workload = random_workload(rng)
        out = run_workload(model, tok, workload, switches)
        totals["requests"] += out.submitted
        totals["cancels"] += out.cancels
        totals["mid_transfer"] += out.cancels_mid_transfer
        totals["cross"] += out.cross_tenant_reads
        totals["cache_hits"] += out.cross_tenant_cache_hits
        totals["foreign"] += out.violations - out.cross_tenant_reads
        totals["leaked"] += out.leaked_pages
        totals["misdelivered"] += out.misdelivered
        totals["not_once"] += len(out.unanswered) + sum(1 for c in out.answers.values() if c != 1)
        if out.problems():
            totals["failing"] += 1
            if totals["failing"] == 1:
                print(f"first failing safe workload (number {n}): {out.problems()}\n  {workload}")
    t = totals
    print(f"safe preset: {workloads:,} workloads (seed {seed}), {t['requests']:,} requests, {t['cancels']:,} cancels "
          f"({t['mid_transfer']:,} with KV on the wire): {t['cross']} cross-tenant reads, {t['cache_hits']} cross-tenant cache hits, "
          f"{t['foreign']} other "
          f"foreign reads, {t['leaked']} leaked pages, {t['misdelivered']} misdelivered, {t['not_once']} requests "
          f"not answered exactly once; {time.perf_counter() - started:.0f} s")
    return t["failing"] == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive_int, default=10, help="hunts per broken engine (default 10)")
    parser.add_argument("--limit", type=positive_int, default=2000, help="workloads a hunt may draw (default 2000)")
    parser.add_argument("--safe", type=positive_int, default=2000, help="safe-preset workloads (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the safe run (default 0)")
    parser.add_argument("--show", action="store_true", help="print the smallest failing workload of each hunt")
    args = parser.parse_args()
    model, tok = tiny_random_model()
    found = hunt(model, tok, args.seeds, args.limit, args.show)
    clean = safe_run(model, tok, args.safe, args.seed)
    return 0 if found and clean else 1


if __name__ == "__main__":
    sys.exit(main())
