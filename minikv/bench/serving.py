"""`python -m minikv bench --serve`: `minikv serve` against vLLM over HTTP, on the benchmark's requests: texts
checked once, then paired rounds timed (docs/benchmarks.md)."""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial

import httpx
import openai

from minikv.bench.report import p50_p99
from minikv.bench.systems import BenchRequest, Completion, Run, paired_ratios

CLIENT_COUNTS = (1, 8, 32, 128)


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """`bench --serve` and its options, on the `bench` parser; bench's own command otherwise."""
    parser.add_argument("--serve", action="store_true", help="minikv serve and (if set up) vLLM over HTTP instead")
    parser.add_argument("--clients", default=",".join(map(str, CLIENT_COUNTS)), metavar="N,N,...",
                        help="--serve: concurrent clients (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="--serve: paired rounds (default %(default)s)")
    parser.add_argument("--num-pages", type=int, default=256, help="--serve: both pools, in 16-token pages (default %(default)s)")
    parser.add_argument("--context-len", type=int, default=1024, help="--serve: both context windows (default %(default)s)")
    parser.add_argument("--no-peer", action="store_true", help="--serve: minikv alone, even when vLLM is set up")
    bench = parser.get_default("func")
    parser.set_defaults(func=lambda args: run_serving_command(args) if args.serve else bench(args))


def async_client(url: str, key: str | None, **options) -> openai.AsyncOpenAI:
    """The official client for a server's /v1: no retries, 300 s for a reply."""
    return openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=key or "none", max_retries=0,
                              timeout=300.0, **options)


async def stream_one(client: openai.AsyncOpenAI, model: str,
                     request: BenchRequest) -> tuple[Completion, float | None, float | None]:
    """One streamed greedy completion: (completion, TTFT, inter-token latency). TTFT runs to the first chunk
    with text; the latency is the mean from there to the last chunk with choices: under load chunks come in
    bursts, so their gaps would not do. openai.APIError on an error status or an error event."""
    start, first, last, text, tokens = time.perf_counter(), None, None, [], 0
    stream = await client.completions.create(model=model, prompt=request.prompt, temperature=0,
                                             max_tokens=request.max_tokens, stream=True,
                                             stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices:
            last = time.perf_counter()
        piece = "".join(c.text or "" for c in chunk.choices)
        if piece:
            first = first or last
            text.append(piece)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    itl = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return Completion("".join(text), tokens), first - start if first is not None else None, itl


async def run_load(url: str, model: str, requests: Iterable[BenchRequest], clients: int, key: str | None = None) -> Run:
    """`clients` tasks take the requests in order from one queue (bearer `key`, if any), each its next as
    soon as its last is answered, until `requests` ends (it may be a generator)."""
    results: dict[int, tuple | None] = {}
    todo = enumerate(requests)

    async def client(api: openai.AsyncOpenAI) -> None:
        for i, request in todo:
            try:
                results[i] = await stream_one(api, model, request)
            except openai.APIError:
                results[i] = None

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    http = openai.DefaultAsyncHttpxClient(limits=limits)
    async with async_client(url, key, http_client=http) as api:
        start = time.perf_counter()
        await asyncio.gather(*(client(api) for _ in range(clients)))
        wall = time.perf_counter() - start
    ordered = [results[i] for i in range(len(results))]
    done = [r for r in ordered if r is not None]
    return Run([r[0] if r else None for r in ordered], [r[1] for r in done if r[1] is not None], wall,
               [r[2] for r in done if r[2] is not None])


def requests_for(workload: list, clients: int) -> list:
    """The workload repeated until there is a request per client (at least once)."""
    return workload * max(1, -(-clients // len(workload)))


LATENCIES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")  # per server and client count


@dataclass
class ServingReport:
    """Every load of every round, and the checks."""

    servers: list[str]
    clients: list[int]
    rounds: int
    command: str
    loads: dict[tuple[str, int], list[Run]] = field(default_factory=dict)
    load_avg: list[float] = field(default_factory=list)  # 1 minute, at each pairing
    mismatched: list[int] = field(default_factory=list)  # request indices whose text differs between servers

    def row(self, server: str, clients: int) -> dict:
        loads = self.loads[(server, clients)]
        ttft = p50_p99([t for x in loads for t in x.ttft_s])
        itl = p50_p99([t for x in loads for t in x.itl_s])
        return {"tokens_per_s": statistics.median(x.tokens_per_s for x in loads),
                **{key: None if s is None else 1e3 * s for key, s in zip(LATENCIES, (*ttft, *itl))},
                "errors": sum(x.completions.count(None) for x in loads)}

    def ratios(self) -> dict[int, list[float]]:
        """Per client count, the first server's tokens/s over the second's, one ratio per pairing."""
        if len(self.servers) != 2 or not self.loads:
            return {}
        return {c: paired_ratios(*(self.loads[(s, c)] for s in self.servers)) for c in self.clients}

    def to_json(self) -> dict:
        ratios = {c: {"median": statistics.median(r), "min": min(r), "max": max(r)} for c, r in self.ratios().items()}
        return {"servers": self.servers, "rounds": self.rounds,
                "results": {f"{s}@{c}": self.row(s, c) for s in self.servers for c in self.clients}, "ratios": ratios,
                "load_avg_1min": {"min": min(self.load_avg), "max": max(self.load_avg)}, "outputs_equal": not self.mismatched}

    def table(self) -> str:
        j = self.to_json()
        lines = [f"`{self.command}`: {j['rounds']} paired rounds, load average (1 min) {j['load_avg_1min']['min']:.1f}-"
                 f"{j['load_avg_1min']['max']:.1f}; outputs equal between the servers: "
                 f"{'yes' if j['outputs_equal'] else f'no (requests {self.mismatched})'}.", "",
                 "| clients | server | tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p99 (ms) | errors |",
                 "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for c in self.clients:
            for s in self.servers:
                r = j["results"][f"{s}@{c}"]
                times = " | ".join("-" if r[key] is None else f"{r[key]:,.1f}" for key in LATENCIES)
                lines.append(f"| {c} | {s} | {r['tokens_per_s']:,.0f} | {times} | {r['errors']} |")
            if c in j["ratios"]:
                q = j["ratios"][c]
                lines.append(f"| {c} | **{' / '.join(self.servers)}** | **{q['median']:.2f}x** ({q['min']:.2f}-{q['max']:.2f}) "
                             "| | | | | |")
        return "\n".join(lines)


def run_serving(urls: dict[str, tuple[str, str]], workload: list[BenchRequest], clients: list[int], rounds: int,
                command: str, say=print) -> ServingReport:
    """The checked pass, then the paired rounds. urls: server -> (url, model)."""
    report = ServingReport(list(urls), clients, rounds, command)
    checked = {}
    for name, (url, model) in urls.items():  # a warm-up, then the pass whose texts are compared
        asyncio.run(run_load(url, model, workload[:2], 2))
        checked[name] = asyncio.run(run_load(url, model, workload, len(workload))).texts
    reference = checked[report.servers[0]]
    report.mismatched = sorted({i for texts in checked.values() for i, t in enumerate(texts) if t is None or t != reference[i]})
    if report.mismatched:
        return report
    for pairing in range(rounds * len(clients)):
        c = clients[pairing % len(clients)]
        report.load_avg.append(os.getloadavg()[0])
        for name in report.servers if pairing % 2 == 0 else report.servers[::-1]:
            load = asyncio.run(run_load(*urls[name], requests_for(workload, c), c))
            wrong = {i % len(workload) for i, (t, want) in enumerate(zip(load.texts, requests_for(reference, c)))
                     if t is not None and t != want}
            report.mismatched = sorted(set(report.mismatched) | wrong)  # failures count as errors
            report.loads.setdefault((name, c), []).append(load)
        say(f"round {pairing // len(clients) + 1}/{rounds}, {c} clients: " + ", ".join(
            f"{s} {report.loads[(s, c)][-1].tokens_per_s:,.0f} tokens/s" for s in report.servers)
            + f" (load average {report.load_avg[-1]:.1f})")
    return report


to_stderr = partial(print, file=sys.stderr, flush=True)


def run_serving_command(args: argparse.Namespace) -> int:
    """Start minikv serve (and vLLM when it is set up), run, print the table or JSON; 1 if outputs differ."""
    from minikv.bench.benchmark import bench_workload
    from minikv.bench.plot import plot_path_problem, save_figure
    from minikv.serve.launch import ServerProcess, ServerStartError
    from minikv.serve.peer import PeerServer
    from minikv.serve.peer_venv import PeerError, installed

    try:
        clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        raise ValueError(f"--clients {args.clients}: give whole numbers separated by commas, e.g. 1,8,32") from None
    if min(clients) < 1 or args.rounds < 1 or args.num_pages < 2 or args.num_pages % 2 or args.context_len < 2:
        raise ValueError("--clients, --rounds must be >= 1, --context-len >= 2 and --num-pages even (vLLM's CPU blocks "
                       "hold 32 tokens)")
    if args.plot and (problem := plot_path_problem(args.plot)):
        raise ValueError(f"--plot {args.plot}: {problem}")
    pool = ["--num-pages", str(args.num_pages), "--context-len", str(args.context_len), "--threads", str(args.threads)]
    if args.max_batch is not None:  # minikv's only: vLLM keeps its own max_num_seqs
        pool += ["--max-batch", str(args.max_batch)]
    with ExitStack() as stack:
        try:
            minikv = stack.enter_context(ServerProcess([*pool, *(["--model", args.model] if args.model else [])]))
            urls = {"minikv": (minikv.url, minikv.health()["model"])}
            if installed("vllm") and not args.no_peer:
                to_stderr("starting vLLM (a few minutes) ...")
                vllm = stack.enter_context(PeerServer(model_dir=args.model, num_pages=args.num_pages,
                                                      context_len=args.context_len))
                urls["vllm"] = (vllm.url, vllm.model)
            else:
                to_stderr("vLLM is not set up (python -m minikv peer setup vllm): minikv alone")
        except (ServerStartError, PeerError) as e:
            raise ValueError(str(e).splitlines()[0][:300]) from None
        command = (f"python -m minikv bench --serve --clients {args.clients} --rounds {args.rounds} "
                   f"--requests {args.requests} --num-pages {args.num_pages} --context-len {args.context_len}"
                   + (f" --max-batch {args.max_batch}" if args.max_batch is not None else ""))
        report = run_serving(urls, bench_workload(args.requests, args.seed), clients, args.rounds, command, to_stderr)
    if report.mismatched and not report.loads:
        print(f"the servers' texts differ on requests {report.mismatched}: nothing was timed", file=sys.stderr)
        return 1
    print(json.dumps(report.to_json(), indent=2) if args.json else report.table())
    if args.plot:
        save_figure(serving_figure(report), args.plot)
    return 0 if not report.mismatched else 1


def serving_figure(report: ServingReport):
    """Tokens/s and TTFT p99 against concurrent clients, one line per server; the ratio with its range."""
    from matplotlib.figure import Figure

    ratios = report.to_json()["ratios"]
    fig = Figure(figsize=(13 if ratios else 9, 3.4), layout="tight")
    axes = fig.subplots(1, 3 if ratios else 2)
    for name in report.servers:
        rows = [report.row(name, c) for c in report.clients]
        for ax, key in zip(axes, ("tokens_per_s", "ttft_p99_ms")):
            ax.plot(report.clients, [r[key] or 0 for r in rows], marker="o", label=name)
    if ratios:
        mid = [ratios[c]["median"] for c in report.clients]
        spread = [[m - ratios[c]["min"] for c, m in zip(report.clients, mid)],
                  [ratios[c]["max"] - m for c, m in zip(report.clients, mid)]]
        axes[2].errorbar(report.clients, mid, yerr=spread, marker="o", capsize=4, color="black",
                         label=f"{' / '.join(report.servers)}: median, min-max")
        axes[2].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    for ax, label in zip(axes, ("tokens/s (median of the rounds)", "TTFT p99 (ms)", "tokens/s ratio, paired rounds")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(report.clients, [str(c) for c in report.clients])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"{report.rounds} paired rounds over HTTP, same model, pool and window; "
                 f"load average {min(report.load_avg):.1f}-{max(report.load_avg):.1f}", fontsize=9)
    return fig
