"""Continuous batching: which requests run in the next step, and where their pages come from.

Requests join and leave between steps. Each step is either a *prefill* (new requests' prompts,
up to a token budget) or a *decode* (one token for every running request). A waiting request
is admitted only when the pool has pages for its whole current length; a decoding request
that needs one more page and finds none preempts the most recently admitted request, which
gives its pages back and is recomputed later. Nothing is over-committed and nothing dropped.

With prefix caching, a waiting request first looks up the leading full pages of its prompt in
the cache: it takes those pages (one more reference each) and prefills only the rest. The pool
check counts what the request really uses up: its new pages, plus any hit that nobody held.
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
            hits = self.pool.cached_prefix(seq.cache_keys, seq.seq_len) if not seq.block_table else []
            todo = seq.seq_len - max(seq.num_cached, len(hits) * self.pool.page_size)
            if seqs and todo > budget:
                break  # the budget is spent; it goes first next step
            need = self.pool.pages_for(seq.seq_len) - len(seq.block_table) - len(hits)
            if not self.pool.can_allocate(self.pool.pages_to_take(hits, need)):
                break  # temporarily full: wait for pages to come back
            self.waiting.popleft()
            if hits:
                self._take_cached(seq, hits)
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

    # -- prefix caching ----------------------------------------------------------------------
    def _take_cached(self, seq: Sequence, hits: list[int]) -> None:
        """`seq` reuses the cached pages `hits` for the start of its prompt instead of prefilling it."""
        self.pool.acquire(hits, seq.request_id)
        seq.block_table = list(hits)
        seq.num_cached = len(hits) * self.pool.page_size
        if not seq.output_ids:  # usage reports the first admission's hits, as vLLM does
            seq.cached_tokens = seq.num_cached
        self._event("cache_hit", seq, hits, f"{seq.num_cached} prompt tokens from the prefix cache")

    def cache_prompt_pages(self, seqs: list[Sequence], num_computed: list[int]) -> None:
        """After a prefill forward: name each sequence's full prompt pages among its first
        `num_computed` tokens (their K/V are now in the pool) in the prefix cache."""
        for seq, n in zip(seqs, num_computed, strict=True):
            self.pool.cache_pages(seq.cache_keys, seq.block_table, n)

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
