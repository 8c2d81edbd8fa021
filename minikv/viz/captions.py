"""One plain sentence per event, for the caption under a page map or a step-through widget."""

from collections.abc import Sequence

from minikv.engine.events import Event
from minikv.viz.replay import reads_unwritten

SENTENCES = {  # {who} is tenant/request-id, {pages} "n pages", {detail} " (the event's detail)" when it has one
    "submit": "{who} arrived at {node}{detail}",
    "reject": "{node} refused {who} with a 400{detail}",
    "allocate": "{node} reserved {pages} for {who}",
    "cache_hit": "{who} took {pages} from {node}'s prefix cache{detail}",
    "write": "{node} wrote {who}'s K/V into {pages}{detail}",
    "read": "{who} attended over {pages} on {node}",
    "free": "{node} freed {who}'s {pages}, data left in place{detail}",
    "preempt": "{node} preempted {who}: {pages} returned, to be recomputed",
    "finish": "{who} finished on {node}{detail}",
    "cancel": "{who} was cancelled on {node}",
    "stage": "{who} moved to {stage}",
}


def describe(event: Event) -> str:
    """What `event` means, in words: e.g. "decode reserved 56 pages for bob/req-7"."""
    who, node, n = f"{event.tenant}/{event.request_id}", event.node, len(event.pages)
    pages = f"{n} page" if n == 1 else f"{n} pages"
    if event.kind == "cross_read":
        if reads_unwritten(event):
            return f"UNWRITTEN READ on {node}: {who} read {pages} nobody had written"
        victim = event.detail.removeprefix("victim=")
        same = victim.partition("/")[0] == event.tenant
        return f"{'CROSS-REQUEST' if same else 'CROSS-TENANT'} READ on {node}: {who} read {pages} written by {victim}"
    if event.kind not in SENTENCES:
        return str(event)
    detail = f" ({event.detail})" if event.detail else ""
    return SENTENCES[event.kind].format(who=who, node=node, pages=pages, detail=detail, stage=event.detail)


def moment_caption(events: Sequence[Event], at: int) -> str:
    """Which moment a picture after events[0..at] shows, in words (-1: at boot)."""
    if at < 0:
        return "At boot: every page free and never written"
    return f"After event {at + 1} of {len(events)} (step {events[at].step}): {describe(events[at])}"
