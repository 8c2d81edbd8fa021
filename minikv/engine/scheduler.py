"""Continuous batching: who runs in the next step, where their pages come from, and what each
step's outcome does to every request (`postprocess`, the one owner of a request's step).

Each step is a *prefill* (waiting prompts, up to a token budget) or a *decode* (one token for every running
request), or with `mixed` both at once, as vLLM's steps are. Waiting requests are admitted fairly across
tenants (fairness.py), each only when the pool has pages for its whole length; a decode that finds no page
preempts the newest request (its own tenant's when partitioned), recomputed later. The disaggregated nodes
use the same scheduler. See docs/engine.md.
"""

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

from transformers import PreTrainedTokenizerBase

from minikv.engine.events import Clock, Event, EventLog
from minikv.engine.fairness import VirtualTokenCounter
from minikv.engine.model_runner import Sampled
from minikv.engine.page_pool import PagePool
from minikv.engine.request import Finished, Sequence, SeqStatus


@dataclass
class ScheduledBatch:
    """The next step's work: the phase, and for each request the tokens it runs."""

    phase: Literal["prefill", "decode", "mixed"]
    seqs: list[Sequence]
    new_tokens: list[list[int]]  # per sequence: token ids whose K/V this step computes


def prefilling(seq: Sequence) -> bool:
    """Running, its prompt not all in the pool yet (chunked prefill): more than one token left to compute."""
    return seq.num_cached + 1 < seq.seq_len


class Scheduler:
    """Waiting queue, running batch, the page bookkeeping between them, and each step's outcome."""

    def __init__(self, pool: PagePool, log: EventLog, node: str, clock: Clock, tok: PreTrainedTokenizerBase,
                 max_prefill_tokens: int, max_batch_size: int | None = None, chunked: bool = False,
                 mixed: bool = False) -> None:
        self.pool, self.log, self.node, self.clock, self.tokenizer = pool, log, node, clock, tok
        self.max_prefill_tokens, self.max_batch_size = max_prefill_tokens, max_batch_size
        self.chunked_prefill = chunked  # prompts prefilled max_prefill_tokens at a time, decode steps between
        self.mixed = mixed  # each step: every running request's next token, and prompts beside them
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.last_phase: str | None = None
        self.fairness = VirtualTokenCounter()  # who is admitted next: the tenant served least so far

    def add(self, seq: Sequence) -> None:
        self.fairness.arrive(seq.tenant, {s.tenant for s in (*self.waiting, *self.running)})
        self.waiting.append(seq)

    def _event(self, kind: str, seq: Sequence, pages: Iterable[int] = (), detail: str = "") -> None:
        self.log.add(Event(self.clock.now, self.node, kind, seq.request_id, seq.tenant, tuple(pages), detail))

    # -- the decision --------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """The newcomers' prompts alone if any fit; else waiting prompts if any fit, else decode every running
        request. With chunked prefill a decode step follows each prefill step, except for a newcomer's."""
        if self.mixed:
            return self.schedule_mixed()
        batch = self._prefill(None, self.newcomers())
        if batch is None:
            decode_turn = self.chunked_prefill and self.last_phase == "prefill"
            if decode_turn and any(not prefilling(s) for s in self.running):
                batch = self.schedule_decode()
            else:
                batch = self._prefill(None, None) or self.schedule_decode()
        self.last_phase = batch.phase if batch is not None else None
        return batch

    def schedule_mixed(self) -> ScheduledBatch | None:
        """A newcomer's prompts alone if any fit (as in `schedule`); else one step of both: every running
        request's next token (pages first: a decode may preempt), then the prompts the budget takes."""
        if (newcomers := self._prefill(None, self.newcomers())) is not None:
            return newcomers
        decode = self.schedule_decode()
        prefill = self._prefill(None, None)
        if decode is None or prefill is None:
            return decode or prefill
        return ScheduledBatch("mixed", decode.seqs + prefill.seqs, decode.new_tokens + prefill.new_tokens)

    def newcomers(self) -> set[str]:
        """With chunked prefill, the tenants with a request waiting and none running (just arrived, or
        preempted). Without, none: a newcomer's whole prompt goes in the next step anyway, beside others'."""
        if not self.chunked_prefill:
            return set()
        busy = {s.tenant for s in self.running}
        return {s.tenant for s in self.waiting if s.tenant not in busy}

    def schedule_prefill(self, gate: Callable[[Sequence], bool] | None = None) -> ScheduledBatch | None:
        """A step of the newcomers' prompts alone if any fit, else of everyone's: a newcomer's first token
        does not wait for a step filled with others' prompts (2.5 ms, not 17: docs/serve.md, "Fairness")."""
        return self._prefill(gate, self.newcomers()) or self._prefill(gate, None)

    def _prefill(self, gate: Callable[[Sequence], bool] | None,
                 only: set[str] | None) -> ScheduledBatch | None:
        """Spend the token budget on the least served tenant's work first (of the tenants in `only`, unless
        None): a chunked prefill going on, or a waiting request admitted with pages for every token. One next
        in line that does not fit ends admission (a full quota: only its tenant's), so none overtakes it.
        `gate(seq)` (the prefill node's) may stop a request, which retires itself."""
        seqs, new_tokens, budget, admitting = [], [], self.max_prefill_tokens, True
        ps, waits = self.pool.page_size, set()  # tenants whose next request found its quota full

        def take(seq: Sequence, todo: int) -> int:  # the tokens `seq` computes this step: all, or a chunk
            n = min(todo, budget) if self.chunked_prefill else todo
            seqs.append(seq)
            new_tokens.append(seq.tokens(seq.num_cached, seq.num_cached + n))
            self.fairness.charge(seq.tenant, prompt_tokens=n)
            return n

        while budget > 0:
            ongoing = [s for s in self.running if prefilling(s) and all(s is not t for t in seqs)]
            queue = [*ongoing, *(s for s in self.waiting if s.tenant not in waits)] if admitting else ongoing
            if only is not None:
                queue = [s for s in queue if s.tenant in only]
            if not queue:
                break
            seq = self.fairness.next_in_line(queue)  # of equals, a prefill going on: it holds its pages
            if seq.status is SeqStatus.RUNNING:
                budget -= take(seq, seq.seq_len - seq.num_cached)
                continue
            if self.max_batch_size is not None and len(self.running) >= self.max_batch_size:
                admitting = False  # no batch slot: it waits for one, first in line
                continue
            if gate is not None and not gate(seq):
                assert seq not in self.waiting, "a gate that stops a request retires it"
                continue
            hits = self.pool.match(seq.cache_keys, seq.seq_len, seq.tenant) if not seq.block_table else []
            todo = seq.seq_len - max(seq.num_cached, len(hits) * ps)
            if seqs and todo > budget and not self.chunked_prefill:
                admitting = False  # the budget is spent; it goes first next step
                continue
            need = self.pool.pages_for(seq.seq_len) - len(seq.block_table) - len(hits)
            if not self.pool.can_allocate(need, hits, seq.tenant):
                if self.pool.partition is None:
                    admitting = False  # temporarily full: wait for pages to come back
                else:
                    waits.add(seq.tenant)  # its quota is full: its later requests wait too, others go on
                continue
            self.waiting.remove(seq)
            pages = self.pool.allocate(need, seq.request_id, hits, seq.tenant)
            if hits:
                seq.num_cached = len(hits) * ps
                if not seq.output_ids:  # usage reports the first admission's hits, as vLLM does
                    seq.cached_tokens = seq.num_cached
                self._event("cache_hit", seq, hits, f"{seq.num_cached} prompt tokens from the prefix cache")
            seq.block_table = seq.block_table + hits + pages
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            self._event("allocate", seq, pages, f"{need} pages for {seq.seq_len} tokens")
            budget -= take(seq, todo)
        return ScheduledBatch("prefill", seqs, new_tokens) if seqs else None

    def schedule_decode(self) -> ScheduledBatch | None:
        """One token for every running request; one that needs a page and finds none preempts."""
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING or prefilling(seq):
                continue  # preempted earlier in this loop, or its prompt is still being prefilled
            while len(seq.block_table) * self.pool.page_size <= seq.num_cached:
                if self.pool.can_allocate(1, tenant=seq.tenant):
                    page = self.pool.allocate(1, seq.request_id, tenant=seq.tenant)
                    seq.block_table += page
                    self._event("allocate", seq, page, "1 page to keep decoding")
                    continue
                # the victim: the latest admitted; anyone's in a shared pool, its tenant's when partitioned
                victims = [s for s in reversed(self.running)
                           if s is not seq and (self.pool.partition is None or s.tenant == seq.tenant)]
                assert victims, "admission let in a request its tenant's pages cannot hold"
                self.preempt(victims[0])
        batch = [s for s in self.running if not prefilling(s)]
        return ScheduledBatch("decode", batch, [s.tokens(s.seq_len - 1) for s in batch]) if batch else None

    # -- after the forward -------------------------------------------------------------------
    def cache_prompt_pages(self, batch: ScheduledBatch, sampled: list[Sampled]) -> None:
        """After a prefill forward: name each served request's full prompt pages in the prefix cache (their
        K/V are now in the pool), before a request that finishes frees them."""
        if (cache := self.pool.prefix_cache) is None or batch.phase == "decode":
            return
        for seq, tokens, choice in zip(batch.seqs, batch.new_tokens, sampled, strict=True):
            if choice.error is None:
                cache.cache_pages(seq.cache_keys, seq.block_table, seq.num_cached + len(tokens))

    def postprocess(self, seqs: list[Sequence], sampled: list[Sampled], num_new: list[int]) -> list[Finished]:
        """Apply one step's outcome to each of `seqs` once `num_new` tokens' K/V are in the pool: `sampled`,
        the runner's choice (a token, or why none). Returns the requests that ended."""
        now, ended = time.perf_counter(), []
        for seq, choice, n in zip(seqs, sampled, num_new, strict=True):
            if choice.error is not None:  # that request fails alone (500); the batch goes on
                ended.append(seq.abort(HTTPStatus.INTERNAL_SERVER_ERROR, choice.error))
                continue
            assert choice.token is not None and not seq.finished(), f"{seq.request_id} stepped after it ended"
            seq.num_cached += n
            if seq.num_cached < seq.seq_len:
                continue  # a chunk of a prompt still being prefilled: no token yet
            seq.output_ids.append(choice.token)
            self.fairness.charge(seq.tenant, output_tokens=1)
            seq.token_times_s.append(now - seq.arrival_s)
            if seq.first_token_s is None:
                seq.first_token_s = now - seq.arrival_s
            seq.finish_reason = self.finish_rule(seq)
            if seq.finish_reason is not None:
                ended.append(Finished(seq, HTTPStatus.OK))
        return ended

    def finish_rule(self, seq: Sequence) -> str | None:
        """The finish rule, written once: "stop" at end of text or a stop string, "length" at max_tokens."""
        if seq.output_ids[-1] == self.tokenizer.eos_token_id or seq.stop and seq.update_text(self.tokenizer):
            return "stop"
        if len(seq.output_ids) >= seq.max_tokens:
            return "length"
        return None

    # -- leaving the batch -------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        """Give `seq`'s pages back and requeue it, first of its tenant's; its tokens are recomputed later."""
        self.running.remove(seq)
        self._event("preempt", seq, seq.block_table, "pool full: pages returned, will recompute")
        self.pool.free(seq.block_table, seq.request_id, seq.tenant)
        seq.block_table, seq.num_cached = [], 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def release(self, seq: Sequence, reason: str) -> None:
        """`seq` leaves this node (finished, cancelled, failed, handed on): free its pages, unscrubbed."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self._event("free", seq, seq.block_table, reason)
            self.pool.free(seq.block_table, seq.request_id, seq.tenant)
        seq.block_table = []
        seq.status = SeqStatus.FINISHED
