"""The prefill node: computes a prompt's KV and first token, and ships them to decode.

Queues, as in SGLang's prefill side:
    bootstrap  the request arrives, is checked against the pool, gets a KVSender, and waits
               until the decode side has advertised its pages; then the transfer is sized
               from the request's *own* input length.
    waiting    the prefill forward runs (continuous batching over this node's pool).
    inflight   the KV is on the wire; polled until Success, then the pages are freed.

The intake check (`check_intake`) is faithful to the real engine: an input longer than
`min(context_len - 1, pool_tokens - 1)` is marked for abort with status 400 in `to_finish`,
and its input ids are replaced by `[0]` to skip the long prefill, **but it still joins the
queue**. Whether it then stops depends on the gates: with `reject_check` off they ask only
`finished()`, which does not read `to_finish`, so the one-token placeholder is prefilled and
its single page of KV is transferred as if it were the whole prompt.

The prefill node keeps a prefix cache (as SGLang's prefill side keeps its radix cache): a
request reuses the cached full pages its prompt starts with and prefills only the rest; the
whole prompt's pages, cached ones included, are what the transfer sends.
"""

from __future__ import annotations

from http import HTTPStatus

from minikv.audit import OwnershipAudit
from minikv.disagg.checksum import kv_checksum
from minikv.disagg.node import Node
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer import KVManager, KVPoll, KVSender, Shipment
from minikv.events import EventLog
from minikv.model import Llama
from minikv.model_runner import ModelRunner
from minikv.page_pool import PagePool
from minikv.request import Sequence, SeqStatus

PLACEHOLDER_IDS = [0]  # "to skip the long prefill": token 0, which here is "\n"


class PrefillNode(Node):
    """One prefill worker with its own pool."""

    name = "prefill"

    def __init__(self, model: Llama, pool: PagePool, audit: OwnershipAudit | None, log: EventLog,
                 manager: KVManager, switches: SafetySwitches, context_len: int, max_prefill_tokens: int) -> None:
        super().__init__(pool, audit, log, manager, switches)
        self.context_len, self.max_prefill_tokens = context_len, max_prefill_tokens
        self.runner = ModelRunner(model, pool, audit, log, "prefill")
        self.bootstrap_queue: list[Sequence] = []
        self.waiting_queue: list[Sequence] = []
        self.inflight_queue: list[Sequence] = []
        self.senders: dict[int, KVSender] = {}

    @property
    def max_input_len(self) -> int:
        return min(self.context_len - 1, self.pool.capacity_tokens - 1)

    def queues(self) -> tuple[list[Sequence], ...]:
        return self.bootstrap_queue, self.waiting_queue, self.inflight_queue

    # -- intake ------------------------------------------------------------------------------
    def check_intake(self, seq: Sequence) -> None:
        """Validate the input length; on failure mark for abort and swap in the placeholder."""
        if len(seq.prompt_ids) > self.max_input_len:
            seq.to_finish = (f"input of {len(seq.prompt_ids)} tokens exceeds the maximum of {self.max_input_len} "
                             f"(min(context_len - 1, prefill pool tokens - 1) = min({self.context_len - 1}, "
                             f"{self.pool.capacity_tokens - 1}))")
            seq.prompt_ids = list(PLACEHOLDER_IDS)
            seq.cache_keys = []  # the keys named the prompt that was swapped out

    def add(self, seq: Sequence, step: int) -> None:
        self.check_intake(seq)
        if seq.to_finish:
            self._event(step, "reject", seq, (), f"marked for abort (400): {seq.to_finish}; input swapped for a 1-token placeholder")
        self.senders[seq.room] = KVSender(self.manager, seq.room)
        self.bootstrap_queue.append(seq)
        self._stage(step, seq, "bootstrap")

    def gate(self, seq: Sequence, step: int) -> bool:
        """May `seq` go on? Retires it if not. The vulnerable gate asks only finished()."""
        rejected = self.switches.reject_check and seq.to_finish is not None
        if seq.finished() or rejected:
            if rejected:
                self.senders[seq.room].abort(seq.to_finish, status=400)
                seq.finish_reason = "abort"
                self._event(step, "finish", seq, (), f"retired at the queue gate: {seq.to_finish}")
            self._release(seq, step)
            return False
        return True

    # -- one step ----------------------------------------------------------------------------
    def step(self, step: int) -> None:
        self._bootstrap(step)
        self._prefill(step)
        self._poll_inflight(step)

    def _bootstrap(self, step: int) -> None:
        for seq in list(self.bootstrap_queue):
            if not self.gate(seq, step):
                self.bootstrap_queue.remove(seq)
                continue
            sender = self.senders[seq.room]
            if sender.poll() is KVPoll.Failed:
                self.bootstrap_queue.remove(seq)
                self._release(seq, step)
                continue
            if sender.poll() is KVPoll.WaitingForInput:  # decode has preallocated and advertised
                sender.init(num_pages=self.pool.pages_for(len(seq.prompt_ids)))  # its *own* length
                self.bootstrap_queue.remove(seq)
                self.waiting_queue.append(seq)
                self._stage(step, seq, "waiting")

    def _prefill(self, step: int) -> None:
        batch, budget = [], self.max_prefill_tokens
        for seq in list(self.waiting_queue):
            if not self.gate(seq, step):
                self.waiting_queue.remove(seq)
                continue
            hits = self.pool.cached_prefix(seq.cache_keys, len(seq.prompt_ids))
            todo = len(seq.prompt_ids) - len(hits) * self.pool.page_size
            need = self.pool.pages_for(len(seq.prompt_ids)) - len(hits)
            if (batch and todo > budget) or not self.pool.can_allocate(self.pool.pages_to_take(hits, need)):
                break  # capacity is checked on the (possibly swapped) input: the stub always fits
            if hits:
                self.pool.acquire(hits, seq.request_id)
                seq.num_cached = seq.cached_tokens = len(hits) * self.pool.page_size
                self._event(step, "cache_hit", seq, hits, f"{seq.num_cached} prompt tokens from the prefix cache")
            seq.block_table = hits + self.pool.allocate(need, seq.request_id)
            seq.status = SeqStatus.RUNNING
            self._event(step, "allocate", seq, seq.block_table[len(hits):], f"{need} page(s) for {len(seq.prompt_ids)} token(s)")
            self.waiting_queue.remove(seq)
            batch.append(seq)
            budget -= todo
        if not batch:
            return
        firsts = self.runner.run(step, "prefill", batch, [s.prompt_ids[s.num_cached :] for s in batch])
        for seq, first in zip(batch, firsts):
            if first.error is not None:  # this request failed; the rest of the batch goes on
                self.senders[seq.room].abort(first.error, status=HTTPStatus.INTERNAL_SERVER_ERROR)
                seq.finish_reason = "abort"
                self._event(step, "finish", seq, (), f"failed (500): {first.error}")
                self._release(seq, step)
                continue
            seq.num_cached = len(seq.prompt_ids)  # the forward wrote the K/V of the whole (possibly swapped) input
            self.pool.cache_pages(seq.cache_keys, seq.block_table, seq.num_cached)
            checksum = kv_checksum(self.pool, seq.block_table, len(seq.prompt_ids)) if self.switches.kv_checksum else None
            sampler_state = seq.generator.get_state() if seq.generator is not None else None
            self.senders[seq.room].send(seq.block_table, Shipment(len(seq.prompt_ids), first.token, checksum,
                                                                  sampler_state, seq.cached_tokens))
            self.inflight_queue.append(seq)
            self._stage(step, seq, "inflight")

    def _poll_inflight(self, step: int) -> None:
        for seq in list(self.inflight_queue):
            state = self.senders[seq.room].poll()
            if state in (KVPoll.Success, KVPoll.Failed):
                self.inflight_queue.remove(seq)
                seq.finish_reason = seq.finish_reason or ("transferred" if state is KVPoll.Success else "abort")
                self._release(seq, step)

    def _release(self, seq: Sequence, step: int) -> None:
        """The prefill half is done: free its pages and close its end of the room."""
        self._free(seq, step, "prefill done; KV handed to decode" if seq.finish_reason == "transferred" else "released")
        self.senders.pop(seq.room).close()
