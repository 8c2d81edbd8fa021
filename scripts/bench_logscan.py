"""Benchmark the gateway-log scanner: rows per second and peak memory on a 1,000,000-row log.

    python scripts/bench_logscan.py [--rows 1000000] [--path /tmp/minikv_bench_gateway.jsonl]

The log (seed 1, not committed) is generated once and reused; the scan runs in a fresh child process, so
its peak RSS is the scan's, and the child reports its memory before the scan as well.
"""

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path


def scan_and_measure(path: Path) -> dict:
    """Scan `path` in this process; return rows, seconds and memory high-water marks in MiB."""
    from minikv.logs.scan import scan_log

    before_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    start = time.perf_counter()
    result = scan_log(path)
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"rows": result.scanned, "seconds": seconds, "before_mib": before_mib, "peak_mib": peak_mib,
            "affected": len(result.affected), "flags": len(result.flags), "malformed": len(result.malformed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--path", type=Path, default=Path("/tmp/minikv_bench_gateway.jsonl"))
    parser.add_argument("--scan-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scan_only:
        print(json.dumps(scan_and_measure(args.path)))
        return

    from minikv.logs.gateway_log import write_gateway_log

    if not args.path.exists():
        print(f"writing {args.rows:,} rows to {args.path} ...", file=sys.stderr)
        write_gateway_log(args.path, rows=args.rows, seed=1)
    child = subprocess.run([sys.executable, __file__, "--scan-only", "--path", str(args.path)],
                           capture_output=True, text=True, check=True)
    m = json.loads(child.stdout)
    size_mib = args.path.stat().st_size / 2**20
    print(f"scan-logs: {m['rows']:,} rows ({size_mib:,.0f} MiB of JSON Lines) in {m['seconds']:.1f} s"
          f" = {m['rows'] / m['seconds']:,.0f} rows/s; peak RSS {m['peak_mib']:.0f} MiB"
          f" ({m['before_mib']:.0f} MiB before the scan started)"
          f" [Python {platform.python_version()}, {platform.machine()}]")
    print(f"found: {m['affected']:,} affected, {m['flags']:,} flagged, {m['malformed']:,} malformed", file=sys.stderr)


if __name__ == "__main__":
    main()
