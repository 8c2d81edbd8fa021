"""Pictures of the page pool and widgets that replay an engine's history (docs/pictures.md).

- `replay(log, num_pages, upto)`: every pool's state after a prefix of the event log (pure);
- `page_map(log, num_pages, at=..., request=...)`: one cell per page, coloured by tenant;
- `ReplayWidget(log, num_pages).show()` / `show_replay(...)`: Play, slider, previous/next;
- `timeline(log)` and `ttft_plot(responses, mark=...)`: requests over time.
"""

from minikv.viz.captions import describe
from minikv.viz.page_map import PageStyle, page_map, page_styles
from minikv.viz.palette import tenant_colours
from minikv.viz.picture import Picture
from minikv.viz.queues import queues_at, stage_spans
from minikv.viz.replay import PageStatus, PoolState, find_event, frame_indices, replay
from minikv.viz.timeline import timeline, ttft_plot
from minikv.viz.widget import ReplayWidget, show_replay

__all__ = [
    "PageStatus", "PageStyle", "Picture", "PoolState", "ReplayWidget", "describe", "find_event",
    "frame_indices", "page_map", "page_styles", "queues_at", "replay", "show_replay", "stage_spans",
    "tenant_colours", "timeline", "ttft_plot",
]
