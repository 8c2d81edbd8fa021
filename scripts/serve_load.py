"""Load on `minikv serve`: N concurrent clients (the official async client), requests/s and latency.

    python scripts/serve_load.py --clients 32 --requests 320          # starts its own server
    python scripts/serve_load.py --url http://127.0.0.1:8000 --key sk-... --clients 8
    python scripts/serve_load.py -- --disagg --preset safe --context-len 672          # flags for minikv serve
    python scripts/serve_load.py --fairness fcfs=http://127.0.0.1:8101 fair=http://127.0.0.1:8102

`--fairness` measures tenant B alone and beside tenant A's 32-client flood on servers already running
(started with `--api-key a=sk-fair-a --api-key b=sk-fair-b`), in interleaved rounds
(minikv/bench/fairness.py).

Each request is a note (`cNN: save pin 123456.`, about 24 prompt tokens) answered greedily (about
17 tokens). The load generator runs on the same machine as the server, so both share its cores.
"""

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import openai

from minikv.bench import fairness
from minikv.bench.report import p50_p99
from minikv.serve.launch import ServerProcess

MODEL = "tiny-llama"


async def client(api: openai.AsyncOpenAI, index: int, count: int, latencies: list[float], wrong: list[str],
                 errors: list[str]) -> None:
    for i in range(count):
        pin = f"{(index * 7919 + i * 104729) % 10**6:06d}"
        start = time.perf_counter()
        try:
            r = await api.completions.create(model=MODEL, prompt=f"c{index:02d}: save pin {pin}.\n", max_tokens=24)
        except openai.APIError as e:  # counted, never retried
            errors.append(type(e).__name__)
            continue
        latencies.append(time.perf_counter() - start)
        if r.choices[0].text != f"saved pin {pin}.":  # the model's own copying errors, counted, not hidden
            wrong.append(f"{pin} -> {r.choices[0].text!r}")


def rss_mib(pid: int) -> float:
    """Resident memory of a process and all its children (the distributed workers), in MiB."""
    total, todo = 0, [pid]
    while todo:
        proc = Path(f"/proc/{todo.pop()}")
        try:
            total += next(int(line.split()[1]) for line in (proc / "status").read_text().splitlines()
                          if line.startswith("VmRSS:"))
            todo += [int(c) for task in (proc / "task").iterdir() for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):  # it exited meanwhile
            pass
    return round(total / 1024, 1)


async def load(url: str, key: str, clients: int, requests: int) -> dict:
    latencies: list[float] = []
    wrong: list[str] = []
    errors: list[str] = []
    async with openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=key, max_retries=0, timeout=120) as api:
        await client(api, 99, 2, [], [], [])  # warm-up, not timed
        start = time.perf_counter()
        per_client = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]
        await asyncio.gather(*(client(api, i, n, latencies, wrong, errors) for i, n in enumerate(per_client)))
        wall = time.perf_counter() - start
    p50, p99 = p50_p99(latencies)
    return {"clients": clients, "requests": len(latencies), "wall_s": round(wall, 2),
            "requests_per_s": round(len(latencies) / wall, 1), "p50_ms": round(1e3 * p50, 1),
            "p99_ms": round(1e3 * p99, 1), "errors": len(errors), "wrong_replies": wrong, "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one on a free port)")
    parser.add_argument("--key", default="sk-load-0000", help="API key for --url")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=320, help="requests per run (default %(default)s)")
    parser.add_argument("--fairness", nargs="+", metavar="NAME=URL",
                        help="B alone and beside A's flood, on these servers")
    parser.add_argument("--rounds", type=int, default=3, help="--fairness rounds (default %(default)s)")
    parser.add_argument("--b-requests", type=int, default=10, help="--fairness: B's requests a phase")
    parser.add_argument("--plot", help="--fairness: save the picture here (PNG)")
    parser.add_argument("serve_args", nargs="*", help="after --: flags for the minikv serve it starts")
    args = parser.parse_args()
    if args.fairness:
        return fairness_main(args)
    server = None if args.url else ServerProcess(["--api-key", f"load={args.key}", *args.serve_args])
    try:
        for n in args.clients:
            row = asyncio.run(load(args.url or server.url, args.key, n, args.requests))
            print(json.dumps(row | ({"server_rss_mib": rss_mib(server.process.pid)} if server else {})), flush=True)
    finally:
        if server:
            server.stop()
    return 0


def fairness_main(args: argparse.Namespace) -> int:
    servers = dict(spec.partition("=")[::2] for spec in args.fairness)
    if not all(servers.values()):
        raise SystemExit("error: --fairness wants NAME=URL for each server")
    stats = fairness.summary(fairness.rounds(servers, args.rounds, args.b_requests))
    print(json.dumps({"fairness": stats, "load_average": [round(x, 2) for x in os.getloadavg()]}), flush=True)
    if args.plot:
        fairness.fairness_figure(stats).savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
