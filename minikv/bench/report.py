"""The benchmark's report: per-system results and ratios, as markdown (`table`) and as JSON (`to_json`)."""

import os
import platform
import statistics
from contextlib import suppress
from dataclasses import dataclass, field

import torch

from minikv.bench.memory import KVMemoryUse
from minikv.bench.roofline import Floor
from minikv.bench.systems import Run, paired_ratios


def p50_p99(values: list[float]) -> tuple[float, float] | tuple[None, None]:
    """The median and the 99th percentile (interpolated between the two nearest values, numpy's default)."""
    if len(values) < 2:  # statistics.quantiles wants two points before Python 3.13
        return (values[0], values[0]) if values else (None, None)
    return statistics.median(values), statistics.quantiles(values, n=100, method="inclusive")[98]


def median_run(runs: list[Run]) -> Run:
    """The run with the median wall time (the lower middle of an even count)."""
    wall = statistics.median_low([r.wall_s for r in runs])
    return next(r for r in runs if r.wall_s == wall)


@dataclass
class BenchReport:
    """Everything one benchmark run found, and the ways to show it."""

    device: str
    machine: str
    command: str
    num_requests: int
    timing: str  # how the times were taken, for the table's first line
    runs: dict[str, list[Run]] = field(default_factory=dict)  # system -> its timed runs, i-th from repeat i
    unavailable: dict[str, str] = field(default_factory=dict)  # system -> why it did not run
    mismatched: dict[str, list[int]] = field(default_factory=dict)  # system -> requests unlike the reference
    step_s: dict[str, float] = field(default_factory=dict)  # "paged", "contiguous"
    kv: dict[str, KVMemoryUse] = field(default_factory=dict)  # "paged", "contiguous", "contiguous_window"
    prefix_cache: dict | None = None  # bench/prefix.py: speedup, prefill_tokens_saved, hit_rate, cache_salt
    prefix_outputs_equal: bool = True  # the shared-prefix workload gave the same completions in every mode
    floor: Floor | None = None  # the decode step against its matmuls and one read of its K/V and weights

    @property
    def outputs_equal(self) -> bool:
        return not any(self.mismatched.values()) and self.prefix_outputs_equal

    @property
    def results(self) -> dict[str, Run]:
        """Each system's median run."""
        return {name: median_run(runs) for name, runs in self.runs.items()}

    def speedup(self, over: str, of: str = "minikv_paged") -> float | None:
        """`of`'s tokens/s over `over`'s: the median of the ratios within each repeat."""
        if of not in self.runs or over not in self.runs:
            return None
        return statistics.median(paired_ratios(self.runs[of], self.runs[over]))

    def ratios(self) -> dict[str, float | None]:
        return {
            "vs_hf_sequential": self.speedup("hf_sequential"),
            "vs_hf_generate_batch": self.speedup("hf_generate_batch"),
            "paged_over_contiguous_step": self.step_s["paged"] / self.step_s["contiguous"],
            "safe_over_vulnerable": self.speedup("pair_vulnerable", of="pair_safe"),
        }

    def to_json(self) -> dict:
        """The `bench --json` contract (docs/benchmarks.md); KV waste as fractions."""
        return {
            "device": self.device,
            "tokens_per_s": {name: r.tokens_per_s for name, r in self.results.items()},
            "ratios": self.ratios(),
            "kv_waste": {name: self.kv[name].waste for name in ("paged", "contiguous")},
            "outputs_equal": self.outputs_equal,
            "floor": None if self.floor is None else self.floor.to_json(),
            "prefix_cache": self.prefix_cache,
        }

    def table(self) -> str:
        """As markdown: the systems, the KV memory, the decode step and its floor, shared prefixes."""
        lines = [f"`{self.command}` on {self.machine}; {self.num_requests} requests; {self.timing}.", "",
                 "| system | tokens/s | vs hf one-by-one | TTFT p50 (ms) | TTFT p99 (ms) | outputs equal |",
                 "| --- | ---: | ---: | ---: | ---: | :---: |"]
        for name, run in self.results.items():
            bad = self.mismatched.get(name, [])
            same = "yes" if not bad else f"no ({self.num_requests - len(bad)}/{self.num_requests})"
            p50, p99 = p50_p99(run.ttft_s)
            lines.append(f"| {name} | {run.tokens_per_s:,.0f} | {self.speedup('hf_sequential', of=name):.2f}x | "
                         f"{p50 * 1e3:,.0f} | {p99 * 1e3:,.0f} | {same} |")
        lines += [f"| {name} | unavailable: {why} | | | | |" for name, why in self.unavailable.items()]
        labels = {"paged": "paged pool: whole pages", "paged_half_pages": "paged pool, pages half as large",
                  "contiguous": "contiguous: a row of prompt + max_tokens",
                  "contiguous_window": "contiguous: a row of the context window"}
        lines += ["", "| KV cache, each request at its end | slots reserved | slots filled | waste |",
                  "| --- | ---: | ---: | ---: |"]
        lines += [f"| {labels.get(name, name)} | {use.reserved_tokens:,} | {use.used_tokens:,} | {use.waste:.1%} |"
                  for name, use in self.kv.items()]
        lines += ["", f"One decode step of all {self.num_requests} requests: paged {self.step_s['paged'] * 1e3:.2f} ms, "
                      f"contiguous {self.step_s['contiguous'] * 1e3:.2f} ms."]
        if self.floor is not None:
            f, clock = self.floor, "CPU" if self.device.startswith("cpu") else "wall"
            lines += ["", f"The decode step's floor: {f.step_s * 1e3:.2f} ms against {f.floor_s * 1e3:.2f} ms "
                          f"(floor_fraction {f.floor_fraction:.2f}): its matmuls alone {f.matmul_s * 1e3:.2f} ms, "
                          f"plus {f.bytes_read / 2**20:.1f} MiB of K/V and weights read once at "
                          f"{f.bandwidth / 1e9:.1f} GB/s (a sum over 256 MiB) {f.memory_s * 1e3:.2f} ms; "
                          f"this run, {clock} time."]
        if self.prefix_cache:
            lines += ["", "| shared-prefix workload (bench/prefix.py) | speedup over caching off | prompt tokens from "
                          "the cache | prefill tokens saved |", "| --- | ---: | ---: | ---: |"]
            for label, f in (("prefix caching, tenants share (cache_salt off)", self.prefix_cache),
                             ("prefix caching, cache_salt on", self.prefix_cache["cache_salt"])):
                lines.append(f"| {label} | {f['speedup']:.2f}x | {f['hit_rate']:.1%} | {f['prefill_tokens_saved']:,.0f} |")
        return "\n".join(lines)


def describe_machine(device: torch.device) -> tuple[str, str]:
    """(short device string for the JSON, a longer line for the table)."""
    import transformers

    cpu = platform.processor() or platform.machine()
    with suppress(OSError), open("/proc/cpuinfo") as f:  # Linux only
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    short = (f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else
             f"cpu ({cpu}, {cores} cores, {torch.get_num_threads()} torch threads)")
    return short, (f"{short}; host CPU {cpu} ({cores} cores); torch {torch.__version__}, transformers "
                   f"{transformers.__version__}, Python {platform.python_version()}, {platform.system()}")
