"""The prefill node: computes a prompt's KV and first token, and ships them to decode.

Its queues are bootstrap, waiting and inflight, as in SGLang. An input too long for the pool is
marked for abort and swapped for a placeholder, but still joins the queue (docs/disagg.md).
"""

from http import HTTPStatus

from minikv.disagg.checksum import kv_checksum
from minikv.disagg.node import Node
from minikv.disagg.transfer.base import KVPoll, KVSender, Shipment
from minikv.engine.request import Sequence

PLACEHOLDER_IDS = [0]  # "to skip the long prefill": token 0, which here is "\n"


class PrefillNode(Node):
    """One prefill worker with its own pool."""
    name = "prefill"

    def __init__(self, *args, context_len: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.context_len = context_len
        self.bootstrap_queue: list[Sequence] = []
        self.inflight_queue: list[Sequence] = []

    def queues(self) -> tuple[list[Sequence], ...]:
        return self.bootstrap_queue, self.scheduler.waiting, self.scheduler.running, self.inflight_queue

    def check_intake(self, seq: Sequence) -> None:
        """Validate the input length; on failure mark for abort and swap in the placeholder."""
        pool_tokens = self.pool.tenant_tokens  # the whole pool, or one tenant's quota
        window, limit = self.context_len - 1, min(self.context_len - 1, pool_tokens - 1)
        if len(seq.prompt_ids) > limit:
            whose = ("one tenant's " if self.pool.partition else "") + "prefill pool tokens"
            seq.to_finish = (f"input of {len(seq.prompt_ids)} tokens exceeds the maximum of {limit} "
                             f"(min(context_len - 1, {whose} - 1) = min({window}, {pool_tokens - 1}))")
            seq.prompt_ids = list(PLACEHOLDER_IDS)
            seq.cache_keys = []  # the keys named the prompt that was swapped out

    def add(self, seq: Sequence) -> None:
        self.check_intake(seq)
        if seq.to_finish:
            self._event("reject", seq, (),
                        f"marked for abort (400): {seq.to_finish}; input swapped for a 1-token placeholder")
        self.endpoints[seq.room] = KVSender(self.manager, seq.room)
        self.bootstrap_queue.append(seq)
        self._stage(seq, "bootstrap")

    def gate(self, seq: Sequence) -> bool:
        """May `seq` go on? Retires it if not. The vulnerable gate asks only finished()."""
        rejected = self.switches.reject_check and seq.to_finish is not None
        if seq.finished() or rejected:
            if rejected:
                self._abort(seq, 400, seq.to_finish, f"retired at the queue gate: {seq.to_finish}")
            self._release(seq, "released")
            return False
        return True

    def step(self) -> None:
        self._bootstrap()
        self._prefill()
        self._poll_inflight()

    def _bootstrap(self) -> None:
        for seq in list(self.bootstrap_queue):
            if not self.gate(seq):
                self.bootstrap_queue.remove(seq)
            elif (state := self.endpoints[seq.room].poll()) is KVPoll.Failed:
                self.bootstrap_queue.remove(seq)
                self._release(seq, "released")
            elif state is KVPoll.WaitingForInput:  # decode has preallocated and advertised
                own_pages = self.pool.pages_for(len(seq.prompt_ids))  # its *own* length
                self.endpoints[seq.room].init(num_pages=own_pages)
                self.bootstrap_queue.remove(seq)
                self.scheduler.add(seq)
                self._stage(seq, "waiting")

    def _prefill(self) -> None:
        """The scheduler admits what fits (the swapped-in stub always does); then KV and first token ship.
        With chunked prefill a prompt not yet all in the pool stays running for its next chunk."""
        batch = self.scheduler.schedule_prefill(self.gate)
        if batch is None:
            return
        firsts = self.runner.run(self.clock.now, "prefill", batch.seqs, batch.new_tokens)
        self.scheduler.cache_prompt_pages(batch, firsts)
        for seq, tokens, first in zip(batch.seqs, batch.new_tokens, firsts, strict=True):
            if first.error is None and seq.num_cached + len(tokens) < len(seq.prompt_ids):
                seq.num_cached += len(tokens)  # a chunk: the rest of the prompt next step
                self.gate(seq)  # one cancelled meanwhile is retired now, never shipped half prefilled
                continue
            self.scheduler.running.remove(seq)
            if first.error is not None:  # this request failed; the rest of the batch goes on
                self._abort(seq, HTTPStatus.INTERNAL_SERVER_ERROR, first.error,
                            f"failed (500): {first.error}")
                self._release(seq, "released")
                continue
            seq.num_cached = n = len(seq.prompt_ids)  # the forward wrote the whole (possibly swapped) input
            checksum = kv_checksum(self.pool, seq.block_table, n) if self.switches.kv_checksum else None
            sampler_state = seq.generator.get_state() if seq.generator is not None else None
            self.endpoints[seq.room].send(seq.block_table, Shipment(n, first.token, checksum, sampler_state,
                                                                    seq.cached_tokens))
            self.inflight_queue.append(seq)
            self._stage(seq, "inflight")

    def _poll_inflight(self) -> None:
        """Once the transfer ended, the pages go back: handed over (Success), or released (it failed)."""
        for seq in list(self.inflight_queue):
            sender = self.endpoints[seq.room]
            if sender.poll() not in (KVPoll.Success, KVPoll.Failed):
                continue
            self.inflight_queue.remove(seq)
            if not seq.finished() and (failure := sender.failure()) is not None:
                seq.abort(*failure)
            if seq.finished():
                self._release(seq, "released")
            else:
                seq.finish_reason = "transferred"
                self._release(seq, "prefill done; KV handed to decode")
