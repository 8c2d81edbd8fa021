"""The decode node: reserves pages, receives a prompt's KV, and generates the reply.

Queues, as in SGLang's decode side:
    prealloc   the request arrives with its prompt *length*; a KVReceiver is created and the
               node **preallocates KV for the original input length plus the output**, then
               advertises those pages to prefill (send_metadata).
    transfer   polled until the KV has arrived (Success) or the transfer failed.
    running    the decode batch: one token per step for every request, no prefill forward.

Pages are reserved whole at prealloc, so a running request never needs another page. What the
node checks before decoding over pages it never wrote itself is up to the switches:
`kv_checksum` (count and Adler-32 of what arrived) and `kv_canary` (the poison left in the
reserved pages must be gone). `deferred_release` holds an aborted request's pages until no
write aimed at them is still in the network.

The two checks see different things. The canary works page by page: it finds a prompt page the
transfer never wrote, not stale slots inside a page it did write. A transfer copies whole pages,
so when an over-length prompt fits in the one page sent (a prefill pool of one page and a prompt
of exactly one page), that page arrives whole: its slots past the 1-token placeholder carry
whatever the prefill pool last held, no poison survives, and `kv_canary` alone lets the leak
through. `kv_checksum` still catches it by the token count (1 sent, 8 in the prompt).
`tests/test_kv_checks.py` pins which check catches what.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from minikv.audit import OwnershipAudit
from minikv.disagg.checksum import kv_checksum
from minikv.disagg.node import Node
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer import KVManager, KVPoll, KVReceiver
from minikv.events import EventLog
from minikv.model import Llama
from minikv.model_runner import ModelRunner
from minikv.page_pool import PagePool
from minikv.postprocess import Sampled, postprocess
from minikv.request import Sequence, SeqStatus
from minikv.response import CLIENT_CLOSED_REQUEST

CANARY = -1234.5  # a value no real key or value will hold


@dataclass
class Outcome:
    """How a request left the decode node: the status, and the error when not 200."""

    seq: Sequence
    status: int
    error: str | None = None


class DecodeNode(Node):
    """One decode worker with its own pool."""

    name = "decode"

    def __init__(self, model: Llama, pool: PagePool, audit: OwnershipAudit | None, log: EventLog,
                 manager: KVManager, switches: SafetySwitches, eos_id: int) -> None:
        super().__init__(pool, audit, log, manager, switches)
        self.eos_id = eos_id
        self.runner = ModelRunner(model, pool, audit, log, "decode")
        self.prealloc_queue: list[Sequence] = []
        self.transfer_queue: list[Sequence] = []
        self.running: list[Sequence] = []
        self.receivers: dict[int, KVReceiver] = {}
        self.pending_release: list[Sequence] = []  # aborted, pages held until writes settle
        self.outcomes: list[Outcome] = []  # how requests left, until the cluster takes them

    def queues(self) -> tuple[list[Sequence], ...]:
        return self.prealloc_queue, self.transfer_queue, self.running, self.pending_release

    def take_outcomes(self) -> list[Outcome]:
        """The outcomes since the last call, handed over once."""
        out, self.outcomes = self.outcomes, []
        return out

    def add(self, seq: Sequence, step: int) -> None:
        self.receivers[seq.room] = KVReceiver(self.manager, seq.room)
        need = self.pool.pages_for(len(seq.prompt_ids) + seq.max_tokens)
        if need > self.pool.num_pages:  # could never be preallocated: refuse rather than wait forever
            self._abort(seq, step, HTTPStatus.BAD_REQUEST, f"request needs {len(seq.prompt_ids) + seq.max_tokens} tokens of KV cache; "
                                        f"the decode node's pool holds at most {self.pool.capacity_tokens} tokens")
            return
        self.prealloc_queue.append(seq)
        self._stage(step, seq, "prealloc")

    def gate(self, seq: Sequence) -> tuple[int, str] | None:
        """The decode-side abort scan: None to go on, else (status, reason) to retire `seq`.

        It asks finished() (a client cancel sets that); only with reject_check does it also
        read to_finish, the abort that intake decided but never applied.
        """
        if seq.finished():
            return CLIENT_CLOSED_REQUEST, "cancelled by the client"
        if self.switches.reject_check and seq.to_finish is not None:
            return HTTPStatus.BAD_REQUEST, seq.to_finish
        return None

    # -- one step ----------------------------------------------------------------------------
    def step(self, step: int) -> None:
        """One tick. The running batch decodes first; requests whose KV arrived join it on the
        next tick (the batch is formed when the step starts)."""
        self._release_settled(step)
        self._prealloc(step)
        self._decode(step)
        self._poll_transfers(step)

    def _prealloc(self, step: int) -> None:
        for seq in list(self.prealloc_queue):
            retire = self.gate(seq)
            if retire:
                self.prealloc_queue.remove(seq)
                self._abort(seq, step, *retire)
                continue
            receiver = self.receivers[seq.room]
            if receiver.poll() is KVPoll.Failed:
                self.prealloc_queue.remove(seq)
                t = receiver.transfer
                self._abort(seq, step, t.failure_status, t.failure)
                continue
            need = self.pool.pages_for(len(seq.prompt_ids) + seq.max_tokens)  # the ORIGINAL length
            if not self.pool.can_allocate(need):
                continue  # wait for pages; first come, first served is kept by the loop order
            seq.block_table = self.pool.allocate(need, seq.request_id)
            self._event(step, "allocate", seq, seq.block_table,
                        f"decode reserved {need} pages for {len(seq.prompt_ids)} prompt + {seq.max_tokens} output tokens")
            if self.switches.kv_canary:
                self.pool.kv[:, :, seq.block_table] = CANARY  # poison: must be overwritten by the transfer
            receiver.send_metadata(seq.block_table)
            self.prealloc_queue.remove(seq)
            self.transfer_queue.append(seq)
            self._stage(step, seq, "transfer")

    def _poll_transfers(self, step: int) -> None:
        for seq in list(self.transfer_queue):
            receiver = self.receivers[seq.room]
            state = receiver.poll()
            retire = self.gate(seq)
            if retire:
                self.transfer_queue.remove(seq)
                self._abort(seq, step, *retire)
            elif state is KVPoll.Failed:
                self.transfer_queue.remove(seq)
                t = receiver.transfer
                self._abort(seq, step, t.failure_status, t.failure)
            elif state is KVPoll.Success:
                self.transfer_queue.remove(seq)
                problem = self.verify(seq, receiver)
                if problem:
                    self._abort(seq, step, HTTPStatus.INTERNAL_SERVER_ERROR, problem)
                    continue
                shipment = receiver.transfer.shipment
                if shipment.sampler_state is not None:  # go on with the random stream prefill drew from
                    seq.generator.set_state(shipment.sampler_state)
                seq.cached_tokens = shipment.cached_tokens
                seq.status = SeqStatus.RUNNING
                self.running.append(seq)
                self._stage(step, seq, "running")
                # the node now believes the whole prompt is cached; the first token reaches the client
                self._postprocess(step, [seq], [Sampled(shipment.first_token)], [len(seq.prompt_ids)])

    def verify(self, seq: Sequence, receiver: KVReceiver) -> str | None:
        """Checks before decoding over KV this node did not compute; the reason if one fails."""
        t = receiver.transfer
        n = len(seq.prompt_ids)
        if self.switches.kv_checksum:
            if t.shipment.num_tokens != n:
                return f"KV checksum failed: prefill sent KV for {t.shipment.num_tokens} token(s), the prompt has {n}"
            if t.shipment.checksum != kv_checksum(self.pool, seq.block_table, n):
                return "KV checksum failed: the KV that arrived differs from what prefill sent"
        if self.switches.kv_canary:
            k0 = self.pool.kv[0, 0]  # (P, page, KVH, D) layer 0 keys
            ps = self.pool.page_size
            poisoned = [p for i, p in enumerate(seq.block_table[: self.pool.pages_for(n)])
                        if bool((k0[p, : min(ps, n - i * ps), 0, 0] == CANARY).any())]
            if poisoned:
                return (f"KV canary intact in {len(poisoned)} of {self.pool.pages_for(n)} prompt pages: "
                        f"their KV never arrived")
        return None

    def _decode(self, step: int) -> None:
        for seq in list(self.running):
            retire = self.gate(seq)
            if retire:
                self.running.remove(seq)
                self._abort(seq, step, *retire)
        batch = [s for s in self.running if s.status is SeqStatus.RUNNING]
        if not batch:
            return
        sampled = self.runner.run(step, "decode", batch, [[s.output_ids[-1]] for s in batch])
        self._postprocess(step, batch, sampled, [1] * len(batch))

    def _postprocess(self, step: int, seqs: list[Sequence], sampled: list[Sampled], num_new: list[int]) -> None:
        def finish(seq: Sequence) -> None:
            self.running.remove(seq)
            self._event(step, "finish", seq, (), seq.finish_reason)
            self._leave(seq, step, f"finished ({seq.finish_reason})")
            self.outcomes.append(Outcome(seq, HTTPStatus.OK))

        def fail(seq: Sequence, reason: str) -> None:
            self.running.remove(seq)
            self._abort(seq, step, HTTPStatus.INTERNAL_SERVER_ERROR, reason)

        postprocess(seqs, sampled, num_new, self.eos_id, finish, fail)

    # -- leaving ------------------------------------------------------------------------------
    def _abort(self, seq: Sequence, step: int, status: int, reason: str) -> None:
        seq.finish_reason = "abort"
        seq.status = SeqStatus.FINISHED
        self.receivers[seq.room].abort(reason, status)
        self._event(step, "finish", seq, (), f"aborted ({int(status)}): {reason}")
        self.outcomes.append(Outcome(seq, status, reason))
        if seq.block_table and self.switches.deferred_release and not self.manager.settled(seq.room):
            self.pending_release.append(seq)
            self._event(step, "hold", seq, seq.block_table, "deferred release: writes still in flight")
            return
        self._leave(seq, step, "aborted")

    def _release_settled(self, step: int) -> None:
        for seq in list(self.pending_release):
            if self.manager.settled(seq.room):
                self.pending_release.remove(seq)
                self._leave(seq, step, "deferred release: no write in flight any more")

    def _leave(self, seq: Sequence, step: int, reason: str) -> None:
        """The decode half is done: free its pages and close its end of the room."""
        self._free(seq, step, reason)
        self.receivers.pop(seq.room).close()
