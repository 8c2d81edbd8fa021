"""What the static partition (`cache_partition`) costs against the shared pool, both salted per tenant: what
one tenant can hold, the hit rate and tokens/s in paired rounds (`bench --partition`, docs/benchmarks.md)."""

import json
import random
import statistics
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from minikv.attacks.workload import TENANTS, document_sentence, filler, make_prompt, random_note
from minikv.bench.prefix import APPS, SYSTEM_PROMPT_CHARS
from minikv.bench.systems import BenchRequest, Run, paired_ratios, serve_all
from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.request import Request
from minikv.model.llama import Llama

POOLS = {"partitioned": True, "shared": False}  # cache_partition on or off; cache_salt on in both
NUM_TENANTS = 4
BUSY_SHARE = 1 / 2  # of the workload's requests, from the first tenant; the rest from the other three
CAPACITY_REQUESTS, CAPACITY_PROMPT_CHARS, CAPACITY_TOKENS = 24, 240, 64  # the capacity run: one tenant's requests


def tenant_workload(num_requests: int, seed: int, system_chars: int) -> list[BenchRequest]:
    """Each tenant two system prompts of its own (two applications), one of them then a note; half the
    requests from the first tenant, whose two prompts overflow its quota (not the pool)."""
    rng = random.Random(seed)
    tenants = TENANTS[:NUM_TENANTS]
    systems = {(t, app): document_sentence(rng, system_chars) for t in tenants for app in APPS}
    picks = [tenants[0] if rng.random() < BUSY_SHARE else rng.choice(tenants[1:]) for _ in range(num_requests)]
    return [BenchRequest(make_prompt(t, [systems[t, rng.choice(APPS)], random_note(rng).sentence]), 16, t)
            for t in picks]


def engine(model: Llama, tokenizer: PreTrainedTokenizerBase, partitioned: bool) -> Engine:
    """The single engine, NUM_TENANTS windows of pages, salted, partitioned or not; no audit, no event log."""
    context = min(1024, model.config.max_position_embeddings)
    config = EngineConfig(num_pages=NUM_TENANTS * -(-context // 16), page_size=16, context_len=context,
                          cache_partition=partitioned, cache_tenants=NUM_TENANTS, audit=False, event_log=False)
    return Engine(model, tokenizer, config)


def most_running(door: Engine, seed: int) -> int:
    """CAPACITY_REQUESTS requests of one tenant at once, the others idle: the most running in one step."""
    rng = random.Random(seed)
    for _ in range(CAPACITY_REQUESTS):
        door.submit(Request(filler(rng, CAPACITY_PROMPT_CHARS), TENANTS[0], CAPACITY_TOKENS))
    most = 0
    while door.has_work():
        door.step()
        most = max(most, len(door.scheduler.running))
    return most


@dataclass
class PartitionCost:
    """The runs behind every figure: a checked run of each pool, then `rounds` timed pairs."""

    tenant_tokens: dict[str, int]  # the most one tenant's requests can hold: its quota, or the pool
    running_at_once: dict[str, int]
    checked: dict[str, Run]
    rounds: list[dict[str, Run]] = field(default_factory=list)

    @property
    def outputs_equal(self) -> bool:
        return self.checked["partitioned"].texts == self.checked["shared"].texts

    def figures(self) -> dict:
        """Per pool: capacity, hit rate (checked run), median tokens/s; then partitioned over shared."""
        per_pool = {name: {"tenant_tokens": self.tenant_tokens[name], "running_at_once": self.running_at_once[name],
                           "hit_rate": self.checked[name].cached_tokens / self.checked[name].prompt_tokens,
                           "tokens_per_s": statistics.median(r[name].tokens_per_s for r in self.rounds)}
                    for name in POOLS}
        ratios = paired_ratios([r["partitioned"] for r in self.rounds], [r["shared"] for r in self.rounds])
        return {**per_pool, "throughput_ratio": statistics.median(ratios), "throughput_ratios": ratios,
                "rounds": len(self.rounds), "outputs_equal": self.outputs_equal}

    def table(self) -> str:
        f = self.figures()
        rows = [f"| {name} | {f[name]['tenant_tokens']:,} | {f[name]['running_at_once']} | "
                f"{f[name]['hit_rate']:.1%} | {f[name]['tokens_per_s']:,.0f} |" for name in POOLS]
        return "\n".join(["| pool, salted | tokens one tenant holds | its requests running at once | "
                          "prompt tokens from the cache | tokens/s (median) |", "| --- | ---: | ---: | ---: | ---: |",
                          *rows, f"\npartitioned / shared tokens/s: {f['throughput_ratio']:.2f}x, the median of "
                          f"{f['rounds']} paired rounds ({', '.join(f'{r:.2f}' for r in f['throughput_ratios'])}); "
                          f"same completions: {f['outputs_equal']}"])


def measure(model: Llama, tokenizer: PreTrainedTokenizerBase, num_requests: int = 32, repeats: int = 3,
            seed: int = 0) -> PartitionCost:
    """Capacity of each pool, a checked run of each, then `repeats` rounds in alternating order."""
    system_chars = min(SYSTEM_PROMPT_CHARS, model.config.max_position_embeddings // 2)  # a tiny test model's window
    workload = tenant_workload(num_requests, seed, system_chars)

    def serve(name: str) -> Run:
        return serve_all(engine(model, tokenizer, POOLS[name]), workload)

    capacity = {name: engine(model, tokenizer, on) for name, on in POOLS.items()}
    cost = PartitionCost({n: e.pool.tenant_tokens for n, e in capacity.items()},
                         {n: most_running(e, seed) for n, e in capacity.items()}, {n: serve(n) for n in POOLS})
    if repeats == 0:
        cost.rounds.append(cost.checked)  # the checked run is then the timed one
    for r in range(repeats):
        cost.rounds.append({n: serve(n) for n in (POOLS if r % 2 == 0 else reversed(POOLS))})
    return cost


def run_command(model: Llama, tokenizer: PreTrainedTokenizerBase, args) -> int:
    """`bench --partition`: the table or the JSON; 1 if the two pools' completions differ."""
    repeats = 0 if args.quick else (args.repeats if args.repeats is not None else 3)
    cost = measure(model, tokenizer, args.requests, repeats, args.seed)
    print(json.dumps(cost.figures(), indent=2) if args.json else cost.table())
    return 0 if cost.outputs_equal else 1
