"""One serving node: admission control, continuous batching over a page pool, and responses.

The step-wise API is what notebooks use to watch the engine work:

    engine.submit(Request("alice: save pin 1234.\\n", tenant="alice"))
    while engine.has_work():
        finished = engine.step()   # one prefill or decode step; responses that completed

`generate([...])` does all of that in one call. The client API (ids, handover, `run`,
`generate`) is the same on `Cluster`: see front_door.py. Every allocation, write, read, free
and state change lands in `engine.log`; every read is checked by `engine.audit`.
"""

from __future__ import annotations

import time
from http import HTTPStatus

import torch
from transformers import PreTrainedTokenizerBase

from minikv.admission import check_at_door, check_pool
from minikv.audit import OwnershipAudit
from minikv.config import EngineConfig
from minikv.events import Clock, Event, EventLog
from minikv.front_door import FrontDoor
from minikv.model import Llama
from minikv.prefix_cache import request_page_keys
from minikv.model_runner import ModelRunner
from minikv.page_pool import PagePool
from minikv.postprocess import postprocess
from minikv.request import Request, Sequence
from minikv.response import CLIENT_CLOSED_REQUEST, Response, Usage
from minikv.scheduler import ScheduledBatch, Scheduler
from minikv.tokenizer import decode


class Engine(FrontDoor):
    """A single node: model + page pool + scheduler + audit + event log."""

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase,
                 config: EngineConfig = EngineConfig(), node: str = "single",
                 scrub_on_free: bool = False) -> None:
        super().__init__()
        mc = model.config
        if config.context_len > mc.max_position_embeddings:
            raise ValueError(
                f"context_len {config.context_len} exceeds the model's max_position_embeddings "
                f"{mc.max_position_embeddings}; lower context_len"
            )
        self.model, self.tokenizer, self.config, self.node = model, tokenizer, config, node
        self.pool = PagePool(mc, config.pool_pages(mc), config.page_size, model.device, model.dtype, scrub_on_free,
                             prefix_caching=config.prefix_caching)
        self.audit = OwnershipAudit(self.pool.num_pages * self.pool.page_size, self.pool.page_size, node, model.device) if config.audit else None
        if self.audit is not None and scrub_on_free:
            self.pool.on_scrub = self.audit.forget  # a scrubbed slot was written by nobody
        self.log = EventLog(enabled=config.event_log, limit=config.event_log_limit)
        self.clock = Clock()  # the engine's step number; only step() advances it
        self.scheduler = Scheduler(self.pool, config, self.log, node, self.clock)
        self.runner = ModelRunner(model, self.pool, self.audit, self.log, node)
        self.seqs: dict[str, Sequence] = {}  # engine id -> the requests being served, until they end

    # -- what a serving engineer reads at startup ---------------------------------------
    def health(self) -> dict:
        return {"pools": {"single": self.pool.occupancy()},
                "cross_tenant_reads": self.audit.cross_tenant_reads if self.audit is not None else 0}

    def startup_log(self) -> str:
        mc, pool = self.model.config, self.pool
        return (
            f"[{self.node}] KV pool: {pool.num_pages} pages x {pool.page_size} tokens = "
            f"{pool.capacity_tokens} tokens ({pool.bytes / 2**20:.2f} MiB, "
            f"{mc.kv_bytes_per_token} bytes/token); context window: {self.config.context_len} tokens"
        )

    # -- requests in -----------------------------------------------------------------------
    def admit(self, request: Request) -> list[int]:
        """The prompt's token ids, or Rejected with the reason for a 400."""
        ids = check_at_door(request, self.tokenizer, self.config.context_len)
        pages = self.pool.pages_for(len(ids) + request.max_tokens)
        check_pool(pages * self.pool.page_size, self.pool.capacity_tokens, self.node, len(ids))
        return ids

    def submit(self, request: Request) -> str:
        """Admit `request` to the queue, or answer it 400 at once. Returns the engine's id for it."""
        now = time.perf_counter()
        request_id, tenant, name, ids = self._intake(request, self.admit)
        if ids is None:
            return request_id
        seq = Sequence(request_id, tenant, ids, request.max_tokens, request.sampling, now,
                       generator=request.sampling.new_generator(), client_request_id=name)
        if self.config.prefix_caching:
            seq.cache_keys = request_page_keys(ids, self.pool.page_size, tenant, request.cache_salt, self.config.cache_salt)
        self.seqs[request_id] = seq
        if self.audit is not None:
            self.audit.register(seq.uid, request_id, tenant, ids)
        self.scheduler.add(seq)
        self.log.add(Event(self.clock.now, self.node, "submit", request_id, tenant, (), f"{len(ids)} prompt tokens"))
        return request_id

    def _log_refusal(self, request_id: str, tenant: str, reason: str) -> None:
        self.log.add(Event(self.clock.now, self.node, "reject", request_id, tenant, (), reason))

    def cancel(self, request_id: str) -> bool:
        """The client went away: free its pages now (499). False if it was not being served."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self.scheduler.release(seq, "cancelled")
        self.log.add(Event(self.clock.now, self.node, "cancel", request_id, seq.tenant))
        seq.finish_reason = "abort"
        self._end(seq, CLIENT_CLOSED_REQUEST, "cancelled by the client")
        return True

    def output_ids(self, request_id: str) -> list[int]:
        """Tokens generated so far for a request still being served; [] otherwise."""
        seq = self.seqs.get(request_id)
        return list(seq.output_ids) if seq is not None else []

    # -- one step -------------------------------------------------------------------------
    def _busy(self) -> bool:
        return self.scheduler.has_work()

    @torch.inference_mode()
    def _advance(self) -> None:
        """Run one prefill or decode step."""
        batch = self.scheduler.schedule()
        if batch is not None:
            self._run(batch)
        self.clock.advance()

    def _run(self, batch: ScheduledBatch) -> None:
        sampled = self.runner.run(self.clock.now, batch.phase, batch.seqs, batch.new_tokens)
        if batch.phase == "prefill":  # name the prompt pages this forward wrote, before a finished request frees them
            done = [(s, s.num_cached + len(toks)) for s, toks, c in zip(batch.seqs, batch.new_tokens, sampled) if c.error is None]
            self.scheduler.cache_prompt_pages([s for s, _ in done], [n for _, n in done])
        postprocess(batch.seqs, sampled, [len(t) for t in batch.new_tokens], self.tokenizer.eos_token_id,
                    finish=self._complete, fail=self._fail)

    # -- responses out -----------------------------------------------------------------
    def _complete(self, seq: Sequence) -> None:
        """`seq` met the finish rule: free its pages and answer 200."""
        self.scheduler.release(seq, f"finished ({seq.finish_reason})")
        self.log.add(Event(self.clock.now, self.node, "finish", seq.request_id, seq.tenant, (), seq.finish_reason))
        self._end(seq, HTTPStatus.OK)

    def _fail(self, seq: Sequence, reason: str) -> None:
        """Serving `seq` raised: end it alone (500, pages freed), and keep the node going."""
        seq.finish_reason = "abort"
        self.scheduler.release(seq, "failed")
        self.log.add(Event(self.clock.now, self.node, "finish", seq.request_id, seq.tenant, (), f"failed (500): {reason}"))
        self._end(seq, HTTPStatus.INTERNAL_SERVER_ERROR, reason)

    def _end(self, seq: Sequence, status: int, error: str | None = None) -> None:
        """`seq` has left the node: answer the client and forget it."""
        del self.seqs[seq.request_id]
        if self.audit is not None:
            self.audit.retire(seq.uid)
        self._answer(self._response(seq, status, error))

    def _response(self, seq: Sequence, status: int, error: str | None = None) -> Response:
        out = [t for t in seq.output_ids if t != self.tokenizer.eos_token_id]
        return Response(
            seq.request_id, seq.tenant, status, decode(self.tokenizer, out),
            Usage(len(seq.prompt_ids), len(seq.output_ids), seq.cached_tokens), seq.first_token_s,
            list(seq.token_times_s), error, seq.finish_reason, seq.client_request_id,
        )

    def check_integrity(self) -> None:
        """Pool bookkeeping is consistent and every page holder is a live request."""
        self.pool.check_integrity()
        live = {s.request_id for s in self.scheduler.running}
        for p, holders in enumerate(self.pool.holders):
            assert set(holders) <= live, f"page {p} held by {holders}, not all of them running"
