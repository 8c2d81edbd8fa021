"""What the prefill and decode nodes share: their event helpers, cancel, and freeing a request's pages."""

from __future__ import annotations

from collections.abc import Iterator

from minikv.audit import OwnershipAudit
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer import KVManager
from minikv.events import Event, EventLog
from minikv.page_pool import PagePool
from minikv.request import Sequence, SeqStatus


class Node:
    """One worker of the pair: its name, its pool and audit, the fabric, and its queues."""

    name = "node"

    def __init__(self, pool: PagePool, audit: OwnershipAudit | None, log: EventLog, manager: KVManager,
                 switches: SafetySwitches) -> None:
        self.pool, self.audit, self.log, self.manager, self.switches = pool, audit, log, manager, switches

    def queues(self) -> tuple[list[Sequence], ...]:
        """Every queue that holds this node's live requests."""
        raise NotImplementedError

    def live_ids(self) -> Iterator[str]:
        """Ids of the requests this node still holds."""
        return (seq.request_id for q in self.queues() for seq in q)

    def output_ids(self, request_id: str) -> list[int]:
        """Tokens generated so far for a request this node holds; [] if it holds none."""
        for q in self.queues():
            for seq in q:
                if seq.request_id == request_id:
                    return list(seq.output_ids)
        return []

    def live(self) -> int:
        return sum(len(q) for q in self.queues())

    def check_integrity(self) -> None:
        """Pool bookkeeping is consistent and every page owner is a request this node still holds."""
        self.pool.check_integrity()
        live = set(self.live_ids())
        for p, owner in enumerate(self.pool.owner):
            assert owner is None or owner in live, f"{self.name} page {p} owned by {owner}, which this node does not hold"

    def cancel(self, request_id: str) -> bool:
        """Mark the request finished (abort); the node's gates retire it at their next scan."""
        for q in self.queues():
            for seq in q:
                if seq.request_id == request_id and not seq.finished():
                    seq.finish_reason = "abort"
                    return True
        return False

    def _event(self, step: int, kind: str, seq: Sequence, pages=(), detail: str = "") -> None:
        self.log.add(Event(step, self.name, kind, seq.request_id, seq.tenant, tuple(pages), detail))

    def _stage(self, step: int, seq: Sequence, stage: str) -> None:
        self._event(step, "stage", seq, (), f"{self.name}.{stage}")

    def _free(self, seq: Sequence, step: int, reason: str) -> None:
        """`seq` leaves this node: its pages (if any) go back to the free list, unscrubbed."""
        if seq.block_table:
            self._event(step, "free", seq, seq.block_table, reason)
            self.pool.free(seq.block_table, seq.request_id)
            seq.block_table = []
        seq.status = SeqStatus.FINISHED
