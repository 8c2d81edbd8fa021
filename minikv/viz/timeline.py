"""Two plots of requests over time: the queue stages each went through (`timeline`), and time to
first token against prompt length (`ttft_plot`). How to read them: docs/pictures.md."""

import statistics
from collections.abc import Iterable, Sequence

from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from minikv.engine.events import Event, EventLog
from minikv.engine.request import Response
from minikv.viz.palette import CROSS_READ, INK
from minikv.viz.picture import Picture
from minikv.viz.queues import WIRE_STAGE, stage_order, stage_spans, transitions, wire_spans
from minikv.viz.replay import as_events

STAGE_CMAPS = ("Blues", "Purples", "Greens", "Oranges")  # one sequential hue per node
OTHER_REQUESTS = "#bbbbbb"  # unmarked requests in the TTFT plot: grey, no tenant's colour
WIRE_COLOUR = "#999999"  # KV batches on the wire: neutral, neither node's hue
LEGEND_PT = 10
OUTCOME_MARKERS = {"finish": ("o", "finished"), "reject": ("X", "rejected (400)"), "cancel": ("s", "cancelled")}


def timeline(log: EventLog | Iterable[Event], mark: Iterable[str] = (), title: str | None = None) -> Picture:
    """Requests (rows, in order of arrival) through the queue stages, over engine steps; the rows of
    the request ids in `mark` (e.g. the leaked one) are labelled in bold red."""
    events, marked = as_events(log), set(mark)
    spans, stages, batches = stage_spans(events), stage_order(events), wire_spans(events)
    leaving = [t for t in transitions(events) if t.stage is None]  # every finish, cancel and reject
    stage_colour = stage_colours(stages) | {WIRE_STAGE: WIRE_COLOUR}
    rows = list(dict.fromkeys([s.request_id for s in spans] + [t.request_id for t in leaving]))
    tenant = {s.request_id: s.tenant for s in spans} | {t.request_id: t.tenant for t in leaving}
    lanes = list(dict.fromkeys(s.stage.partition(".")[0] for s in spans + batches))
    lane_h = 0.7 / max(len(lanes), 1)
    last_step = max((e.step for e in events), default=0) + 1
    used = [k for k in OUTCOME_MARKERS if any(t.outcome == k for t in leaving)]
    lasting = [sp for sp in spans + batches if sp.end is None or sp.end > sp.start]  # the stretches drawn
    instant = [s for s in stages if not any(sp.stage == s for sp in lasting)]  # entered and left within a step
    handles = [Patch(color=stage_colour[s], label=s) for s in stages if s not in instant]
    if batches:
        handles.append(Patch(facecolor=WIRE_COLOUR, edgecolor="white", label="KV batch on the wire"))
    handles += [Line2D([], [], marker=OUTCOME_MARKERS[k][0], color=INK, linestyle="none", label=OUTCOME_MARKERS[k][1])
                for k in used]
    if instant:
        handles.append(Patch(color="none", label="under 1 step:\n" + "\n".join(instant)))
    plot_h = max(0.28 * len(lanes) * max(len(rows), 1), 0.25 * (len(handles) + len(instant)))
    top, bottom = 0.45, 0.55  # inches for the title, and for the step axis
    height = top + plot_h + bottom
    fig = Figure(figsize=(9.0, height))
    ax = fig.add_axes((0.2, bottom / height, 0.56, plot_h / height))
    for s in lasting:
        y = rows.index(s.request_id) - 0.35 + lane_h * (lanes.index(s.stage.partition(".")[0]) + 0.5)
        ax.barh(y, (last_step if s.end is None else s.end) - s.start, left=s.start, height=lane_h * 0.9,
                color=stage_colour[s.stage], edgecolor="white", linewidth=1.0)
    for t in leaving:
        ax.plot(t.step, rows.index(t.request_id), marker=OUTCOME_MARKERS[t.outcome][0], color=INK,
                markersize=6, linestyle="none")
    ax.set_yticks(range(len(rows)), [f"{tenant[r]}/{r}" for r in rows], fontsize=8)
    for label, request_id in zip(ax.get_yticklabels(), rows):
        if request_id in marked:
            label.set(color=CROSS_READ, fontweight="bold")
    ax.set(ylim=(max(len(rows), 1) - 0.5, -0.5), xlim=(0, last_step))
    ax.set_xlabel("engine step", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "Requests through the queues", fontsize=10)
    if len(lanes) > 1:
        ax.set_ylabel("lanes, top to bottom: " + ", ".join(lanes), fontsize=8)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=LEGEND_PT, frameon=False)
    summary = [f"{sum(1 for t in leaving if t.outcome == k)} {OUTCOME_MARKERS[k][1]}" for k in used]
    if batches:
        summary.append(f"{len(batches)} KV batch{'es' if len(batches) > 1 else ''} on the wire")
    text = f"Timeline of {len(rows)} requests over {last_step} steps through {', '.join(stages) or 'no stages'}"
    return Picture(fig, text + (f"; {', '.join(summary)}" if summary else ""))


def stage_colours(stages: Sequence[str]) -> dict[str, str]:
    """A colour per stage: one hue per node (blue, orange, ...), light to dark along the pipeline."""
    groups = list(dict.fromkeys(s.partition(".")[0] for s in stages))
    colours = {}
    for g, prefix in enumerate(groups):
        members = [s for s in stages if s.partition(".")[0] == prefix]
        cmap = colormaps[STAGE_CMAPS[g % len(STAGE_CMAPS)]]
        colours |= {stage: to_hex(cmap(0.35 + 0.5 * (i + 1) / len(members))) for i, stage in enumerate(members)}
    return colours


def ttft_plot(responses: Sequence[Response], mark: Iterable[str] = (), title: str | None = None) -> Picture:
    """Time to first token (ms) against prompt tokens, one dot per answered request; those in `mark`
    (ids) are labelled red stars, and a dashed line joins the others' median at each prompt length."""
    marked, timed = set(mark), [r for r in responses if r.ttft_s is not None]
    normal = [r for r in timed if r.request_id not in marked]
    special = [r for r in timed if r.request_id in marked]
    xs, ys = [r.usage.prompt_tokens for r in normal], [r.ttft_s * 1e3 for r in normal]
    fig = Figure(figsize=(6.5, 4.0))
    ax = fig.add_axes((0.12, 0.13, 0.84, 0.77))
    ax.scatter(xs, ys, s=22, color=OTHER_REQUESTS, edgecolor=INK, linewidth=0.4, label="requests", zorder=3)
    lengths = sorted(set(xs))
    if len(lengths) >= 2:  # medians: a few stalled runs cannot drag the line, as they drag a fit
        medians = [statistics.median(y for x, y in zip(xs, ys) if x == n) for n in lengths]
        ax.plot(lengths, medians, color=INK, linewidth=1, linestyle="--",
                label="median at each prompt length", zorder=2)
    for r in special:
        ax.scatter([r.usage.prompt_tokens], [r.ttft_s * 1e3], s=260, marker="*", color=CROSS_READ,
                   edgecolor=INK, linewidth=0.8, zorder=4)
        ax.annotate(f"{r.tenant}/{r.request_id}\n{r.usage.prompt_tokens} prompt tokens",
                    (r.usage.prompt_tokens, r.ttft_s * 1e3), xytext=(-12, 14), textcoords="offset points",
                    ha="right", fontsize=8, color=CROSS_READ, fontweight="bold")
    if special:
        ax.scatter([], [], s=120, marker="*", color=CROSS_READ, edgecolor=INK, label="marked")
    ax.set_xlabel("prompt tokens (usage.prompt_tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set(xlim=(0, None), ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_PT, loc="best")
    ax.set_title(title or "Time to first token against prompt length", fontsize=10)
    untimed = len(responses) - len(timed)
    text = f"TTFT against prompt length for {len(timed)} answered requests"
    text += f" ({untimed} without a first token not drawn)" if untimed else ""
    text += f"; marked: {', '.join(f'{r.tenant}/{r.request_id}' for r in special)}" if special else ""
    return Picture(fig, text)
