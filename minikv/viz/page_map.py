"""The page map: every page of a pool as one cell, coloured by the tenant whose data it holds (how to read
it: docs/pictures.md). `page_styles` decides how every cell looks (pure, testable), `draw_pools` draws it."""

import math
import textwrap
from collections import Counter
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
from minikv.viz.palette import (CROSS_READ, GRID_LINE, INK, NEVER_WRITTEN, UNWRITTEN_READ, faded,
                                tenant_colours)
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
    cross_read: bool  # another request's data in it was read
    written_now: bool  # written during the current step
    ref_count: int = 1  # requests holding the page (prefix caching shares pages)
    unwritten_read: bool = False  # read while nobody had written it (no one's data, but not the reader's)


def page_styles(state: PoolState, colours: Mapping[str, str], request: str | None = None,
                cross_reads: CrossReads = "now") -> list[PageStyle]:
    """The look of every page of `state`; `request`'s block table (if it holds pages) is numbered."""
    order = {page: i for i, page in enumerate(state.block_tables.get(request, ()))}
    crossed = state.cross_read_now if cross_reads == "now" else state.cross_read_ever
    unwritten = state.unwritten_read_now if cross_reads == "now" else state.unwritten_read_ever
    styles = []
    for p in range(state.num_pages):
        status, owner, data = state.status(p), state.owner_tenant[p], state.writer_tenant[p]
        colour = colours.get(data, UNKNOWN_TENANT)
        if data is None:
            fill = NEVER_WRITTEN
        else:  # full colour while its holder's own (or shared) data, faded otherwise
            fill = colour if status in (PageStatus.OWNED, PageStatus.SHARED) else faded(colour)
        hatch = colours.get(owner, UNKNOWN_TENANT) if status is PageStatus.RESERVED else None
        styles.append(PageStyle(p, status, fill, owner, data, hatch, order.get(p), p in crossed,
                                p in state.written_now, state.ref_count[p], p in unwritten))
    return styles


def counts_text(state: PoolState) -> str:
    """e.g. "3 owned, 55 reserved, 12 stale, 55 never written" (and "2 shared" when there are any)."""
    counts = Counter(state.status(p) for p in range(state.num_pages))
    return ", ".join(f"{counts[s]} {s.value}" for s in PageStatus if counts[s] or s is not PageStatus.SHARED)


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


def _ink_on(colour: str) -> str:
    """White on a dark cell, black on a light one."""
    red, green, blue, _ = to_rgba(colour)
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else INK


def _outline(ax: Axes, pages: Sequence[int], cols: int, inset: float = 0.0, **style) -> None:
    """Outline the cells of `pages`, each `inset` inside its cell, as one collection."""
    if pages:
        ax.add_collection(PolyCollection([_square(p, cols, inset) for p in pages], facecolors="none", **style))


def _draw_panel(ax: Axes, state: PoolState, styles: list[PageStyle], cell_pt: float, page_size: int | None) -> None:
    rows, cols = grid_shape(state.num_pages)
    pixels = [[(1.0, 1.0, 1.0, 0.0)] * cols for _ in range(rows)]
    for s in styles:
        pixels[s.page // cols][s.page % cols] = to_rgba(s.fill)
    ax.imshow(pixels, interpolation="nearest", extent=(-0.5, cols - 0.5, rows - 0.5, -0.5))
    _outline(ax, [s.page for s in styles], cols, edgecolors=GRID_LINE, linewidths=0.6 if cell_pt > 10 else 0.3)
    for colour in dict.fromkeys(s.hatch for s in styles if s.hatch is not None):
        _outline(ax, [s.page for s in styles if s.hatch == colour], cols, 0.06, edgecolors=colour, hatch="///",
                 hatchcolor=colour, linewidths=1.2)
    ordered = sorted((s for s in styles if s.order is not None), key=lambda s: s.order)
    _outline(ax, [s.page for s in ordered], cols, 0.04, edgecolors=INK, linewidths=2.0 if cell_pt > 10 else 1.2)
    digits = len(str(ordered[-1].order)) if ordered else 0
    if ordered and cell_pt >= MIN_NUMBER_PT + 4 * max(0, digits - 2):
        size = min(10.0, cell_pt * 0.5 / max(1.5, digits * 0.75))
        for s in ordered:
            ax.text(s.page % cols, s.page // cols, str(s.order), ha="center", va="center", fontsize=size,
                    fontweight="bold", color=_ink_on(s.fill) if s.hatch is None else INK)
    elif ordered:  # no room for numbers: a line through the pages in block-table order
        ax.plot([s.page % cols for s in ordered], [s.page // cols for s in ordered], color=INK, linewidth=0.8,
                alpha=0.7)
    for s in styles:
        if s.ref_count > 1 and cell_pt >= MIN_NUMBER_PT:  # shared through the prefix cache
            ax.text(s.page % cols - 0.42, s.page // cols + 0.42, str(s.ref_count), ha="left", va="bottom",
                    fontsize=min(8.0, cell_pt * 0.35), color=_ink_on(s.fill))
    written = [_corner(s.page, cols) for s in styles if s.written_now]
    if written:
        ax.add_collection(PolyCollection(written, facecolors="white", edgecolors=INK, linewidths=0.6))
    _outline(ax, [s.page for s in styles if s.unwritten_read and not s.cross_read], cols, 0.1,
             edgecolors=UNWRITTEN_READ, hatch="..", hatchcolor=UNWRITTEN_READ, linewidths=2.4)
    _outline(ax, [s.page for s in styles if s.cross_read], cols, 0.1, edgecolors=CROSS_READ, hatch="xx",
             hatchcolor=CROSS_READ, linewidths=2.4)
    row_step = max(1, math.ceil(11 / cell_pt))  # tick labels at least 11 points apart
    ax.set_yticks(range(0, rows, row_step), [str(r * cols) for r in range(0, rows, row_step)], fontsize=7)
    col_step = max(1, math.ceil(20 / cell_pt))
    ax.set_xticks(range(0, cols, col_step), [f"+{c}" for c in range(0, cols, col_step)], fontsize=7)
    ax.xaxis.tick_top()
    ax.tick_params(length=0, pad=2)
    ax.spines[:].set_visible(False)
    ax.set(xlim=(-0.5, cols - 0.5), ylim=(rows - 0.5, -0.5))
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
    handles: list = []
    for tenant, colour in colours.items():
        statuses = {s.status for s in styles if s.data_tenant == tenant}
        if PageStatus.OWNED in statuses:
            handles.append(Patch(facecolor=colour, edgecolor=GRID_LINE, label=f"{tenant}: owns it, wrote it"))
        if statuses & {PageStatus.STALE, PageStatus.RESERVED}:
            handles.append(Patch(facecolor=faded(colour), edgecolor=GRID_LINE,
                                 label=f"{tenant}'s old data (freed, faded)"))
    if any(s.fill == NEVER_WRITTEN and s.hatch is None for s in styles):
        handles.append(Patch(facecolor=NEVER_WRITTEN, edgecolor=GRID_LINE, label="free, never written"))
    handles += [Patch(facecolor="white", edgecolor=colour, hatch="///", linewidth=1.2,
                      label=f"reserved by {tenant}, not yet written by it")
                for tenant, colour in colours.items() if any(s.hatch == colour for s in styles)]
    marks = [  # (drawn in the panels?, its swatch)
        (ref_counts_drawn and any(s.ref_count > 1 for s in styles),
         Line2D([], [], linestyle="none", marker="$n$", markersize=8, color=INK,
                label="n in the corner: ref count, requests sharing the page")),
        (any(s.written_now for s in styles), Line2D([], [], linestyle="none", marker="v", markerfacecolor="white",
                                                   markeredgecolor=INK, label="written this step")),
        (any(s.cross_read for s in styles), Patch(facecolor="none", edgecolor=CROSS_READ, hatch="xx", linewidth=2,
                                                  label="red: read across tenants (audit)")),
        (any(s.unwritten_read and not s.cross_read for s in styles),
         Patch(facecolor="none", edgecolor=UNWRITTEN_READ, hatch="..", linewidth=2,
               label="grey dots: read, nobody had written it (audit)")),
        (request_label is not None and any(s.order is not None for s in styles),
         Patch(facecolor="none", edgecolor=INK, linewidth=2, label=f"block table of {request_label}, from block 0")),
    ]
    return handles + [swatch for drawn, swatch in marks if drawn]


def draw_pools(states: Sequence[PoolState], colours: Mapping[str, str], caption: str,
               request: str | None = None, page_size: int | None = None,
               cross_reads: CrossReads = "now") -> Figure:
    """One panel per pool, side by side at the same cell size, a caption on top, a legend below."""
    shapes = [grid_shape(s.num_pages) for s in states]
    total_cols, max_rows = sum(c for _, c in shapes), max(r for r, _ in shapes)
    cell = min(MAX_CELL_IN, PANELS_WIDTH_IN / total_cols, PANELS_HEIGHT_IN / max_rows)
    left, gap, right, bottom = 0.45, 0.6, 0.25, 0.15
    panels_w = total_cols * cell + gap * (len(states) - 1)
    width = max(7.0, left + panels_w + right)
    caption = textwrap.fill(caption, width=int(width * 11))
    title_lines = max(_panel_title(s, cell * 72, page_size).count("\n") + 1 for s in states)
    top = 0.2 + 0.22 * (caption.count("\n") + 1) + 0.2 + 0.16 * title_lines + 0.35
    tenants = {t for s in states for r, t in zip(s.owner, s.owner_tenant) if r is not None and r == request}
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
             nodes: Sequence[str] | None = None, caption: str | None = None) -> Picture:
    """The page map of every pool (or of `nodes`) after events[0..at] (the whole log when None; -1: boot);
    `request`: whose block table to outline; `cross_reads="ever"`: mark every page read across requests so
    far, not only this step; `caption`: the text on top (default: which moment it is)."""
    events = as_events(log)
    last = len(events) - 1 if at is None else at
    states = replay(events, num_pages, last)
    shown = [states[n] for n in (nodes or states)]
    moment = moment_caption(events, last)
    fig = draw_pools(shown, tenant_colours(e.tenant for e in events), caption or moment, request, page_size,
                     cross_reads)
    return Picture(fig, f"Page map. {moment}. " + "; ".join(f"{s.node}: {counts_text(s)}" for s in shown))
