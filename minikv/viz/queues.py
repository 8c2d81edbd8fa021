"""Where each request is in the serving pipeline, step by step, from the event log's `stage` events
(or, on a single node, from `submit` to `allocate` to leaving). The rules: docs/pictures.md."""

from collections.abc import Iterable
from dataclasses import dataclass

from minikv.engine.events import Event, EventLog
from minikv.viz.replay import as_events

STAGE_SEQUENCE = ("bootstrap", "waiting", "inflight", "prealloc", "transfer", "running")
LEAVING_KINDS = ("finish", "cancel", "reject")
WIRE_STAGE = "fabric.on the wire"  # the lane of KV batches between posting and landing


@dataclass(frozen=True)
class Transition:
    """A request entered `stage` (or left the queues, stage None) at event `index`."""
    index: int
    step: int
    request_id: str
    tenant: str
    stage: str | None
    outcome: str = ""  # for a departure: finish, cancel or reject


@dataclass
class StageSpan:
    """A request sat in `stage` from step `start` to step `end` (end None: still there)."""
    request_id: str
    tenant: str
    stage: str
    start: int
    end: int | None = None


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
        elif e.kind in ("submit", "preempt"):
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
    """Each stage's requests ("tenant/request-id", in order of arrival) after events[0..upto];
    every stage the log ever names is a key, so empty queues show as empty lists."""
    events = as_events(log)
    where: dict[str, tuple[str, str]] = {}  # request id -> (stage, label); dict keeps arrival order
    for t in transitions(events):
        if t.index > upto:
            break
        where.pop(t.request_id, None)
        if t.stage is not None:
            where[t.request_id] = (t.stage, f"{t.tenant}/{t.request_id}")
    queues: dict[str, list[str]] = {s: [] for s in stage_order(events)}
    for stage, label in where.values():
        queues[stage].append(label)
    return queues


def _close(open_spans: dict[object, StageSpan], key: object, step: int) -> None:
    if key in open_spans:
        open_spans.pop(key).end = step


def stage_spans(log: EventLog | Iterable[Event]) -> list[StageSpan]:
    """Every stretch of steps a request spent in one stage, in the order they began: one stage per
    node (its lane) at a time, until its next stage there, that node's free, or leaving the queues."""
    events = as_events(log)
    spans: list[StageSpan] = []
    open_spans: dict[object, StageSpan] = {}  # (request id, lane), or a single node's request id -> its current stretch
    if not any(e.kind == "stage" for e in events):  # one node: waiting, then running
        for t in transitions(events):
            _close(open_spans, t.request_id, t.step)
            if t.stage is not None:
                open_spans[t.request_id] = StageSpan(t.request_id, t.tenant, t.stage, t.step)
                spans.append(open_spans[t.request_id])
        return spans
    for e in events:
        if e.kind == "stage":
            key = (e.request_id, e.detail.partition(".")[0])
            _close(open_spans, key, e.step)
            open_spans[key] = StageSpan(e.request_id, e.tenant, e.detail, e.step)
            spans.append(open_spans[key])
        elif e.kind in LEAVING_KINDS:
            for key in [k for k in open_spans if k[0] == e.request_id]:
                _close(open_spans, key, e.step)
        elif e.kind == "free":
            _close(open_spans, (e.request_id, e.node), e.step)
    return spans


def wire_spans(log: EventLog | Iterable[Event]) -> list[StageSpan]:
    """Every KV batch a request posted, from its `post` to the write that landed it (end None: never);
    batches land in the order they were posted, so a landing closes the oldest."""
    spans: list[StageSpan] = []
    posted: dict[str, list[StageSpan]] = {}  # request id -> its batches still on the wire
    for e in as_events(log):
        if e.kind == "post":
            spans.append(StageSpan(e.request_id, e.tenant, WIRE_STAGE, e.step))
            posted.setdefault(e.request_id, []).append(spans[-1])
        elif e.kind == "write" and e.node == "decode" and "landed" in e.detail.lower() and posted.get(e.request_id):
            posted[e.request_id].pop(0).end = e.step
    return spans
