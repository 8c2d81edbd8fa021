"""Per-request state lives only while the request does: a long-running server's memory stays flat."""

from __future__ import annotations

import pytest

from minikv.engine.config import EngineConfig
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.attacks.scenarios import run_scenario
from minikv.disagg.switches import SafetySwitches
from minikv.engine.engine import Engine
from minikv.engine.events import Event, EventLog
from minikv.engine.request import Request


def push(server, n: int) -> None:
    for i in range(n):
        server.submit(Request(f"t{i % 3}: save pin {i:04d}.\n", f"t{i % 3}", 4, request_id=f"c{i}"))
    assert len(server.run()) == n


def test_engine_forgets_a_request_once_its_answer_is_handed_over(tiny):
    """After run(): no held ids, no live sequences, and the audit's name table bounded by its pool."""
    engine = Engine(*tiny, EngineConfig(num_pages=16))
    push(engine, 300)
    assert engine.book.held() == 0 and not engine.seqs and not engine.audit.live
    writers_in_pool = len(set(engine.audit.writers.unique().tolist()))
    assert len(engine.audit.names) <= max(64, 2 * writers_in_pool)


def test_cluster_drops_rooms_senders_and_receivers_once_settled(tiny):
    """After run(): no rooms, endpoints, finished records or held ids remain on the cluster."""
    cluster = Cluster(*tiny, ClusterConfig(prefill_pages=64, decode_pages=64), SafetySwitches.preset("safe"))
    push(cluster, 300)
    assert cluster.book.held() == 0 and not cluster.manager.rooms
    assert not cluster.prefill.endpoints and not cluster.decode.endpoints and not cluster.decode.finished
    for audit in (cluster.prefill_audit, cluster.decode_audit):
        writers_in_pool = len(set(audit.writers.unique().tolist()))
        assert not audit.live and len(audit.names) <= max(64, 2 * writers_in_pool)


def test_a_late_write_still_names_its_victim_after_the_victim_is_gone(tiny):
    """Carol's room outlives her abort until her late batch lands, so the audit still names her to Dave."""
    switches = SafetySwitches.preset("safe").with_switches(disable=["startup_check", "deferred_release", "transfer_batch_cap",
                                                                 "cache_partition"])  # Carol's prompt: past a quota
    result = run_scenario("late-write", *tiny, switches)
    audit = result.cluster.decode_audit
    assert result.cross_tenant_reads > 0 and {e.victim_tenant for e in audit.events} == {"carol"}
    assert not result.cluster.manager.rooms


def test_event_log_limit_keeps_the_most_recent_events():
    """A bounded log never holds more than twice its limit and keeps the newest events."""
    log = EventLog(limit=10)
    for i in range(105):
        log.add(Event(i, "n", "write", f"r{i}", "t"))
    assert len(log.events) < 20 and log.events[-1].step == 104 and log.events[0].step >= 85


def test_event_log_limit_must_be_positive():
    """A zero limit is a configuration error naming the value."""
    with pytest.raises(ValueError, match="event_log_limit"):
        EngineConfig(event_log_limit=0)
    with pytest.raises(ValueError, match="limit"):
        EventLog(limit=0)
