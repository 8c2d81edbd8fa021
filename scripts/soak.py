"""Soak test: push many requests through Engine and Cluster and print how much the process grew.

    python scripts/soak.py                      # 20,000 through Engine, 10,000 through Cluster
    python scripts/soak.py --engine 2000 --cluster 0 --event-log-limit 5000

After a warm-up a server's memory should stay flat however many requests pass. Only submit and run are
used, so the script measures any minikv checkout on PYTHONPATH, before and after a change.
"""

import argparse
import dataclasses
import gc
import sys
import time

from minikv import Cluster, ClusterConfig, Engine, EngineConfig, Request, SafetySwitches, load_model

WAVE = 32  # requests submitted before each run(): a busy server's batch
TENANTS = ("alice", "bob", "carol", "dave")


def rss_mb() -> float:
    """This process's resident set size now, in MB (Linux /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def log_options(config_cls, event_log: bool, limit: int | None) -> dict:
    """event_log, and event_log_limit where this checkout has it."""
    options = {"event_log": event_log}
    if limit is not None and "event_log_limit" in {f.name for f in dataclasses.fields(config_cls)}:
        options["event_log_limit"] = limit
    return options


def push(server, n: int, max_tokens: int) -> int:
    """Send n requests in waves; return how many were answered 200."""
    ok = 0
    for start in range(0, n, WAVE):
        for i in range(start, min(n, start + WAVE)):
            tenant = TENANTS[i % len(TENANTS)]
            server.submit(Request(f"{tenant}: save pin {i % 10000:04d}.\n", tenant, max_tokens))
        ok += sum(r.status == 200 for r in server.run())
    return ok


def soak(name: str, server, n: int, warmup: int, max_tokens: int) -> None:
    push(server, warmup, max_tokens)
    gc.collect()
    before, start = rss_mb(), time.perf_counter()
    ok = push(server, n, max_tokens)
    gc.collect()
    after = rss_mb()
    print(f"{name:8s} {n:6d} requests ({ok} answered 200) in {time.perf_counter() - start:6.1f} s: "
          f"RSS {before:7.1f} MB -> {after:7.1f} MB, growth {after - before:+6.1f} MB", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=int, default=20_000, help="requests through Engine (0: skip)")
    parser.add_argument("--cluster", type=int, default=10_000, help="requests through Cluster (0: skip)")
    parser.add_argument("--warmup", type=int, default=1_000, help="requests before the first RSS reading")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--event-log", action="store_true", help="keep the event log on (off by default, as a server runs)")
    parser.add_argument("--event-log-limit", type=int, default=None, help="with --event-log: keep about this many events")
    args = parser.parse_args(argv)
    if min(args.engine, args.cluster, args.warmup) < 0 or args.max_tokens < 1:
        print("error: request counts must be >= 0 and --max-tokens >= 1", file=sys.stderr)
        return 2
    model, tok = load_model(device="cpu")
    if args.engine:
        config = EngineConfig(num_pages=256, **log_options(EngineConfig, args.event_log, args.event_log_limit))
        soak("engine", Engine(model, tok, config), args.engine, args.warmup, args.max_tokens)
    if args.cluster:
        config = ClusterConfig(prefill_pages=64, decode_pages=256, **log_options(ClusterConfig, args.event_log, args.event_log_limit))
        soak("cluster", Cluster(model, tok, config, SafetySwitches.preset("safe")), args.cluster, args.warmup, args.max_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
