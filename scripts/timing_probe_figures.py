"""docs/benchmarks.md's timing-attack figures: random PINs recovered from burst times alone (the CPU clock).

    python scripts/timing_probe_figures.py                    # 10 random 4-digit PINs, 3 salted runs
    python scripts/timing_probe_figures.py --pins 20 --digits 3

Each PIN is a fresh `demo --scenario prefix-probe --preset vulnerable --oracle timing --alphabet digits`, each
salted run the same with `--preset safe`; one line per run, then the summary docs/benchmarks.md quotes, with
the load average before and after (other processes slow every burst alike; the test is on ranks).
"""

import argparse
import os
import random
import statistics

import torch

from minikv.attacks.cached_tokens import AFTER_SECRET, KNOWN_PREFIX
from minikv.attacks.scenarios import run_scenario
from minikv.attacks.timing import DIGITS
from minikv.attacks.workload import SECRET_ALPHABET
from minikv.cli import positive_int
from minikv.disagg.switches import SafetySwitches
from minikv.model.checkpoint import load_model


def guesses_per_round(fill: int, symbols: int) -> int:
    """len(page_guesses(fill, alphabet)) without listing them: k secret symbols, then the note's end."""
    return sum(symbols**k for k in range(fill + 1) if fill - k <= len(AFTER_SECRET))


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pins", type=positive_int, default=10, help="random PINs to recover (one seed each)")
    parser.add_argument("--digits", type=positive_int, default=4, help="digits per PIN")
    parser.add_argument("--salted", type=positive_int, default=3, help="runs with the safe preset (cache_salt on)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(device="cpu")
    print(f"before: {load()}; {os.cpu_count()} CPU cores")
    runs = []
    for seed in range(args.pins):
        rng = random.Random(seed)
        pin = "".join(rng.choice(DIGITS) for _ in range(args.digits))
        r = run_scenario("prefix-probe", model, tok, SafetySwitches.preset("vulnerable"), secret=pin, seed=seed,
                         oracle="timing", alphabet="digits")
        runs.append((pin, r))
        print(f"seed {seed}: PIN {pin} recovered {r.recovered!r} in {r.seconds:.1f} s, {r.cycles} cycles, "
              f"{r.probes:,} requests")
    ok = sum(r.recovered == pin for pin, r in runs)
    rounds = args.digits + 1  # one per digit, and the round where the note's '.' hits
    print(f"vulnerable: {ok}/{len(runs)} PINs recovered exactly; per character (of {args.digits}): median "
          f"{statistics.median(r.seconds for _, r in runs) / args.digits:.1f} s, "
          f"{statistics.median(r.probes for _, r in runs) / args.digits:,.0f} requests; "
          f"cycles per round: median {statistics.median(r.cycles / rounds for _, r in runs):.1f}")
    salted = [run_scenario("prefix-probe", model, tok, SafetySwitches.preset("safe"), secret=pin, seed=seed,
                           oracle="timing", alphabet="digits") for seed, (pin, _) in zip(range(args.salted), runs)]
    for r in salted:
        print(f"salted: recovered {r.recovered!r} in {r.seconds:.1f} s ({r.cycles} cycles), "
              f"cross-tenant cache hits {r.cross_tenant_cache_hits}")
    print(f"cache_salt: {sum(r.recovered == '' for r in salted)}/{len(salted)} runs recovered nothing; "
          f"cross-tenant cache hits {sum(r.cross_tenant_cache_hits for r in salted)}")
    print(f"after: {load()}")
    for page_size in (1, 2, 4):
        fill = page_size - len(KNOWN_PREFIX) % page_size
        print(f"page size {page_size}: the first round times {guesses_per_round(fill, len(DIGITS)):,} bursts per "
              f"cycle for digits, {guesses_per_round(fill, len(SECRET_ALPHABET)):,} for the full alphabet")


if __name__ == "__main__":
    main()
