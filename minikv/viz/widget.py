"""A player for an engine's history: Play, a slider, previous/next, and the page map of each moment.

The widget replays the event log (`minikv.viz.replay`) up to the chosen frame and draws every
pool side by side (`minikv.viz.page_map`), with a caption for the event and, when the log has
queue stages, which requests sit in which queue. Play and the slider are linked in the browser
(`jslink`), so they move together even in an exported page; drawing needs the kernel.

A notebook that is read without a widget front end (a static HTML export, a viewer without
JavaScript) would show nothing, so the widget's output also carries a PNG of the frame it opens
on, as a fallback in the same output: JupyterLab draws the live player only, a viewer that cannot
draws the still. Every text the widget shows is deterministic, as nbval requires.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping, Sequence

import ipywidgets as widgets
from IPython.display import display
from matplotlib.figure import Figure

from minikv.engine.events import Event, EventLog
from minikv.viz.captions import frame_caption
from minikv.viz.page_map import CrossReads, PageStyle, draw_pools, page_styles
from minikv.viz.palette import CROSS_READ, tenant_colours
from minikv.viz.picture import figure_png
from minikv.viz.queues import queues_at
from minikv.viz.replay import FrameMode, PoolState, as_events, frame_indices, pool_sizes, replay

BOOT = -1  # the frame before the first event


class ReplayWidget(widgets.VBox):
    """Step through `log`, one frame per event that changes the picture (see `frame_indices`).

    Args:
        log: the engine's `EventLog` (one log for all nodes), or a list of events.
        num_pages: pages per pool: one number, or {node: pages} for several nodes.
        frames: "changes" (default), "all" events, or the last event of each engine "steps".
        request: whose block table to outline; None follows the current event's request.
        page_size: tokens per page, for the panel titles.
        nodes: which pools to draw, in order (default: every node).
        start: open at the last frame at or before this event index (default: the last frame).
        cross_reads: mark pages read across tenants during the current step ("now") or ever.
    """

    def __init__(self, log: EventLog | Iterable[Event], num_pages: int | Mapping[str, int],
                 frames: FrameMode = "changes", request: str | None = None, page_size: int | None = None,
                 nodes: Sequence[str] | None = None, start: int | None = None,
                 cross_reads: CrossReads = "now", interval_ms: int = 700) -> None:
        self.events = as_events(log)
        self.num_pages = pool_sizes(self.events, num_pages)
        self.nodes = list(nodes or self.num_pages)
        self.frames = [BOOT] + frame_indices(self.events, frames)  # event index shown by each frame
        self.request, self.page_size, self.cross_reads = request, page_size, cross_reads
        self.colours = tenant_colours(e.tenant for e in self.events)
        last = len(self.frames) - 1
        opening = last if start is None else max(i for i, e in enumerate(self.frames) if e <= start)

        self.play = widgets.Play(value=opening, min=0, max=last, step=1, interval=interval_ms, description="Play")
        self.slider = widgets.IntSlider(value=opening, min=0, max=last, step=1, description="frame",
                                        continuous_update=False, layout=widgets.Layout(width="420px"))
        self.link = widgets.jslink((self.play, "value"), (self.slider, "value"))  # works with no kernel
        self.previous = widgets.Button(description="◀ previous", tooltip="one frame back", layout=widgets.Layout(width="110px"))
        self.next = widgets.Button(description="next ▶", tooltip="one frame on", layout=widgets.Layout(width="110px"))
        self.previous.on_click(lambda _: self._move(-1))
        self.next.on_click(lambda _: self._move(+1))
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.queue = widgets.HTML()
        self.slider.observe(lambda change: self.show_frame(change["new"]), names="value")
        controls = widgets.HBox([self.previous, self.play, self.slider, self.next])
        super().__init__([controls, self.caption, self.image, self.queue])
        self.show_frame(opening)

    # -- moving ---------------------------------------------------------------------------
    def _move(self, delta: int) -> None:
        self.slider.value = min(max(self.slider.value + delta, 0), self.slider.max)

    @property
    def position(self) -> int:
        """The frame on show (0 is boot)."""
        return self.slider.value

    @property
    def event_index(self) -> int:
        """Index in the log of the last event applied in the frame on show (-1 at boot)."""
        return self.frames[self.position]

    @property
    def event(self) -> Event | None:
        return self.events[self.event_index] if self.event_index >= 0 else None

    # -- what the frame shows ----------------------------------------------------------------
    def outlined_request(self) -> str | None:
        """The request whose block table is outlined: the one asked for, or the current event's."""
        if self.request is not None:
            return self.request
        return self.event.request_id if self.event is not None else None

    def states(self) -> dict[str, PoolState]:
        """Every drawn pool as it was in the frame on show."""
        states = replay(self.events, self.num_pages, self.event_index)
        return {n: states[n] for n in self.nodes}

    def styles(self) -> dict[str, list[PageStyle]]:
        """How every page of every drawn pool looks in the frame on show."""
        return {n: page_styles(s, self.colours, self.outlined_request(), self.cross_reads)
                for n, s in self.states().items()}

    def queues(self) -> dict[str, list[str]]:
        """Each queue stage's requests in the frame on show."""
        return queues_at(self.events, self.event_index)

    def caption_text(self) -> str:
        return frame_caption(self.position, len(self.frames) - 1, self.events, self.event_index)

    def figure(self) -> Figure:
        """The page map of the frame on show."""
        return draw_pools(list(self.states().values()), self.colours, self.caption_text(),
                          self.outlined_request(), self.page_size, self.cross_reads)

    def show_frame(self, position: int) -> None:
        """Draw frame `position` (the slider calls this whenever it moves)."""
        if self.slider.value != position:
            self.slider.value = position  # the observer comes back here
            return
        text = html.escape(self.caption_text())
        alarm = self.event is not None and self.event.kind == "cross_read"
        colour = f"color:{CROSS_READ};font-weight:bold;" if alarm else ""
        self.caption.value = f"<div style='font-family:monospace;{colour}'>{text}</div>"
        self.image.value = figure_png(self.figure())
        self.queue.value = _queue_table(self.queues())

    # -- showing it -----------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The live widget, with a PNG of the frame on show for front ends that cannot draw widgets."""
        bundle = super()._repr_mimebundle_(**kwargs)
        return bundle | {"image/png": base64.b64encode(bytes(self.image.value)).decode("ascii")}

    def show(self) -> None:
        """Display the widget (its output carries the still PNG, see the module's docstring)."""
        display(self)

    def __repr__(self) -> str:
        pools = ", ".join(f"{n} {self.num_pages[n]} pages" for n in self.nodes)
        return f"ReplayWidget({len(self.events)} events, {len(self.frames)} frames; {pools})"


def _queue_table(queues: Mapping[str, list[str]]) -> str:
    """The queues as a small HTML table; empty when the log has no stages."""
    if not queues:
        return ""
    rows = "".join(
        f"<tr><td style='padding-right:1em'><b>{html.escape(stage)}</b></td>"
        f"<td>{html.escape(', '.join(who)) if who else '<i>empty</i>'}</td></tr>"
        for stage, who in queues.items()
    )
    return f"<table style='font-family:monospace;font-size:12px'>{rows}</table>"


def show_replay(log: EventLog | Iterable[Event], num_pages: int | Mapping[str, int], **options) -> None:
    """Display a `ReplayWidget` (options as its arguments), a still PNG of its opening frame inside."""
    ReplayWidget(log, num_pages, **options).show()
