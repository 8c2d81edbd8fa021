"""The decode node: reserves pages, receives a prompt's KV, and generates the reply.

Its queues are prealloc, transfer and running, as in SGLang; `verify` checks KV it did not compute
before decoding over it, and `deferred_release` waits out writes still in flight (docs/disagg.md).
"""

from http import HTTPStatus

from minikv.disagg.checksum import kv_checksum
from minikv.disagg.node import Node
from minikv.disagg.transfer.base import KVPoll, KVReceiver
from minikv.engine.front_door import Rejected, check_pool
from minikv.engine.model_runner import Sampled
from minikv.engine.request import CLIENT_CLOSED_REQUEST, Finished, Sequence, SeqStatus

CANARY = -1234.5  # a value no real key or value will hold


class DecodeNode(Node):
    """One decode worker with its own pool."""
    name = "decode"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prealloc_queue: list[Sequence] = []
        self.transfer_queue: list[Sequence] = []
        self.pending_release: list[Sequence] = []  # aborted, pages held until writes settle
        self.finished: list[Finished] = []  # how requests left, until the front door takes them

    def queues(self) -> tuple[list[Sequence], ...]:
        return self.prealloc_queue, self.transfer_queue, self.scheduler.running, self.pending_release

    def take_finished(self) -> list[Finished]:
        """How requests left since the last call, handed over once."""
        out, self.finished = self.finished, []
        return out

    def add(self, seq: Sequence) -> None:
        self.endpoints[seq.room] = KVReceiver(self.manager, seq.room)
        try:  # one that could never be preallocated is refused rather than left waiting forever
            n = len(seq.prompt_ids)
            check_pool(n + seq.max_tokens, self.pool.tenant_tokens, self.name, n, bool(self.pool.partition))
        except Rejected as e:
            self._abort(seq, HTTPStatus.BAD_REQUEST, e.reason)
            return
        self.prealloc_queue.append(seq)
        self._stage(seq, "prealloc")

    def gate(self, seq: Sequence) -> tuple[int, str] | None:
        """The decode-side abort scan: None to go on, else (status, reason) to retire `seq`. It asks
        finished() (a client cancel); only with reject_check does it also read to_finish."""
        if seq.finished():
            return CLIENT_CLOSED_REQUEST, "cancelled by the client"
        if self.switches.reject_check and seq.to_finish is not None:
            return HTTPStatus.BAD_REQUEST, seq.to_finish
        return None

    def step(self) -> None:
        """One tick. The running batch decodes first; requests whose KV arrived join it on the
        next tick (the batch is formed when the step starts)."""
        self._release_settled()
        self._prealloc()
        self._decode()
        self._poll_transfers()

    def _prealloc(self) -> None:
        for seq in list(self.prealloc_queue):
            if self._retired(seq, self.prealloc_queue):
                continue
            need = self.pool.pages_for(len(seq.prompt_ids) + seq.max_tokens)  # the ORIGINAL length
            if not self.pool.can_allocate(need, tenant=seq.tenant):
                continue  # wait for pages; first come, first served is kept by the loop order
            seq.block_table = self.pool.allocate(need, seq.request_id, tenant=seq.tenant)
            self._event("allocate", seq, seq.block_table, f"decode reserved {need} pages for "
                        f"{len(seq.prompt_ids)} prompt + {seq.max_tokens} output tokens")
            if self.switches.kv_canary:
                self.pool.write(seq.block_table, CANARY)  # poison: must be overwritten by the transfer
            self.endpoints[seq.room].send_metadata(seq.block_table)
            self.prealloc_queue.remove(seq)
            self.transfer_queue.append(seq)
            self._stage(seq, "transfer")

    def _poll_transfers(self) -> None:
        for seq in list(self.transfer_queue):
            receiver = self.endpoints[seq.room]
            if self._retired(seq, self.transfer_queue) or receiver.poll() is not KVPoll.Success:
                continue
            self.transfer_queue.remove(seq)
            problem = self.verify(seq, receiver)
            if problem:
                self._abort(seq, HTTPStatus.INTERNAL_SERVER_ERROR, problem)
                continue
            shipment = receiver.transfer.shipment
            if shipment.sampler_state is not None:  # go on with the random stream prefill drew from
                seq.generator.set_state(shipment.sampler_state)
            seq.cached_tokens = shipment.cached_tokens
            seq.status = SeqStatus.RUNNING
            self.scheduler.running.append(seq)
            self._stage(seq, "running")
            # the node now believes the whole prompt is cached; the first token reaches the client
            first = Sampled(shipment.first_token)
            self._end(self.scheduler.postprocess([seq], [first], [len(seq.prompt_ids)]))

    def _retired(self, seq: Sequence, queue: list[Sequence]) -> bool:
        """Abort `seq`, taking it off `queue`, if its gate or its transfer ended it; whether it did."""
        retire = self.gate(seq) or self.endpoints[seq.room].failure()
        if retire:
            queue.remove(seq)
            self._abort(seq, *retire)
        return retire is not None

    def verify(self, seq: Sequence, receiver: KVReceiver) -> str | None:
        """Checks before decoding over KV this node did not compute; the reason if one fails."""
        sent, n = receiver.transfer.shipment, len(seq.prompt_ids)
        if self.switches.kv_checksum:
            if sent.num_tokens != n:
                return (f"KV checksum failed: prefill sent KV for {sent.num_tokens} token(s), "
                        f"the prompt has {n}")
            if sent.checksum != kv_checksum(self.pool, seq.block_table, n):
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

    def _decode(self) -> None:
        for seq in list(self.scheduler.running):
            self._retired(seq, self.scheduler.running)
        batch = self.scheduler.schedule_decode()
        if batch is None:
            return
        sampled = self.runner.run(self.clock.now, "decode", batch.seqs, batch.new_tokens)
        self._end(self.scheduler.postprocess(batch.seqs, sampled, [1] * len(batch.seqs)))

    def _end(self, ended: list[Finished]) -> None:
        """What the scheduler's postprocess says ended: a 200 leaves at once, a failure is aborted."""
        for f in ended:
            self.scheduler.running.remove(f.seq)
            if f.status != HTTPStatus.OK:
                self._abort(f.seq, f.status, f.error)
                continue
            self._event("finish", f.seq, (), f.seq.finish_reason)
            self._release(f.seq, f"finished ({f.seq.finish_reason})")
            self.finished.append(f)

    def _abort(self, seq: Sequence, status: int, reason: str, detail: str | None = None) -> Finished:
        """End `seq` unserved; its pages go back now, or once none is being written (deferred release)."""
        ended = super()._abort(seq, status, reason, detail)
        self.finished.append(ended)
        seq.status = SeqStatus.FINISHED
        if seq.block_table and self.switches.deferred_release and not self.manager.settled(seq.room):
            self.pending_release.append(seq)
            self._event("hold", seq, seq.block_table, "deferred release: writes still in flight")
        else:
            self._release(seq, "aborted")
        return ended

    def _release_settled(self) -> None:
        for seq in list(self.pending_release):
            if self.manager.settled(seq.room):
                self.pending_release.remove(seq)
                self._release(seq, "deferred release: no write in flight any more")
