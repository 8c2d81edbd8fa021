"""Where each request is in the serving pipeline, step by step, from `stage` events.

The disaggregated engine logs a `stage` event whenever a request moves between queues
(prefill *bootstrap -> waiting -> inflight*, decode *prealloc -> transfer -> running*, the
vocabulary of SGLang's disaggregation code). A single-node engine logs no stages; there a
request is "<node>.waiting" from `submit` until `allocate` and "<node>.running" until it
leaves (a `preempt` puts it back to waiting). A `finish`, `cancel` or `reject` takes a request
out of the queues; a later `stage` event (say, a rejected prompt that moves on regardless)
puts it back, because that is what the engine did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from minikv.engine.events import Event, EventLog
from minikv.viz.replay import as_events

STAGE_SEQUENCE = ("bootstrap", "waiting", "inflight", "prealloc", "transfer", "running")
LEAVING_KINDS = ("finish", "cancel", "reject")


@dataclass(frozen=True)
class Transition:
    """A request entered `stage` (or left the queues, stage None) at event `index`."""

    index: int
    step: int
    request_id: str
    tenant: str
    stage: str | None
    outcome: str = ""  # for a departure: finish, cancel or reject


@dataclass(frozen=True)
class StageSpan:
    """A request sat in `stage` from step `start` to step `end` (end None: still there)."""

    request_id: str
    tenant: str
    stage: str
    start: int
    end: int | None


def transitions(log: EventLog | Iterable[Event]) -> list[Transition]:
    """Every stage change of every request, in log order."""
    events = as_events(log)
    explicit = any(e.kind == "stage" for e in events)
    current: dict[str, str | None] = {}
    found: list[Transition] = []
    for i, e in enumerate(events):
        if e.kind in LEAVING_KINDS:
            stage, outcome = None, e.kind
        elif explicit:
            stage, outcome = (e.detail, "") if e.kind == "stage" else (None, None)
        elif e.kind == "submit" or e.kind == "preempt":
            stage, outcome = f"{e.node}.waiting", ""
        elif e.kind == "allocate":
            stage, outcome = f"{e.node}.running", ""
        else:
            stage, outcome = None, None
        if outcome is None or (e.request_id in current and current[e.request_id] == stage and not outcome):
            continue  # not a stage change (a second allocate while running, a read, a write...)
        current[e.request_id] = stage
        found.append(Transition(i, e.step, e.request_id, e.tenant, stage, outcome))
    return found


def stage_order(log: EventLog | Iterable[Event]) -> list[str]:
    """Every stage named in the log, prefill's before decode's, each node's in pipeline order."""
    stages = list(dict.fromkeys(t.stage for t in transitions(log) if t.stage is not None))
    prefixes = list(dict.fromkeys(s.partition(".")[0] for s in stages))

    def key(stage: str) -> tuple[int, int, int]:
        prefix, _, suffix = stage.partition(".")
        rank = STAGE_SEQUENCE.index(suffix) if suffix in STAGE_SEQUENCE else len(STAGE_SEQUENCE)
        return prefixes.index(prefix), rank, stages.index(stage)

    return sorted(stages, key=key)


def queues_at(log: EventLog | Iterable[Event], upto: int) -> dict[str, list[str]]:
    """Each stage's requests ("tenant/request-id", in order of arrival) after events[0..upto].

    Every stage the whole log ever names is a key, so empty queues show as empty lists.
    """
    events = as_events(log)
    moves = transitions(events)
    where: dict[str, tuple[str, str]] = {}  # request id -> (stage, label); dict keeps arrival order
    for t in moves:
        if t.index > upto:
            break
        where.pop(t.request_id, None)
        if t.stage is not None:
            where[t.request_id] = (t.stage, f"{t.tenant}/{t.request_id}")
    queues: dict[str, list[str]] = {s: [] for s in stage_order(events)}
    for stage, label in where.values():
        queues[stage].append(label)
    return queues


def stage_spans(log: EventLog | Iterable[Event]) -> list[StageSpan]:
    """Every stretch of steps a request spent in one stage, in the order they began.

    A request sits in one stage *per node* at a time (its lane, the stage's prefix): in
    disaggregated serving the decode node preallocates and waits for the transfer while the
    prefill node still works, so a request's prefill and decode stretches overlap. A stretch ends
    when the request enters another stage of the same node, when that node frees the request's
    pages (it is done with it), or when the request leaves the queues.
    """
    events = as_events(log)
    if not any(e.kind == "stage" for e in events):
        return _single_node_spans(events)
    spans: list[StageSpan] = []
    open_span: dict[tuple[str, str], int] = {}  # (request id, lane) -> index in spans

    def close(key: tuple[str, str], step: int) -> None:
        if key in open_span:
            i = open_span.pop(key)
            old = spans[i]
            spans[i] = StageSpan(old.request_id, old.tenant, old.stage, old.start, step)

    for e in events:
        if e.kind == "stage":
            key = (e.request_id, e.detail.partition(".")[0])
            close(key, e.step)
            open_span[key] = len(spans)
            spans.append(StageSpan(e.request_id, e.tenant, e.detail, e.step, None))
        elif e.kind in LEAVING_KINDS:
            for key in [k for k in open_span if k[0] == e.request_id]:
                close(key, e.step)
        elif e.kind == "free":
            close((e.request_id, e.node), e.step)
    return spans


def _single_node_spans(events: list[Event]) -> list[StageSpan]:
    """A single-node engine's stretches: waiting, then running, from the implicit transitions."""
    spans: list[StageSpan] = []
    open_span: dict[str, int] = {}  # request id -> index in spans of its current stretch
    for t in transitions(events):
        if t.request_id in open_span:
            i = open_span.pop(t.request_id)
            old = spans[i]
            spans[i] = StageSpan(old.request_id, old.tenant, old.stage, old.start, t.step)
        if t.stage is not None:
            open_span[t.request_id] = len(spans)
            spans.append(StageSpan(t.request_id, t.tenant, t.stage, t.step, None))
    return spans


WIRE_STAGE = "fabric.on the wire"  # the lane of KV batches between posting and landing


def wire_spans(log: EventLog | Iterable[Event]) -> list[StageSpan]:
    """Every KV batch a request posted, from its `post` to the write that landed it (end None: never).

    Batches land in the order they were posted (one in flight per bootstrap room), so each
    landing write on the decode node, on time or late, closes the request's oldest open batch.
    """
    spans: list[StageSpan] = []
    posted: dict[str, list[int]] = {}  # request id -> indices in spans of batches still on the wire
    for e in as_events(log):
        if e.kind == "post":
            posted.setdefault(e.request_id, []).append(len(spans))
            spans.append(StageSpan(e.request_id, e.tenant, WIRE_STAGE, e.step, None))
        elif e.kind == "write" and e.node == "decode" and "landed" in e.detail.lower() and posted.get(e.request_id):
            i = posted[e.request_id].pop(0)
            old = spans[i]
            spans[i] = StageSpan(old.request_id, old.tenant, old.stage, old.start, e.step)
    return spans


def departures(log: EventLog | Iterable[Event]) -> dict[str, Transition]:
    """How and when each request last left the queues (finish, cancel or reject)."""
    return {t.request_id: t for t in transitions(log) if t.stage is None}
