"""One plain sentence per event, for the caption under a page map or a step-through widget."""

from __future__ import annotations

from collections.abc import Sequence

from minikv.engine.events import Event


def _pages(n: int) -> str:
    return f"{n} page" if n == 1 else f"{n} pages"


def describe(event: Event) -> str:
    """What `event` means, in words: e.g. "decode reserved 56 pages for bob/req-7"."""
    who, node, n = f"{event.tenant}/{event.request_id}", event.node, len(event.pages)
    detail = f" ({event.detail})" if event.detail else ""
    if event.kind == "submit":
        return f"{who} arrived at {node}{detail}"
    if event.kind == "reject":
        return f"{node} refused {who} with a 400{detail}"
    if event.kind == "allocate":
        return f"{node} reserved {_pages(n)} for {who}"
    if event.kind == "cache_hit":
        return f"{who} took {_pages(n)} from {node}'s prefix cache{detail}"
    if event.kind == "write":
        return f"{node} wrote {who}'s K/V into {_pages(n)}{detail}"
    if event.kind == "read":
        return f"{who} attended over {_pages(n)} on {node}"
    if event.kind == "cross_read":
        victim = event.detail.removeprefix("victim=")
        if victim == "never-written":
            return f"UNWRITTEN READ on {node}: {who} read {_pages(n)} nobody had written"
        same = victim.partition("/")[0] == event.tenant
        return f"{'CROSS-REQUEST' if same else 'CROSS-TENANT'} READ on {node}: {who} read {_pages(n)} written by {victim}"
    if event.kind == "free":
        return f"{node} freed {who}'s {_pages(n)}, data left in place{detail}"
    if event.kind == "preempt":
        return f"{node} preempted {who}: {_pages(n)} returned, to be recomputed"
    if event.kind == "finish":
        return f"{who} finished on {node}{detail}"
    if event.kind == "cancel":
        return f"{who} was cancelled on {node}"
    if event.kind == "stage":
        return f"{who} moved to {event.detail}"
    return str(event)


def moment_caption(events: Sequence[Event], at: int) -> str:
    """Which moment a picture after events[0..at] shows, in words (-1: at boot)."""
    if at < 0:
        return "At boot: every page free and never written"
    e = events[at]
    return f"After event {at + 1} of {len(events)} (step {e.step}): {describe(e)}"


def frame_caption(position: int, last: int, events: Sequence[Event], at: int) -> str:
    """The caption of frame `position` of 0..`last`, which shows the pools after events[0..at].

    It names the event as a page map of the same moment does, so a still and the player agree."""
    return f"Frame {position}/{last}. {moment_caption(events, at)}"
