"""The benchmark as one figure (docs/bench.png): throughput, KV memory reserved against filled, the roofline,
and each safety switch's cost as time relative to the vulnerable pair."""

import os
from pathlib import Path

from minikv.bench.report import BenchReport

HF, MINIKV, PAIR = "#9e9e9e", "#1f77b4", "#ff7f0e"


def pyplot():
    """matplotlib.pyplot, on the Agg backend unless one is chosen already: no display needed."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def bench_figure(report: BenchReport):
    """A matplotlib Figure of `report`."""
    fig, (ax_tps, ax_kv, ax_roof, ax_sw) = pyplot().subplots(1, 4, figsize=(20, 4.8), layout="tight",
                                                             gridspec_kw={"width_ratios": [1.2, 0.8, 0.6, 1.0]})
    main = [n for n in report.results if "+" not in n]  # not the single switches nor scrub_on_free
    tps = [report.results[n].tokens_per_s for n in main]
    colours = [HF if n.startswith("hf_") else PAIR if n.startswith("pair") else MINIKV for n in main]
    ax_tps.barh(main[::-1], tps[::-1], color=colours[::-1])
    for y, v in enumerate(tps[::-1]):
        ax_tps.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    ax_tps.set_xlabel("generated tokens per second (higher is better)")
    ax_tps.set_title(f"throughput, {report.num_requests} requests, greedy")

    names = list(report.kv)
    reserved = [report.kv[n].reserved_tokens for n in names]
    used = [report.kv[n].used_tokens for n in names]
    labels = [{"paged": "pages", "paged_half_pages": "half-size\npages", "contiguous": "row:\nprompt+max",
               "contiguous_window": "row:\nwindow"}.get(n, n) for n in names]
    ax_kv.bar(labels, reserved, color="#d9d9d9", label="reserved")
    ax_kv.bar(labels, used, color=MINIKV, label="filled with K/V")
    for x, n in enumerate(names):
        ax_kv.text(x, reserved[x], f"{report.kv[n].waste:.1%}\nwasted", ha="center", va="bottom", fontsize=8)
    ax_kv.set_ylim(0, max(reserved) * 1.2)
    ax_kv.tick_params(axis="x", labelsize=8)
    ax_kv.set_ylabel("KV slots (tokens), each request at its end")
    ax_kv.set_title("KV cache: reserved vs filled")
    ax_kv.legend(loc="upper left", fontsize=8)

    roofline_panel(ax_roof, report)

    base = report.results.get("pair_vulnerable")
    switches = [n for n in report.results if n.startswith("pair_vulnerable+")] + ["pair_safe"]
    # a cost reads as a cost: time relative to the vulnerable pair, the inverse of the table's ratio
    cost = [1 / report.speedup("pair_vulnerable", of=n) if base else 0 for n in switches]
    labels = [n.removeprefix("pair_vulnerable+") if "+" in n else "safe preset" for n in switches]
    ax_sw.barh(labels[::-1], cost[::-1], color=PAIR)
    ax_sw.axvline(1.0, color="black", lw=0.8)
    ax_sw.axvline(1 / 0.9, color="red", lw=0.8, ls="--")
    ax_sw.set_xlim(0, max([*cost, 1 / 0.9]) * 1.05)  # the dashed target line stays inside the panel
    for y, v in enumerate(cost[::-1]):
        ax_sw.text(0.02, y, f"{v:.2f}x", va="center", fontsize=8)
    ax_sw.set_xlabel("time relative to the vulnerable pair, above 1 slower\n(dashed: 1.11x, i.e. 0.9x the throughput)")
    ax_sw.set_title("what each safety switch costs (time)")
    fig.suptitle(report.machine, fontsize=8)
    return fig


def roofline_panel(ax, report: BenchReport) -> None:
    """The decode step and the prefill, GFLOP/s achieved beside the GFLOP/s of their matmuls alone."""
    r = report.roofline
    ax.set_title("roofline: step vs its matmuls")
    if r is None:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        return
    phases = [("decode\n(batch)", r.decode_gflops, r.decode_matmul_gflops),
              ("prefill\n(all prompts)", r.prefill_gflops, r.prefill_matmul_gflops)]
    xs = range(len(phases))
    ax.bar([x - 0.2 for x in xs], [m for _, _, m in phases], width=0.4, color="#d9d9d9", label="matmuls alone")
    ax.bar([x + 0.2 for x in xs], [g for _, g, _ in phases], width=0.4, color=MINIKV, label="the engine's step")
    for x, (_, g, m) in zip(xs, phases):
        ax.text(x + 0.2, g, f"{g / m:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [name for name, _, _ in phases], fontsize=8)
    ax.set_ylim(0, max(m for _, _, m in phases) * 1.25)
    ax.set_ylabel("GFLOP/s (per second of CPU time on a CPU)")
    ax.legend(loc="upper left", fontsize=8)


def plot_path_problem(path: str | Path) -> str | None:
    """Why the figure could not be written to `path` (folder, format), checked before any benchmark runs."""
    from matplotlib.figure import Figure

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


def save_figure(fig, path: str | Path) -> None:
    """Write a figure and close it; the format follows the file name (.png, .svg, .pdf)."""
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
