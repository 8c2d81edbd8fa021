"""The benchmark as one figure (docs/bench.png): throughput, KV memory reserved against filled, the decode
step against its floor, and each safety switch's cost as time relative to the vulnerable pair. And where a
served token's time goes with the engine core on a thread and in a process (docs/serve_split.png)."""

import os
import statistics
from pathlib import Path

from matplotlib.figure import Figure

from minikv.bench.report import BenchReport

HF, MINIKV, PAIR = "#9e9e9e", "#1f77b4", "#ff7f0e"


def bench_figure(report: BenchReport) -> Figure:
    """A matplotlib Figure of `report`."""
    fig = Figure(figsize=(20, 4.8), layout="tight")  # not pyplot's: no display, nothing to close
    ax_tps, ax_kv, ax_floor, ax_sw = fig.subplots(1, 4, gridspec_kw={"width_ratios": [1.2, 0.8, 0.6, 1.0]})
    main = [n for n in report.results if "+" not in n]  # not the single switches nor scrub_on_free
    tps = [report.results[n].tokens_per_s for n in main]
    colours = [HF if n.startswith("hf_") else PAIR if n.startswith("pair") else MINIKV for n in main]
    ax_tps.bar_label(ax_tps.barh(main[::-1], tps[::-1], color=colours[::-1]), fmt=" {:,.0f}", fontsize=8)
    ax_tps.set_xlabel("generated tokens per second (higher is better)")
    ax_tps.set_title(f"throughput, {report.num_requests} requests, greedy")

    names = list(report.kv)
    reserved = [report.kv[n].reserved_tokens for n in names]
    used = [report.kv[n].used_tokens for n in names]
    labels = [{"paged": "pages", "paged_half_pages": "half-size\npages", "contiguous": "row:\nprompt+max",
               "contiguous_window": "row:\nwindow"}.get(n, n) for n in names]
    ax_kv.bar_label(ax_kv.bar(labels, reserved, color="#d9d9d9", label="reserved"), fontsize=8,
                    labels=[f"{report.kv[n].waste:.1%}\nwasted" for n in names])
    ax_kv.bar(labels, used, color=MINIKV, label="filled with K/V")
    ax_kv.set_ylim(0, max(reserved) * 1.2)
    ax_kv.tick_params(axis="x", labelsize=8)
    ax_kv.set_ylabel("KV slots (tokens), each request at its end")
    ax_kv.set_title("KV cache: reserved vs filled")
    ax_kv.legend(loc="upper left", fontsize=8)

    floor_panel(ax_floor, report)

    base = report.results.get("pair_vulnerable")
    switches = [n for n in report.results if n.startswith("pair_vulnerable+")] + ["pair_safe"]
    # a cost reads as a cost: time relative to the vulnerable pair, the inverse of the table's ratio
    cost = [1 / report.speedup("pair_vulnerable", of=n) if base else 0 for n in switches]
    labels = [n.removeprefix("pair_vulnerable+") if "+" in n else "safe preset" for n in switches]
    bars = ax_sw.barh(labels[::-1], cost[::-1], color=PAIR)
    ax_sw.bar_label(bars, fmt="{:.2f}x", label_type="center", fontsize=8)
    ax_sw.axvline(1.0, color="black", lw=0.8)
    ax_sw.axvline(1 / 0.9, color="red", lw=0.8, ls="--")
    ax_sw.set_xlim(0, max([*cost, 1 / 0.9]) * 1.05)  # the dashed target line stays inside the panel
    ax_sw.set_xlabel("time relative to the vulnerable pair, above 1 slower\n(dashed: 1.11x, i.e. 0.9x the throughput)")
    ax_sw.set_title("what each safety switch costs (time)")
    fig.suptitle(report.machine, fontsize=8)
    return fig


def floor_panel(ax, report: BenchReport) -> None:
    """The decode step's time beside its floor: the matmuls alone, then one read of its K/V and weights."""
    f = report.floor
    ax.set_title("decode step vs its floor")
    if f is None:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        return
    ax.bar(["floor"], [f.matmul_s * 1e3], color="#d9d9d9", label="matmuls alone")
    ax.bar(["floor"], [f.memory_s * 1e3], bottom=[f.matmul_s * 1e3], color="#a6a6a6", label="K/V and weights read")
    ax.bar(["the engine's step"], [f.step_s * 1e3], color=MINIKV)
    ax.text(1, f.step_s * 1e3, f"floor {f.floor_fraction:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, f.step_s * 1e3 * 1.25)
    ax.set_ylabel("ms (of CPU time on a CPU)")
    ax.legend(loc="upper left", fontsize=8)


SPLIT_RECORD = Path(__file__).resolve().parents[2] / "data" / "serve_split.json"  # profile_serve.py --split
SPLIT_PARTS = {"engine_core_cpu_s": ("engine core", MINIKV), "http_cpu_s": ("HTTP side", PAIR),
               "clients_cpu_s": ("the clients", HF), "rest": ("cores idle or other work", "#eeeeee")}
CORE_AT = {"thread": "core on a thread\nof the HTTP process", "process": "core in a\nprocess of its own"}


def split_parts(rounds: list[dict], cores: int) -> dict[str, dict[str, float]]:
    """Per way of running the core: the median over its rounds of each part's ms per token served, the
    machine's time a token (cores x wall / tokens), and tokens/s."""
    parts: dict[str, dict[str, float]] = {}
    for core in CORE_AT:
        mine = [r for r in rounds if r["core"] == core]
        per_token = {key: [1e3 * r[key] / r["tokens"] for r in mine] for key in list(SPLIT_PARTS)[:3]}
        per_token["machine"] = [1e3 * cores * r["wall_s"] / r["tokens"] for r in mine]
        parts[core] = {key: statistics.median(v) for key, v in per_token.items()}
        parts[core]["rest"] = parts[core]["machine"] - sum(parts[core][key] for key in list(SPLIT_PARTS)[:3])
        parts[core]["tokens_per_s"] = statistics.median(r["tokens"] / r["wall_s"] for r in mine)
    return parts


def split_figure(record: dict) -> Figure:
    """One panel per client count: a bar per way of running the core, as long as the machine's time per
    token served (all its cores), cut into what each part spent on a CPU; tokens/s at its end."""
    loads = record["rounds"]
    fig = Figure(figsize=(11, 1.2 + 1.6 * len(loads)), layout="constrained")
    for ax, (clients, rounds) in zip(fig.subplots(len(loads), 1, squeeze=False)[:, 0], loads.items()):
        parts = split_parts(rounds, record["cores"])
        left = [0.0, 0.0]
        for key, (label, colour) in SPLIT_PARTS.items():
            widths = [parts[core][key] for core in CORE_AT]
            bars = ax.barh(list(CORE_AT.values()), widths, left=left, color=colour, label=label,
                           edgecolor="white")
            ax.bar_label(bars, labels=[f"{w:.2f}" for w in widths], label_type="center", fontsize=8)
            left = [a + b for a, b in zip(left, widths)]
        for y, core in enumerate(CORE_AT):
            ax.text(left[y], y, f"  {parts[core]['tokens_per_s']:,.0f} tokens/s", va="center", fontsize=9)
        ax.set_xlim(0, max(left) * 1.3)
        ax.invert_yaxis()
        ax.set_title(f"{clients} streaming clients", fontsize=10)
        ax.set_xlabel(f"ms of the machine's time per token served ({record['cores']} cores x wall time / "
                      "tokens; shorter is faster)", fontsize=9)
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside lower center", fontsize=8, ncol=4)
    return fig


def plot_path_problem(path: str | Path) -> str | None:
    """Why the figure could not be written to `path` (folder, format), checked before any benchmark runs."""
    path = Path(path)
    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        return f"unsupported figure format {path.suffix or '(none)'!r}; use one of {', '.join('.' + f for f in sorted(formats))}"
    if not path.parent.is_dir():
        return f"folder {path.parent} does not exist"
    if not os.access(path.parent, os.W_OK):
        return f"folder {path.parent} is not writable"
    if path.is_dir():
        return "is a folder; give a file name"
    return None


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write a figure; the format follows the file name (.png, .svg, .pdf)."""
    fig.savefig(path, dpi=120)
