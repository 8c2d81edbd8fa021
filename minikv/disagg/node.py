"""What the prefill and decode nodes share: each owns its pool and audit, a `Scheduler` for its
waiting or running batch, a `ModelRunner`, and its end of the KV transfer (transfer/base.py).
cluster.build_node makes either one, for `Cluster` and for a worker process of `DistCluster` alike.
"""

from transformers import PreTrainedTokenizerBase

from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer.base import KVEndpoint, KVTransfer
from minikv.engine.audit import OwnershipAudit
from minikv.engine.events import Clock, Event, EventLog
from minikv.engine.model_runner import ModelRunner
from minikv.engine.page_pool import PagePool
from minikv.engine.request import CLIENT_CLOSED_REQUEST, Finished, Sequence
from minikv.engine.scheduler import Scheduler
from minikv.model.llama import Llama


class Node:
    """One worker of the pair: its name, pool, audit, scheduler, runner, and transfer endpoints."""
    name = "node"

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase, pool: PagePool,
                 audit: OwnershipAudit | None, log: EventLog, clock: Clock, manager: KVTransfer,
                 switches: SafetySwitches, max_prefill_tokens: int, chunked_prefill: bool = False) -> None:
        self.pool, self.audit, self.log, self.clock = pool, audit, log, clock
        self.manager, self.switches = manager, switches
        self.scheduler = Scheduler(pool, log, self.name, clock, tokenizer, max_prefill_tokens,
                                   chunked=chunked_prefill)
        self.runner = ModelRunner(model, pool, audit, log, self.name)
        self.endpoints: dict[int, KVEndpoint] = {}  # room -> this node's end of the transfer

    def queues(self) -> tuple[list[Sequence], ...]:
        """Every queue that holds this node's live requests."""
        raise NotImplementedError

    def live(self) -> int:
        return sum(len(q) for q in self.queues())

    def report(self) -> dict:
        """What the pair's /health sums: pool occupancy, its audit's cross-tenant reads, KV on the wire."""
        reads = self.audit.cross_tenant_reads if self.audit is not None else 0
        return {**self.pool.occupancy(), "pages_held": self.pool.num_held, "cross_tenant_reads": reads,
                "kv_in_flight": sorted(t.request_id for t in self.manager.rooms.values() if t.in_flight)}

    def check_integrity(self) -> None:
        """Pool bookkeeping is consistent and every page owner is a request this node still holds."""
        self.pool.check_integrity({seq.request_id for queue in self.queues() for seq in queue})

    def admit(self, seq: Sequence) -> None:
        """A request the front door checked joins this node: its room, its audit entry, its first queue."""
        self.manager.open_room(seq.room, seq.request_id, seq.tenant, seq.uid)
        if self.audit is not None:
            self.audit.register(seq.uid, seq.request_id, seq.tenant, seq.prompt_ids)
        self.add(seq)

    def cancel(self, request_id: str) -> bool:
        """Mark the request finished (abort); the node's gates retire it at their next scan."""
        for seq in (s for q in self.queues() for s in q if s.request_id == request_id and not s.finished()):
            seq.abort(CLIENT_CLOSED_REQUEST, "cancelled by the client")  # a mark: the gates end it
            return True
        return False

    def _abort(self, seq: Sequence, status: int, reason: str, detail: str | None = None) -> Finished:
        """End `seq` unserved: its room fails (the other side learns why), logged; the caller frees it."""
        self.endpoints[seq.room].abort(reason, status)
        self._event("finish", seq, (), detail or f"aborted ({int(status)}): {reason}")
        return seq.abort(status, reason)

    def _event(self, kind: str, seq: Sequence, pages=(), detail: str = "") -> None:
        self.log.add(Event(self.clock.now, self.name, kind, seq.request_id, seq.tenant, tuple(pages), detail))

    def _stage(self, seq: Sequence, stage: str) -> None:
        self._event("stage", seq, (), f"{self.name}.{stage}")

    def _release(self, seq: Sequence, reason: str) -> None:
        """`seq` leaves this node: its pages go back (unscrubbed) and its end of the room closes."""
        self.scheduler.release(seq, reason)
        self.endpoints.pop(seq.room).close()

