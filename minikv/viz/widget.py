"""A player for an engine's history: Play, a slider, previous/next, and the page map of each frame; the output
also carries a PNG of the opening frame for viewers without widgets (docs/pictures.md)."""

import base64
import html
from collections.abc import Iterable, Mapping, Sequence

import ipywidgets as widgets
from IPython.display import display

from minikv.engine.events import Event, EventLog
from minikv.viz.captions import moment_caption
from minikv.viz.page_map import CrossReads, PageStyle, page_map, page_styles
from minikv.viz.palette import CROSS_READ, tenant_colours
from minikv.viz.queues import queues_at
from minikv.viz.replay import FrameMode, as_events, frame_indices, pool_sizes, replay

BOOT = -1  # the frame before the first event


class ReplayWidget(widgets.VBox):
    """Step through `log`, one frame per event that changes the picture (`frames`: see `frame_indices`).
    `num_pages`: one size, or {node: pages}; `request`: whose block table to outline (None: the current
    event's); `start`: open at the last frame at or before this event index (None: the last frame);
    `page_size`, `nodes` and `cross_reads` as in `page_map` (docs/pictures.md)."""

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
                                        continuous_update=False, layout={"width": "420px"})
        self.link = widgets.jslink((self.play, "value"), (self.slider, "value"))  # works with no kernel
        self.previous = widgets.Button(description="◀ previous", tooltip="one frame back", layout={"width": "110px"})
        self.next = widgets.Button(description="next ▶", tooltip="one frame on", layout={"width": "110px"})
        self.previous.on_click(lambda _: self._move(-1))
        self.next.on_click(lambda _: self._move(+1))
        self.caption, self.image, self.queue = widgets.HTML(), widgets.Image(format="png"), widgets.HTML()
        self.slider.observe(lambda change: self.show_frame(change["new"]), names="value")
        controls = widgets.HBox([self.previous, self.play, self.slider, self.next])
        super().__init__([controls, self.caption, self.image, self.queue])
        self.show_frame(opening)

    def _move(self, delta: int) -> None:
        self.slider.value = min(max(self.slider.value + delta, 0), self.slider.max)

    @property
    def event_index(self) -> int:
        """Index in the log of the last event applied in the frame on show (the slider's; -1 at boot)."""
        return self.frames[self.slider.value]

    @property
    def event(self) -> Event | None:
        return self.events[self.event_index] if self.event_index >= 0 else None

    def outlined_request(self) -> str | None:
        """The request whose block table is outlined: the one asked for, or the current event's."""
        if self.request is not None:
            return self.request
        return self.event.request_id if self.event is not None else None

    def styles(self) -> dict[str, list[PageStyle]]:
        """How every page of every drawn pool looks in the frame on show."""
        states = replay(self.events, self.num_pages, self.event_index)
        return {n: page_styles(states[n], self.colours, self.outlined_request(), self.cross_reads) for n in self.nodes}

    def queues(self) -> dict[str, list[str]]:
        """Each queue stage's requests in the frame on show."""
        return queues_at(self.events, self.event_index)

    def caption_text(self) -> str:
        """The moment, named as a page map of it names it, so a still and the player agree."""
        return f"Frame {self.slider.value}/{len(self.frames) - 1}. {moment_caption(self.events, self.event_index)}"

    def show_frame(self, position: int) -> None:
        """Draw frame `position` (the slider calls this whenever it moves)."""
        if self.slider.value != position:
            self.slider.value = position  # the observer comes back here
            return
        alarm = self.event is not None and self.event.kind == "cross_read"
        colour = f"color:{CROSS_READ};font-weight:bold;" if alarm else ""
        picture = page_map(self.events, self.num_pages, at=self.event_index, request=self.outlined_request(),
                           page_size=self.page_size, cross_reads=self.cross_reads, nodes=self.nodes,
                           caption=self.caption_text()).png()
        rows = "".join(f"<tr><td style='padding-right:1em'><b>{html.escape(stage)}</b></td>"
                       f"<td>{html.escape(', '.join(who)) if who else '<i>empty</i>'}</td></tr>"
                       for stage, who in self.queues().items())
        # drawn first, then shown together: a caption sent before its picture is drawn runs a frame ahead
        self.image.value = picture
        caption = html.escape(self.caption_text())
        self.caption.value = f"<div style='font-family:monospace;{colour}'>{caption}</div>"
        self.queue.value = f"<table style='font-family:monospace;font-size:12px'>{rows}</table>" if rows else ""

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The live widget, with a PNG of the frame on show for front ends that cannot draw widgets."""
        bundle = super()._repr_mimebundle_(**kwargs)
        return bundle | {"image/png": base64.b64encode(bytes(self.image.value)).decode("ascii")}

    def show(self) -> None:
        """Display the widget (its output carries the still PNG)."""
        display(self)

    def __repr__(self) -> str:
        pools = ", ".join(f"{n} {self.num_pages[n]} pages" for n in self.nodes)
        return f"ReplayWidget({len(self.events)} events, {len(self.frames)} frames; {pools})"


def show_replay(log: EventLog | Iterable[Event], num_pages: int | Mapping[str, int], **options) -> None:
    """Display a `ReplayWidget` (options as its arguments), a still PNG of its opening frame inside."""
    ReplayWidget(log, num_pages, **options).show()
