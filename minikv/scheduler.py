"""Continuous batching: which requests run in the next step, and where their pages come from.

Requests join and leave between steps. Each step is either a *prefill* (new requests' prompts,
up to a token budget) or a *decode* (one token for every running request). A waiting request
is admitted only when the pool has pages for its whole current length; a decoding request
that needs one more page and finds none preempts the most recently admitted request, which
gives its pages back and is recomputed later. Nothing is over-committed and nothing dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from minikv.config import EngineConfig
from minikv.events import Clock, Event, EventLog
from minikv.page_pool import PagePool
from minikv.request import Sequence, SeqStatus


@dataclass
class ScheduledBatch:
    """The next step's work: the phase, and for each request the tokens it runs."""

    phase: Literal["prefill", "decode"]
    seqs: list[Sequence]
    new_tokens: list[list[int]]  # per sequence: token ids whose K/V this step computes


class Scheduler:
    """Waiting queue, running batch, and the page bookkeeping between them."""

    def __init__(self, pool: PagePool, config: EngineConfig, log: EventLog, node: str, clock: Clock) -> None:
        self.pool, self.config, self.log, self.node, self.clock = pool, config, log, node, clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _event(self, kind: str, seq: Sequence, pages: list[int] | tuple[int, ...] = (), detail: str = "") -> None:
        self.log.add(Event(self.clock.now, self.node, kind, seq.request_id, seq.tenant, tuple(pages), detail))

    # -- the decision --------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """Prefill waiting requests if any fit, else decode every running one."""
        batch = self._schedule_prefill()
        return batch if batch is not None else self._schedule_decode()

    def _schedule_prefill(self) -> ScheduledBatch | None:
        seqs, budget = [], self.config.max_prefill_tokens
        while self.waiting and len(self.running) < self.config.max_batch_size:
            seq = self.waiting[0]
            todo = seq.seq_len - seq.num_cached
            if seqs and todo > budget:
                break  # the budget is spent; it goes first next step
            need = self.pool.pages_for(seq.seq_len) - len(seq.block_table)
            if not self.pool.can_allocate(need):
                break  # temporarily full: wait for pages to come back
            self.waiting.popleft()
            pages = self.pool.allocate(need, seq.request_id)
            seq.block_table += pages
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            self._event("allocate", seq, pages, f"{need} pages for {seq.seq_len} tokens")
            seqs.append(seq)
            budget -= todo
        if not seqs:
            return None
        return ScheduledBatch("prefill", seqs, [s.tokens[s.num_cached :] for s in seqs])

    def _schedule_decode(self) -> ScheduledBatch | None:
        scheduled: list[Sequence] = []
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted earlier in this loop
            while len(seq.block_table) * self.pool.page_size <= seq.num_cached:
                if self.pool.can_allocate(1):
                    page = self.pool.allocate(1, seq.request_id)
                    seq.block_table += page
                    self._event("allocate", seq, page, "1 page to keep decoding")
                    continue
                victim = self._pick_victim(exclude=seq)
                if victim is None:
                    raise AssertionError("admission let in a request the whole pool cannot hold")
                self.preempt(victim)
        for seq in self.running:
            scheduled.append(seq)
        if not scheduled:
            return None
        return ScheduledBatch("decode", scheduled, [[s.tokens[-1]] for s in scheduled])

    def _pick_victim(self, exclude: Sequence) -> Sequence | None:
        for seq in reversed(self.running):
            if seq is not exclude:
                return seq
        return None

    # -- leaving the batch -------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        """Give `seq`'s pages back and requeue it first; its tokens are recomputed later."""
        self.running.remove(seq)
        self._event("preempt", seq, seq.block_table, "pool full: pages returned, will recompute")
        self.pool.free(seq.block_table, seq.request_id)
        seq.block_table, seq.num_cached, seq.status = [], 0, SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def release(self, seq: Sequence, reason: str) -> None:
        """`seq` is done (finished or cancelled): free its pages, unscrubbed."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self._event("free", seq, seq.block_table, reason)
            self.pool.free(seq.block_table, seq.request_id)
        seq.block_table = []
        seq.status = SeqStatus.FINISHED
