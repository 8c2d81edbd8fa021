"""Where a served token's time goes in `minikv serve`: `python scripts/profile_serve.py [--clients 32,128]`.

Closed-loop clients stream the benchmark's requests to `minikv serve SERVE_ARGS` (its HTTP process and its
engine core, a process of its own since issue #33), read three ways: /proc CPU time
per thread, `py-spy record --idle` and `--gil` (`pip install py-spy`), each sample by RULES (docs/benchmarks.md).

`--split` measures instead the engine core on a thread of the HTTP process (one interpreter lock for both,
as `ServerThread` runs it) against the core in a process of its own (`minikv serve`), in alternating rounds,
and writes data/serve_split.json (notebook 11 draws it) and its picture, docs/serve_split.png (docs/architecture.md).

`--phases` counts the engine's steps by phase (prefill or decode) and the requests in each, over `--requests`
distinct prompts from closed-loop clients (the server on a thread here, `Scheduler.schedule` wrapped to count).
"""

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

from minikv.bench.benchmark import bench_workload
from minikv.bench.plot import SPLIT_RECORD, split_figure
from minikv.bench.report import describe_machine
from minikv.bench.serving import requests_for, run_load
from minikv.bench.systems import BenchRequest, Run, serve_all
from minikv.serve.launch import LocalServer, ServerProcess

RULES = {  # part -> substrings of a frame; the deepest frame that matches one decides, the first part here wins
    "model: attention": ("minikv/attention/", "minikv/engine/paged_step.py"),
    "model: layers": ("minikv/model/llama.py",),
    "model runner: batch tensors, argmax": ("minikv/engine/model_runner.py",),
    "scheduling, pages, prefix cache": ("minikv/engine/scheduler.py", "minikv/engine/page_pool.py",
                                        "minikv/engine/prefix_cache.py"),
    "ownership audit": ("minikv/engine/audit.py",),
    "event log": ("minikv/engine/events.py",),
    "detokenize": ("decode (minikv/model/tokenizer.py",),
    "tokenize": ("encode_prompt (minikv/model/tokenizer.py", "encode_text (minikv/model/tokenizer.py"),
    "engine core loop and its reader: streaming, stops, stats": ("minikv/serve/core.py", "minikv/serve/engine_loop.py"),
    "engine: submit, finish, responses": ("minikv/engine/engine.py", "minikv/engine/front_door.py",
                                          "minikv/engine/request.py"),
    "event loop: waiting for sockets (or for the GIL after them)": ("select (selectors.py",),
    "asyncio machinery": ("asyncio/",),
    "HTTP: uvicorn, h11, httptools": ("uvicorn/", "h11/", "httptools"),
    "framework: starlette, fastapi, anyio": ("starlette/", "fastapi/", "anyio/"),
    "handlers: minikv/serve/app.py, schemas": ("minikv/serve/app.py", "minikv/serve/schemas.py"),
    "pydantic validation": ("pydantic",),
    "JSON": ("json/",),
    "gateway log": ("minikv/serve/gateway.py",),
}
IDLE_ENGINE = "CoreLoop.take_commands (minikv/serve/core.py"  # deepest minikv frame: waiting for the inbox
HAND_OFF = "call_soon_threadsafe"  # the engine thread posting text to the event loop (it writes to its self-pipe)
THREADS = {"minikv-engine-core": "engine thread", "minikv-core-reader": "core reader thread",
           "MainThread": "event loop (main thread)"}  # by Python name
CORE = "engine core process: "
CORE_THREADS = {"MainThread": CORE + "its loop", "QueueFeederThread": CORE + "queue feeder"}  # the core's


def part(frames: list[str]) -> str:
    if any(HAND_OFF in frame for frame in frames):
        return "engine loop: hand-off to the event loop (call_soon_threadsafe)"
    for frame in reversed(frames):  # from the leaf up
        if frame.startswith(IDLE_ENGINE):
            return "engine: waiting for requests"
        for name, needles in RULES.items():
            if any(needle in frame for needle in needles):
                return name
    return "other: " + (frames[-1].split(" (")[0] if frames else "?")


def read_raw(path: Path, labels: dict[str, str] = THREADS) -> dict[str, Counter]:
    """py-spy's raw (collapsed) output -> {thread name: Counter(part -> samples)}."""
    threads: dict[str, Counter] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        head, *frames = stack.split(";")
        thread = next((ours for name, ours in labels.items() if name in head), head.split(": ", 1)[-1])
        threads.setdefault(thread, Counter())[part(frames)] += int(count)
    return threads


def spy(pid: int, seconds: int, out: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "--threads", mode, "--format", "raw", "-r", "100", "-d", str(seconds),
                             "-o", str(out), "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def closed_loop(workload: list[BenchRequest], stop: threading.Event) -> Iterator[BenchRequest]:
    """The workload over and over until `stop` is set: run_load's clients each send the next request as soon as
    their last one ends."""
    for request in itertools.cycle(workload):
        if stop.is_set():
            return
        yield request


def thread_names(pid: int, labels: dict[str, str] = THREADS) -> dict[int, str]:
    """Native thread id -> our name for it, from `py-spy dump` ("Thread 5869 (idle): "minikv-engine-loop"")."""
    dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True).stdout
    return {int(line.split()[1]): labels.get(line.split('"')[1], "other threads")
            for line in dump.splitlines() if line.startswith("Thread ") and '"' in line}


def cpu_seconds(pid: int, names: dict[int, str]) -> Counter:
    """CPU time (user + system) of each thread of `pid` so far, by name, from /proc."""
    found: Counter = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        found[names.get(int(task.name), "other threads")] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def measure(server: ServerProcess, clients: int, seconds: int, mode: str | None, folder: Path) -> tuple[Run, dict]:
    """The load's run for `seconds` (and the ramp around them), both processes sampled by py-spy in `mode`;
    unsampled: CPU seconds per thread, and the core's steps."""
    until, out = threading.Event(), folder / f"{clients}{mode}.txt"
    core_out = folder / f"{clients}{mode}-core.txt"
    load = run_load(server.url, "tiny-llama", closed_loop(bench_workload(32, 0), until), clients)
    result: list[Run] = []
    worker = threading.Thread(target=lambda: result.append(asyncio.run(load)))
    worker.start()
    time.sleep(2)  # the load is up
    health = server.health()
    core, steps = health["core"]["pid"], health["steps"]  # the engine core's process, its steps so far
    names, core_names = thread_names(server.process.pid), thread_names(core, CORE_THREADS)
    before, client_before, start = cpu_seconds(server.process.pid, names), sum(os.times()[:2]), time.perf_counter()
    before += cpu_seconds(core, core_names)
    if mode:
        for spying in [spy(server.process.pid, seconds, out, mode), spy(core, seconds, core_out, mode)]:
            spying.wait()
    else:
        time.sleep(seconds)
    cpu = cpu_seconds(server.process.pid, names) + cpu_seconds(core, core_names) - before
    cpu["steps"] = server.health()["steps"] - steps
    cpu["the clients (this process)"] = sum(os.times()[:2]) - client_before
    cpu["wall"] = time.perf_counter() - start
    until.set()
    worker.join()
    return result[0], read_raw(out) | read_raw(core_out, CORE_THREADS) if mode else cpu


def engine_alone(serve_args: list[str], clients: int) -> tuple[float, float]:
    """Tokens/s and CPU seconds per token of the server's engine in this process, every request at once."""
    from minikv.model.checkpoint import load_model
    from minikv.engine.config import EngineConfig
    from minikv.engine.engine import Engine
    from minikv.serve.flags import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(serve_args)
    model, tokenizer = load_model(device="cpu")
    engine = Engine(model, tokenizer, EngineConfig(num_pages=args.num_pages, event_log=False,
                                                   **({"context_len": args.context_len} if args.context_len else {})))
    cpu = time.thread_time()
    run = serve_all(engine, requests_for(bench_workload(32, 0), clients))
    return run.tokens_per_s, (time.thread_time() - cpu) / run.tokens


def table(threads: dict[str, Counter], seconds: int, tokens_per_s: float) -> list[str]:
    lines = []
    for thread, parts in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(parts.values())
        for name, n in parts.most_common():
            if n / total >= 0.01:
                share = n / (seconds * 100)  # of the wall time
                lines.append(f"| {thread} | {name} | {share:.0%} | {1e3 * share / tokens_per_s:.3f} |")
    return lines


ON_A_THREAD = """import sys, threading, torch
from minikv.model.checkpoint import load_model
from minikv.serve.launch import ServerThread
torch.set_num_threads(1)  # as minikv serve's --threads 1
server = ServerThread(sys.argv[2:], *load_model(device="cpu"), port=int(sys.argv[1]))
print("admin key:", server.admin_key, flush=True)
threading.Event().wait()  # until SIGTERM
"""


class CoreOnAThread(ServerProcess):
    """`minikv serve ARGS` with its engine core on a thread of the HTTP process (`ServerThread`), run in a
    process of its own so that the clients here do not share its interpreter lock."""

    def __init__(self, args: list[str]) -> None:
        LocalServer.__init__(self, None)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        self.start([sys.executable, "-c", ON_A_THREAD, str(self.port), *args], env, tempfile.TemporaryFile(mode="w+"))
        while "admin key:" not in self.output():  # printed right after /health first answers
            time.sleep(0.1)
        self.admin_key = self.output().split("admin key:")[1].split()[0]


def split_round(server: ServerProcess, clients: int, requests: int) -> dict:
    """`requests` of the benchmark's workload through `clients` closed-loop clients: the tokens, the wall
    time, and the CPU seconds (from /proc, unsampled) of the engine core, of the rest of the server (the
    HTTP side) and of the clients (this process)."""
    core = server.health()["core"]
    processes = {pid: thread_names(pid) for pid in {server.process.pid, core["pid"]}}

    def cpu() -> Counter:
        spent = Counter({"clients": sum(os.times()[:2])})
        for pid, names in processes.items():
            for thread, seconds in cpu_seconds(pid, names).items():
                spent["engine_core" if pid == core["pid"] and (core["runs_on"] == "process" or
                                                              thread == "engine thread") else "http"] += seconds
        return spent

    before = cpu()
    run = asyncio.run(run_load(server.url, "tiny-llama", requests_for(bench_workload(32, 0), requests), clients))
    spent = cpu() - before
    assert None not in run.completions, "a request failed"
    return {"core": core["runs_on"], "tokens": run.tokens, "wall_s": round(run.wall_s, 3),
            **{f"{part}_cpu_s": round(spent[part], 3) for part in ("engine_core", "http", "clients")},
            "load_average": round(os.getloadavg()[0], 2)}


def split(serve_args: list[str], clients: list[int], rounds: int, requests: int) -> dict:
    """Alternating rounds (ABBA) over both servers, each warmed up first, both up the whole time."""
    with CoreOnAThread(serve_args) as on_thread, ServerProcess(serve_args) as on_process:
        servers = [on_thread, on_process]
        for server in servers:
            split_round(server, max(clients), max(clients))  # warm-up
        measured = {n: [split_round(servers[(i + i // 2) % 2], n, requests) for i in range(2 * rounds)]
                    for n in clients}
    return {"command": f"python scripts/profile_serve.py --split --clients {','.join(map(str, clients))} "
                       f"--rounds {rounds} --requests {requests} -- {' '.join(serve_args)}",
            "machine": describe_machine(torch.device("cpu"))[1], "date": time.strftime("%Y-%m-%d"),
            "cores": os.cpu_count(), "rounds": measured}


def phases(serve_args: list[str], clients: list[int], requests: int) -> None:
    """Steps by phase and requests a step under closed-loop clients on distinct prompts."""
    from minikv.engine.scheduler import Scheduler
    from minikv.model.checkpoint import load_model
    from minikv.serve.launch import ServerThread

    steps, seqs = Counter(), Counter()
    schedule = Scheduler.schedule

    def counted(self: Scheduler):
        batch = schedule(self)
        if batch is not None:
            steps[batch.phase] += 1
            seqs[batch.phase] += len(batch.seqs)
        return batch

    Scheduler.schedule = counted  # this process only: the server runs on a thread here
    with ServerThread(serve_args, *load_model(device="cpu")) as server:
        for n in clients:
            steps.clear()
            seqs.clear()
            run = asyncio.run(run_load(server.url, "tiny-llama", bench_workload(requests, 0), n))
            print(f"{n} clients, {requests} distinct prompts: " + ", ".join(
                f"{steps[p]} {p} steps of {seqs[p] / steps[p]:.1f} requests" for p in sorted(steps))
                + f"; {run.tokens / sum(steps.values()):.1f} output tokens a step", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="32,128")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("serve_args", nargs="*", default=["--num-pages", "2048", "--context-len", "2048"])
    parser.add_argument("--split", action="store_true", help="the core on a thread against in a process")
    parser.add_argument("--phases", action="store_true", help="the engine's steps by phase")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--out", type=Path, default=SPLIT_RECORD)
    parser.add_argument("--figure", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "serve_split.png")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the server's --threads 1
    if args.phases:
        phases(args.serve_args, [int(n) for n in args.clients.split(",")], args.requests)
        return
    if args.split:
        record = split(args.serve_args, [int(n) for n in args.clients.split(",")], args.rounds, args.requests)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        split_figure(record).savefig(args.figure, dpi=100)
        print(json.dumps(record, indent=1))
        return
    folder = Path(tempfile.mkdtemp(prefix="profile_serve_"))
    failed = 0
    with ServerProcess(args.serve_args) as server:
        asyncio.run(run_load(server.url, "tiny-llama", bench_workload(32, 0), 32))  # warm-up
        for clients in map(int, args.clients.split(",")):
            alone, alone_cpu = engine_alone(args.serve_args, clients)
            bare, cpu = measure(server, clients, args.seconds, None, folder)
            load_bare, wall, steps = os.getloadavg()[0], cpu.pop("wall"), cpu.pop("steps")
            sampled, idle = measure(server, clients, args.seconds, "--idle", folder)
            gil_run, gil = measure(server, clients, args.seconds, "--gil", folder)
            failed += sum(run.completions.count(None) for run in (bare, sampled, gil_run))
            http_gil = [sum(c.values()) for thread, c in gil.items() if not thread.startswith(CORE)]
            held = sum(http_gil) / (args.seconds * 100)
            print(f"\n### {clients} clients, `minikv serve {' '.join(args.serve_args)}`\n")
            print(f"The same engine in one process, no HTTP, the same requests: {alone:,.0f} tokens/s, "
                  f"{1e3 * alone_cpu:.2f} ms of CPU per token. Over HTTP: "
                  f"{bare.tokens_per_s:,.0f} tokens/s without the profiler (load average {load_bare:.1f}), "
                  f"{sampled.tokens_per_s:,.0f} with it "
                  f"(load average {os.getloadavg()[0]:.1f}); the HTTP process's GIL is held {held:.0%} of "
                  f"the wall time. The core took {steps / wall:.0f} steps a second, {1e3 * wall / steps:.1f} "
                  f"ms each, about {bare.tokens_per_s * wall / steps:.1f} tokens a step.\n")
            print("CPU time while unsampled (/proc), per token served: " + ", ".join(
                f"{name} {1e3 * s / (bare.tokens_per_s * wall):.2f} ms ({s / wall:.0%} of a core)" for name, s in cpu.most_common()) + ".\n")
            print("| thread | part | share of wall time | ms per token |\n| --- | --- | ---: | ---: |")
            print("\n".join(table(idle, args.seconds, sampled.tokens_per_s)))
            print("\n| GIL held by | part | share of wall time | ms per token |\n| --- | --- | ---: | ---: |")
            print("\n".join(table(gil, args.seconds, sampled.tokens_per_s)), flush=True)
    print(f"\nfailed requests: {failed} (py-spy's raw samples: {folder})")


if __name__ == "__main__":
    main()
