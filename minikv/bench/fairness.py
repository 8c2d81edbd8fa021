"""Does one tenant's flood starve another? Tenant B's time to first token alone and beside tenant A's 32
looping clients (a process of their own), on running `minikv serve` servers (docs/serve.md, "Fairness")."""

import asyncio
import json
import multiprocessing
import statistics
import time
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import openai

from minikv.bench.serving import async_client, stream_one
from minikv.bench.systems import BenchRequest

KEYS = {"a": "sk-fair-a", "b": "sk-fair-b"}
SERVE_ARGS = [f"--api-key={t}={k}" for t, k in KEYS.items()]  # what each server must be started with
MODEL = "tiny-llama"
FLOOD_CLIENTS = 32
FLOOD_PROMPT_CHARS = 900
FLOOD_WARMUP_S = 2.0  # A's queue fills before B is timed


@dataclass
class Phase:
    """One server's phase of one round: B's times to first token, and what A completed meanwhile."""

    server: str
    flood: bool
    round: int
    b_ttft_s: list[float] = field(default_factory=list)
    a_completed: int = 0
    a_tokens: int = 0
    wall_s: float = 0.0

    def row(self) -> dict:
        return {"server": self.server, "phase": "flood" if self.flood else "alone", "round": self.round,
                "b_ttft_ms": [round(1e3 * t, 1) for t in self.b_ttft_s], "a_completed": self.a_completed,
                "a_tokens_per_s": round(self.a_tokens / self.wall_s, 1) if self.flood else None}


def flood_prompt(client: int, i: int) -> str:
    head = f"a{client:02d}-{i:05d}: summarise "
    return head + ("the quarterly report and the budget review " * 30)[: FLOOD_PROMPT_CHARS - len(head)]


async def b_ttft(api: openai.AsyncOpenAI, i: int) -> float:
    """One streamed request of B's: seconds to its first text."""
    _, ttft, _ = await stream_one(api, MODEL, BenchRequest(f"b: save pin {i:06d}.\n", 8))
    assert ttft is not None, "B's reply had no text"
    return ttft


async def a_client(api: openai.AsyncOpenAI, client: int, done: Synchronized, tokens: Synchronized) -> None:
    """One of A's clients: a prompt, its reply, the next; counts what A completed."""
    i = 0
    while True:
        r = await api.completions.create(model=MODEL, prompt=flood_prompt(client, i), max_tokens=16)
        with done.get_lock():
            done.value, tokens.value = done.value + 1, tokens.value + r.usage.completion_tokens
        i += 1


async def a_flood(url: str, ready: Event, stop: Event, done: Synchronized, tokens: Synchronized) -> None:
    """A's clients, counting into `done` and `tokens`; `ready` once they run, until `stop` is set."""
    async with async_client(url, KEYS["a"]) as api:
        flooders = [asyncio.create_task(a_client(api, c, done, tokens)) for c in range(FLOOD_CLIENTS)]
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        for task in flooders:
            task.cancel()
        await asyncio.gather(*flooders, return_exceptions=True)


def flood_process(url: str, ready: Event, stop: Event, done: Synchronized, tokens: Synchronized) -> None:
    """A's 32 clients until `stop` is set (the flood's own process)."""
    asyncio.run(a_flood(url, ready, stop, done, tokens))


async def b_phase(url: str, phase: Phase, b_requests: int, counts: tuple[Synchronized, Synchronized]) -> None:
    """B's `b_requests`, one after another; what A completed meanwhile (from `counts`)."""
    async with async_client(url, KEYS["b"]) as b_api:
        await b_ttft(b_api, -1)  # not timed: the connection is opened
        await asyncio.sleep(FLOOD_WARMUP_S if phase.flood else 0)
        start, warmup = time.perf_counter(), tuple(c.value for c in counts)
        for i in range(b_requests):
            phase.b_ttft_s.append(await b_ttft(b_api, phase.round * 1000 + i))
        phase.wall_s = time.perf_counter() - start
        phase.a_completed, phase.a_tokens = (c.value - w for c, w in zip(counts, warmup))


def run_phase(server: str, url: str, flood: bool, round_: int, b_requests: int) -> Phase:
    """B alone, or beside A's flood (started in its own process first, stopped when B is done)."""
    phase, mp = Phase(server, flood, round_), multiprocessing.get_context("spawn")
    ready, stop, counts = mp.Event(), mp.Event(), (mp.Value("q", 0), mp.Value("q", 0))
    flooder = mp.Process(target=flood_process, args=(url, ready, stop, *counts), daemon=True)
    if flood:
        flooder.start()
        assert ready.wait(60), "A's flood did not start"
    try:
        asyncio.run(b_phase(url, phase, b_requests, counts))
    finally:
        stop.set()
        if flood:
            flooder.join(30)
    return phase


def rounds(servers: dict[str, str], count: int, b_requests: int) -> list[Phase]:
    """`count` rounds; in each, every server in turn, B alone and B beside the flood. Odd rounds run both
    ways reversed (the servers from the last, the flood before B alone), so neither order favours one."""
    phases = []
    for r in range(count):
        order = list(servers.items())[:: -1 if r % 2 else 1]
        for name, url in order:
            for flood in ((True, False) if r % 2 else (False, True)):
                phases.append(run_phase(name, url, flood, r, b_requests))
                print(json.dumps(phases[-1].row()), flush=True)
    return phases


def summary(phases: list[Phase]) -> dict[str, dict]:
    """Per server: B's median and p90 time to first token alone and beside the flood (ms), their ratio, and
    A's throughput during the flood."""
    out = {}
    for name in dict.fromkeys(p.server for p in phases):
        stats = {}
        for flood, label in ((False, "alone"), (True, "flood")):
            ttft = [t for p in phases if p.server == name and p.flood == flood for t in p.b_ttft_s]
            p90 = statistics.quantiles(ttft, n=10, method="inclusive")[8] if len(ttft) > 1 else ttft[0]
            stats[label] = {"median_ms": round(1e3 * statistics.median(ttft), 1),
                            "p90_ms": round(1e3 * p90, 1)}
        flooded = [p for p in phases if p.server == name and p.flood]
        stats["flood_over_alone"] = round(stats["flood"]["median_ms"] / stats["alone"]["median_ms"], 2)
        wall = sum(p.wall_s for p in flooded)
        stats["a_tokens_per_s"] = round(sum(p.a_tokens for p in flooded) / wall, 1)
        stats["a_requests_per_s"] = round(sum(p.a_completed for p in flooded) / wall, 2)
        out[name] = stats
    return out


def fairness_figure(stats: dict[str, dict]):
    """B's median time to first token (p90 whisker) alone and beside A's flood, per server, log scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), layout="tight")
    ax = fig.subplots()
    names, width = list(stats), 0.38
    for k, (label, colour) in enumerate((("alone", "#9e9e9e"), ("flood", "#d62728"))):
        med = [stats[n][label]["median_ms"] for n in names]
        p90 = [stats[n][label]["p90_ms"] for n in names]
        xs = [x + (k - 0.5) * width for x in range(len(names))]
        ax.bar(xs, med, width, color=colour, label=f"B {label}" if label == "alone" else "B beside A's flood",
               yerr=[[0] * len(med), [h - m for h, m in zip(p90, med)]], capsize=3)
        for x, m in zip(xs, med):
            ax.text(x, m, f"{m:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("B's time to first token, ms (median; p90 whisker)")
    ax.set_title(f"tenant B beside tenant A's {FLOOD_CLIENTS} clients "
                 f"of {FLOOD_PROMPT_CHARS}-character prompts", fontsize=10)
    ax.legend(fontsize=8)
    return fig
