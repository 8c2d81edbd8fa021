"""`python -m minikv bench`: the workload, the equality check and the measurements (docs/benchmarks.md)."""

import json
import random
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import torch
from transformers import PreTrainedTokenizerBase

from minikv.attacks.workload import TENANTS, document_sentence, make_prompt, random_note
from minikv.bench import partition, prefix, systems
from minikv.bench.memory import KVMemoryUse, contiguous_use, paged_use
from minikv.bench.report import BenchReport, describe_machine
from minikv.bench.roofline import measure_floor, paged_step, paired_seconds
from minikv.bench.systems import BenchRequest, Completion, Run
from minikv.disagg.switches import SafetySwitches
from minikv.model.contiguous_cache import ContiguousCache
from minikv.model.llama import Llama

PAGE_SIZE = 16  # the engine's default
OUTPUT_BUDGETS = (16, 32, 64)  # max_tokens: most replies end with EOS before, some are cut short


def bench_workload(num_requests: int = 32, seed: int = 0) -> list[BenchRequest]:
    """Notes the replies must repeat: 4 in 10 bare, 4 with a 20-120 character document, 2 with 200-600."""
    rng = random.Random(seed)
    workload = []
    for _ in range(num_requests):
        tenant, note, kind = rng.choice(TENANTS), random_note(rng).sentence, rng.random()
        sentences = [note]
        if kind >= 0.8:
            sentences.append(document_sentence(rng, rng.randint(200, 600)))
        elif kind >= 0.4:
            sentences.insert(rng.randint(0, 1), document_sentence(rng, rng.randint(20, 120)))
        workload.append(BenchRequest(make_prompt(tenant, sentences), rng.choice(OUTPUT_BUDGETS)))
    return workload


def mismatches(reference: list[Completion], candidate: list[Completion]) -> list[int]:
    """Indices of the requests whose completion differs from the reference's."""
    assert len(reference) == len(candidate), f"{len(candidate)} completions for {len(reference)} requests"
    return [i for i, (a, b) in enumerate(zip(reference, candidate)) if a != b]


def kv_memory(tokenizer: PreTrainedTokenizerBase, workload: list[BenchRequest], completions: list[Completion],
              page_size: int = PAGE_SIZE, context_len: int = 1024) -> dict[str, KVMemoryUse]:
    """Each request's K/V slots at its end (prompt + generated tokens but the last) against four layouts'."""
    prompts = systems.prompt_ids(tokenizer, workload)
    kv_lens = [len(p) + c.tokens - 1 for p, c in zip(prompts, completions)]
    return {
        "paged": paged_use(kv_lens, page_size),
        "paged_half_pages": paged_use(kv_lens, max(1, page_size // 2), "paged_half_pages"),
        "contiguous": contiguous_use(kv_lens, [len(p) + r.max_tokens for p, r in zip(prompts, workload)]),
        "contiguous_window": contiguous_use(kv_lens, context_len, "contiguous_window"),
    }


@torch.inference_mode()
def decode_step_seconds(model: Llama, prompts: list[list[int]], iters: int) -> dict[str, float]:
    """Median seconds of one decode step of the batch after its prompts: scattered pool, contiguous cache."""
    device, lens = model.device, [len(p) for p in prompts]
    cache = ContiguousCache(model.config, len(lens), max(lens) + 1, device, model.dtype)
    cache.seq_lens = list(lens)
    rows, last = list(range(len(lens))), torch.zeros(len(lens), dtype=torch.long, device=device)  # (B,)

    def contiguous() -> list[int]:  # no commit: every iteration decodes the same position again
        step = cache.step(rows, 1)
        return model(last[:, None], cache.positions(rows, 1).to(device), step)[:, -1].argmax(-1).tolist()

    paged, contiguous_s = paired_seconds([paged_step(model, prompts, PAGE_SIZE, "decode"), contiguous], iters, warmup=3)
    return {"paged": paged, "contiguous": contiguous_s}


@dataclass(frozen=True)
class BenchSettings:
    """How much to measure. `quick()` fits in under a minute on a 2-core CPU."""

    num_requests: int = 32
    repeats: int = 5  # timed runs per system after the checked one; the median counts
    step_iters: int = 30  # timed decode steps per layout
    seed: int = 0
    time_checked_run: bool = False  # quick: the checked run is the (only) timed one
    warmup_requests: int = 2  # each system first serves this many requests, untimed
    max_batch: int | None = None  # the paged engine's batch limit; None: the whole workload at once

    def __post_init__(self) -> None:
        if min(self.num_requests, self.step_iters, self.warmup_requests) < 1 or self.repeats < 0:
            raise ValueError(f"num_requests, step_iters and warmup_requests must be >= 1 and repeats >= 0, got "
                             f"{self.num_requests}, {self.step_iters}, {self.warmup_requests}, {self.repeats}")
        if self.repeats == 0 and not self.time_checked_run:
            raise ValueError("repeats=0 leaves nothing to time: give repeats >= 1 or time_checked_run=True")

    @classmethod
    def quick(cls, num_requests: int = 32, seed: int = 0) -> "BenchSettings":
        return cls(num_requests=num_requests, repeats=0, step_iters=5, seed=seed, time_checked_run=True,
                   warmup_requests=1)

    @property
    def timed_runs(self) -> int:
        return self.repeats + int(self.time_checked_run)


def system_runners(model: Llama, tokenizer: PreTrainedTokenizerBase, hf,
                   max_batch: int | None = None) -> dict[str, Callable[[list[BenchRequest]], Run]]:
    """Every system by name, each a function of the workload; hf_sequential is the reference."""
    vulnerable = SafetySwitches.preset("vulnerable")
    batch = {} if max_batch is None else {"max_batch_size": max_batch}
    runners = {
        "hf_sequential": partial(systems.hf_sequential, hf, tokenizer),
        "hf_generate_batch": partial(systems.hf_generate_batch, hf, tokenizer),
        "minikv_contiguous": partial(systems.minikv_contiguous, model, tokenizer),
        "minikv_paged": partial(systems.minikv_paged, model, tokenizer, **batch),
        "minikv_paged+scrub_on_free": partial(systems.minikv_paged, model, tokenizer, scrub_on_free=True,
                                              **batch),
        "pair_safe": partial(systems.pair, model, tokenizer, switches=SafetySwitches.preset("safe")),
        "pair_vulnerable": partial(systems.pair, model, tokenizer, switches=vulnerable),
    }
    for name in SafetySwitches.names():  # each switch alone, against the vulnerable pair
        runners[f"pair_vulnerable+{name}"] = partial(systems.pair, model, tokenizer,
                                                     switches=vulnerable.with_switches(enable=[name]))
    return runners


def run_bench(model: Llama, tokenizer: PreTrainedTokenizerBase, settings: BenchSettings = BenchSettings(),
              command: str = "python -m minikv bench", progress: bool = True) -> BenchReport:
    """Check and time every system, then the decode step, the KV memory, the step's floor, shared prefixes."""
    from tqdm.auto import tqdm

    from minikv.model.checkpoint import to_hf_model

    device, machine = describe_machine(model.device)
    timing = (f"median of {settings.timed_runs} timed runs per system, ratios the median of the ratios within each "
              "repeat" if settings.timed_runs > 1 else "one timed run per system") + \
        (", the checked run included" if settings.time_checked_run else ", after a warm-up and the checked run")
    report = BenchReport(device, machine, command, settings.num_requests, timing)
    workload = bench_workload(settings.num_requests, settings.seed)
    prompts = systems.prompt_ids(tokenizer, workload)
    hf = to_hf_model(model, tokenizer).to(model.device)
    runners = system_runners(model, tokenizer, hf, settings.max_batch)
    with tqdm(total=len(runners) * (2 + settings.repeats) + 2, desc="bench", unit="run", file=sys.stderr,
              disable=not progress) as bar:
        report.runs = time_systems(runners, workload, settings, report, bar)
        report.kv = kv_memory(tokenizer, workload, report.runs["hf_sequential"][-1].completions)
        bar.set_postfix_str("decode step")
        report.step_s = decode_step_seconds(model, prompts, settings.step_iters)
        bar.set_postfix_str("floor")
        report.floor = measure_floor(model, prompts, PAGE_SIZE, settings.step_iters)
        bar.update()
        bar.set_postfix_str("shared prefixes")
        report.prefix_cache, report.prefix_outputs_equal = prefix.measure(model, tokenizer, settings.num_requests,
                                                                          settings.repeats, settings.seed)
        bar.update()
    return report


def time_systems(runners: dict[str, Callable[[list[BenchRequest]], Run]], workload: list[BenchRequest],
                 settings: BenchSettings, report: BenchReport, bar) -> dict[str, list[Run]]:
    """Warm-up and checked run of each, then timed runs interleaved, every other repeat reversed; mismatches
    go into `report`."""
    checked: dict[str, Run] = {}
    for name, run in runners.items():
        bar.set_postfix_str(name)
        before = bar.n
        try:
            run(workload[: settings.warmup_requests])
            bar.update()
            checked[name] = run(workload)
            bar.update()
        except Exception as e:  # only transformers' batching may fail, and is then reported
            if name != "hf_generate_batch":
                raise
            report.unavailable[name] = f"{type(e).__name__}: {e}"
            bar.update(2 + settings.repeats - (bar.n - before))  # the runs it will not have
    reference = checked["hf_sequential"].completions
    report.mismatched = {name: mismatches(reference, run.completions) for name, run in checked.items()}
    timed: dict[str, list[Run]] = {name: [run] if settings.time_checked_run else [] for name, run in checked.items()}
    for repeat in range(settings.repeats):
        for name in (list(timed) if repeat % 2 == 0 else list(reversed(timed))):
            bar.set_postfix_str(name)
            run = runners[name](workload)
            report.mismatched[name] = sorted(set(report.mismatched[name]) | set(mismatches(reference, run.completions)))
            timed[name].append(run)
            bar.update()
    return timed


def run_command(model: Llama, tokenizer: PreTrainedTokenizerBase, args) -> int:
    """Run, print the table or the JSON, write the figure; 1 if outputs differ (docs/benchmarks.md)."""
    torch.set_num_threads(args.threads)
    if args.partition:
        return partition.run_command(model, tokenizer, args)
    settings = BenchSettings.quick(args.requests, args.seed) if args.quick else BenchSettings(args.requests, seed=args.seed)
    settings = replace(settings, max_batch=args.max_batch)
    if args.repeats is not None:
        settings = replace(settings, repeats=args.repeats)
    flags = [("--quick", args.quick), (f"--requests {args.requests}", args.requests != 32),
             (f"--max-batch {args.max_batch}", args.max_batch is not None),
             (f"--repeats {args.repeats}", args.repeats is not None), (f"--seed {args.seed}", args.seed != 0),
             (f"--threads {args.threads}", args.threads != 1)]
    started = time.perf_counter()
    report = run_bench(model, tokenizer, settings, " ".join(["python -m minikv bench", *(f for f, on in flags if on)]))
    if args.plot:
        from minikv.bench.plot import bench_figure, save_figure

        save_figure(bench_figure(report), args.plot)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.table())
        print(f"\n(the benchmark took {time.perf_counter() - started:.0f} s)")
    return 0 if report.outputs_equal else 1
