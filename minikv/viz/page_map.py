"""The page map: every page of a pool as one cell, coloured by the tenant whose data it holds.

How to read it:
- a solid cell is owned by a request that wrote its own K/V there (colour = the tenant);
- a faded cell is free but still holds its last writer's data (pages are not zeroed on free);
- a blank cell was never written since boot;
- a cell hatched in a tenant's colour is *reserved* by that tenant's request, but what it holds
  is still someone else's data (faded, underneath) or nothing; the incident lives here;
- a thick black outline marks the chosen request's block table, numbered in order from 0, as
  Python indexes `block_table` (block 0 holds tokens 0 .. page_size - 1);
- a number in a cell's corner is its ref count, when more than one request holds it (prefix
  caching: a shared page, drawn solid in the colour of the tenant that computed it);
- a small white triangle marks a page written during the current step;
- a red crossed border marks a page read by a request that did not write it (the audit's
  `cross_read`: another tenant's data, another request's, or never-written memory).

The legend lists only what the picture draws, each swatch drawn as the cells are.

`page_styles` decides what every cell looks like (pure, testable); `draw_pools` draws it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from minikv.engine.events import Event, EventLog
from minikv.viz.captions import moment_caption
from minikv.viz.palette import CROSS_READ, GRID_LINE, INK, NEVER_WRITTEN, faded, tenant_colours
from minikv.viz.picture import Picture
from minikv.viz.replay import PageStatus, PoolState, as_events, replay

CrossReads = Literal["now", "ever"]
UNKNOWN_TENANT = "#777777"  # a tenant missing from the colour map
MAX_CELL_IN = 0.42  # a cell never grows beyond this many inches
PANELS_WIDTH_IN = 10.5  # all panels together fit this width
PANELS_HEIGHT_IN = 7.0  # ... and this height
MIN_NUMBER_PT = 13  # order numbers are drawn inside cells at least this many points wide
LEGEND_PT = 11  # legend text: readable when a 10-inch figure is projected 1280 pixels wide
CAPTION_PT = 12


@dataclass(frozen=True)
class PageStyle:
    """How one page is drawn, and why."""

    page: int
    status: PageStatus
    fill: str  # "#rrggbb" of the cell
    tenant: str | None  # tenant of the request that owns the page now (None: free)
    data_tenant: str | None  # tenant whose K/V the page holds (None: never written)
    hatch: str | None  # the owner's colour, hatched over a reserved page
    order: int | None  # position in the outlined block table, from 0 (its index in block_table)
    cross_read: bool  # read by a request that did not write it
    written_now: bool  # written during the current step
    ref_count: int = 1  # requests holding the page (prefix caching shares pages)


def page_styles(state: PoolState, colours: Mapping[str, str], request: str | None = None,
                cross_reads: CrossReads = "now") -> list[PageStyle]:
    """The look of every page of `state`; `request`'s block table (if it holds pages) is numbered."""
    table = state.block_tables.get(request, ()) if request is not None else ()
    order = {page: i for i, page in enumerate(table)}
    crossed = state.cross_read_now if cross_reads == "now" else state.cross_read_ever
    styles = []
    for p in range(state.num_pages):
        status = state.status(p)
        owner, data = state.owner_tenant[p], state.writer_tenant[p]
        data_colour = colours.get(data, UNKNOWN_TENANT) if data is not None else None
        if status in (PageStatus.OWNED, PageStatus.SHARED):
            fill = data_colour
        elif data_colour is None:
            fill = NEVER_WRITTEN
        else:
            fill = faded(data_colour)
        hatch = colours.get(owner, UNKNOWN_TENANT) if status is PageStatus.RESERVED else None
        refs = state.ref_count[p] if state.ref_count else int(owner is not None)
        styles.append(PageStyle(p, status, fill, owner, data, hatch, order.get(p), p in crossed, p in state.written_now, refs))
    return styles


def status_counts(state: PoolState) -> dict[PageStatus, int]:
    """How many pages are in each status."""
    counts = {s: 0 for s in PageStatus}
    for p in range(state.num_pages):
        counts[state.status(p)] += 1
    return counts


def counts_text(state: PoolState) -> str:
    """e.g. "3 owned, 55 reserved, 12 stale, 55 never written" (and "2 shared" when there are any)."""
    return ", ".join(f"{n} {s.value}" for s, n in status_counts(state).items() if n or s is not PageStatus.SHARED)


# -- geometry ------------------------------------------------------------------------------
def grid_shape(num_pages: int) -> tuple[int, int]:
    """(rows, columns) for `num_pages` cells: about twice as wide as tall, 8 to 64 columns."""
    cols = max(8, 4 * math.ceil(math.ceil(math.sqrt(2 * num_pages)) / 4))
    cols = min(cols, 64, num_pages)
    return math.ceil(num_pages / cols), cols


def _square(page: int, cols: int, inset: float = 0.0) -> list[tuple[float, float]]:
    row, col = divmod(page, cols)
    lo, hi = -0.5 + inset, 0.5 - inset
    return [(col + lo, row + lo), (col + hi, row + lo), (col + hi, row + hi), (col + lo, row + hi)]


def _corner(page: int, cols: int, size: float = 0.4) -> list[tuple[float, float]]:
    row, col = divmod(page, cols)  # y grows downward: row - 0.5 is the cell's top edge
    return [(col + 0.5, row - 0.5), (col + 0.5 - size, row - 0.5), (col + 0.5, row - 0.5 + size)]


def _is_dark(colour: str) -> bool:
    r, g, b, _ = to_rgba(colour)
    return 0.299 * r + 0.587 * g + 0.114 * b < 0.5


# -- drawing ------------------------------------------------------------------------------
def _draw_panel(ax: Axes, state: PoolState, styles: list[PageStyle], cell_pt: float, page_size: int | None) -> None:
    rows, cols = grid_shape(state.num_pages)
    thin = 0.6 if cell_pt > 10 else 0.3
    pixels = [[(1.0, 1.0, 1.0, 0.0)] * cols for _ in range(rows)]
    for s in styles:
        row, col = divmod(s.page, cols)
        pixels[row][col] = to_rgba(s.fill)
    ax.imshow(pixels, interpolation="nearest", extent=(-0.5, cols - 0.5, rows - 0.5, -0.5))
    ax.add_collection(PolyCollection([_square(s.page, cols) for s in styles],
                                     facecolors="none", edgecolors=GRID_LINE, linewidths=thin))
    hatches: dict[str, list[int]] = {}
    for s in styles:
        if s.hatch is not None:
            hatches.setdefault(s.hatch, []).append(s.page)
    for colour, pages in hatches.items():
        ax.add_collection(PolyCollection([_square(p, cols, 0.06) for p in pages], facecolors="none",
                                         edgecolors=colour, hatch="///", hatchcolor=colour, linewidths=1.2))
    ordered = sorted((s for s in styles if s.order is not None), key=lambda s: s.order)
    if ordered:
        ax.add_collection(PolyCollection([_square(s.page, cols, 0.04) for s in ordered],
                                         facecolors="none", edgecolors=INK, linewidths=2.0 if cell_pt > 10 else 1.2))
        digits = len(str(ordered[-1].order))
        if cell_pt >= MIN_NUMBER_PT + 4 * max(0, digits - 2):
            size = min(10.0, cell_pt * 0.5 / max(1.5, digits * 0.75))
            for s in ordered:
                row, col = divmod(s.page, cols)
                ax.text(col, row, str(s.order), ha="center", va="center", fontsize=size, fontweight="bold",
                        color="white" if _is_dark(s.fill) and s.hatch is None else INK)
        else:  # no room for numbers: a line through the pages in block-table order
            ax.plot([divmod(s.page, cols)[1] for s in ordered], [divmod(s.page, cols)[0] for s in ordered],
                    color=INK, linewidth=0.8, alpha=0.7)
    for s in styles:
        if s.ref_count > 1 and cell_pt >= MIN_NUMBER_PT:  # shared through the prefix cache
            row, col = divmod(s.page, cols)
            ax.text(col - 0.42, row + 0.42, str(s.ref_count), ha="left", va="bottom", fontsize=min(8.0, cell_pt * 0.35),
                    color="white" if _is_dark(s.fill) else INK)
    written = [s.page for s in styles if s.written_now]
    if written:
        ax.add_collection(PolyCollection([_corner(p, cols) for p in written],
                                         facecolors="white", edgecolors=INK, linewidths=0.6))
    crossed = [s.page for s in styles if s.cross_read]
    if crossed:
        ax.add_collection(PolyCollection([_square(p, cols, 0.1) for p in crossed], facecolors="none",
                                         edgecolors=CROSS_READ, hatch="xx", hatchcolor=CROSS_READ, linewidths=2.4))
    row_step = max(1, math.ceil(11 / cell_pt))  # tick labels at least 11 points apart
    ax.set_yticks(range(0, rows, row_step), [str(r * cols) for r in range(0, rows, row_step)], fontsize=7)
    col_step = max(1, math.ceil(20 / cell_pt))
    ax.set_xticks(range(0, cols, col_step), [f"+{c}" for c in range(0, cols, col_step)], fontsize=7)
    ax.xaxis.tick_top()
    ax.tick_params(length=0, pad=2)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_title(_panel_title(state, cell_pt, page_size), fontsize=9, pad=14)


def _panel_title(state: PoolState, cell_pt: float, page_size: int | None) -> str:
    """Node, size and page counts, wrapped to the panel's width."""
    size = f" × {page_size} tokens" if page_size else ""
    chars = max(30, int(grid_shape(state.num_pages)[1] * cell_pt / 5))  # ~5 points a character
    counts = counts_text(state)
    if len(counts) > chars:  # two lines: what is held, then what is free
        held, _, free = counts.partition(" reserved, ")
        counts = f"{held} reserved,\n{free}"
    return textwrap.fill(f"{state.node}: {state.num_pages} pages{size}", chars) + "\n" + counts


def _legend_handles(styles: Iterable[PageStyle], colours: Mapping[str, str], request_label: str | None,
                    ref_counts_drawn: bool = True) -> list:
    """One swatch for each kind of cell the panels draw, drawn as those cells are; nothing else."""
    styles = list(styles)
    drawn = lambda tenant, *statuses: any(  # noqa: E731
        s.data_tenant == tenant and s.status in statuses for s in styles)
    handles: list = []
    for tenant, colour in colours.items():
        if drawn(tenant, PageStatus.OWNED):
            handles.append(Patch(facecolor=colour, edgecolor=GRID_LINE, label=f"{tenant}: owns it, wrote it"))
        if drawn(tenant, PageStatus.STALE, PageStatus.RESERVED):
            handles.append(Patch(facecolor=faded(colour), edgecolor=GRID_LINE, label=f"{tenant}'s old data (freed, faded)"))
    if any(s.fill == NEVER_WRITTEN and s.hatch is None for s in styles):
        handles.append(Patch(facecolor=NEVER_WRITTEN, edgecolor=GRID_LINE, label="free, never written"))
    for tenant, colour in colours.items():
        if any(s.hatch == colour for s in styles):
            handles.append(Patch(facecolor="white", edgecolor=colour, hatch="///", linewidth=1.2,
                                 label=f"reserved by {tenant}, not yet written by it"))
    if ref_counts_drawn and any(s.ref_count > 1 for s in styles):
        handles.append(Line2D([], [], linestyle="none", marker="$n$", markersize=8, color=INK,
                              label="n in the corner: ref count, requests sharing the page"))
    if any(s.written_now for s in styles):
        handles.append(Line2D([], [], linestyle="none", marker="v", markerfacecolor="white", markeredgecolor=INK,
                              label="written this step"))
    if any(s.cross_read for s in styles):
        handles.append(Patch(facecolor="none", edgecolor=CROSS_READ, hatch="xx", linewidth=2,
                             label="red: read across tenants (audit)"))
    if request_label is not None and any(s.order is not None for s in styles):
        handles.append(Patch(facecolor="none", edgecolor=INK, linewidth=2, label=f"block table of {request_label}, from block 0"))
    return handles


def draw_pools(states: Sequence[PoolState], colours: Mapping[str, str], caption: str,
               request: str | None = None, page_size: int | None = None,
               cross_reads: CrossReads = "now") -> Figure:
    """One panel per pool, side by side at the same cell size, a caption on top, a legend below."""
    shapes = [grid_shape(s.num_pages) for s in states]
    total_cols = sum(c for _, c in shapes)
    max_rows = max(r for r, _ in shapes)
    cell = min(MAX_CELL_IN, PANELS_WIDTH_IN / total_cols, PANELS_HEIGHT_IN / max_rows)
    left, gap, right, bottom = 0.45, 0.6, 0.25, 0.15
    panels_w = total_cols * cell + gap * (len(states) - 1)
    width = max(7.0, left + panels_w + right)
    caption = textwrap.fill(caption, width=int(width * 11))
    title_lines = max(_panel_title(s, cell * 72, page_size).count("\n") + 1 for s in states)
    top = 0.2 + 0.22 * (caption.count("\n") + 1) + 0.2 + 0.16 * title_lines + 0.35
    label = None
    if request is not None:
        tenants = {t for s in states for r, t in zip(s.owner, s.owner_tenant) if r == request}
        label = f"{tenants.pop()}/{request}" if len(tenants) == 1 else request
    all_styles = [page_styles(s, colours, request, cross_reads) for s in states]
    handles = _legend_handles([st for styles in all_styles for st in styles], colours, label,
                              ref_counts_drawn=cell * 72 >= MIN_NUMBER_PT)
    ncol = max(1, int(width // 3.6))
    legend_h = 0.3 * math.ceil(len(handles) / ncol) + 0.15
    height = top + max_rows * cell + legend_h + bottom
    fig = Figure(figsize=(width, height))
    x = (width - panels_w) / 2
    for state, styles, (rows, cols) in zip(states, all_styles, shapes):
        ax = fig.add_axes((x / width, (bottom + legend_h + (max_rows - rows) * cell) / height,
                           cols * cell / width, rows * cell / height))
        _draw_panel(ax, state, styles, cell * 72, page_size)
        x += cols * cell + gap
    fig.text(0.5, 1 - 0.15 / height, caption, ha="center", va="top", fontsize=CAPTION_PT)
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, bottom / height), ncol=ncol,
               frameon=False, fontsize=LEGEND_PT, handlelength=1.6, columnspacing=1.2)
    return fig


def page_map(log: EventLog | Iterable[Event], num_pages: int | Mapping[str, int], at: int | None = None,
             request: str | None = None, page_size: int | None = None, cross_reads: CrossReads = "now",
             nodes: Sequence[str] | None = None) -> Picture:
    """The page map of every pool (or of `nodes`) after events[0..at] (the whole log when None).

    `request` outlines that request's block table; `cross_reads="ever"` marks every page read
    across tenants so far instead of only during the current step.
    """
    events = as_events(log)
    last = len(events) - 1 if at is None else at
    states = replay(events, num_pages, last)
    shown = [states[n] for n in (nodes or states)]
    colours = tenant_colours(e.tenant for e in events)
    caption = moment_caption(events, last)
    fig = draw_pools(shown, colours, caption, request, page_size, cross_reads)
    summary = "; ".join(f"{s.node}: {counts_text(s)}" for s in shown)
    return Picture(fig, f"Page map. {caption}. {summary}")
