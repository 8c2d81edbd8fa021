"""One serving node: a page pool, a scheduler, a model runner, the audit and the event log.

    engine.submit(Request("alice: save pin 1234.\\n", tenant="alice"))
    while engine.has_work():
        finished = engine.step()   # one prefill or decode step; responses that completed

The client API is front_door.py's. Every allocation, write, read, free and state change lands in
`engine.log`; every read is checked by `engine.audit`.
"""

from http import HTTPStatus

import torch
from transformers import PreTrainedTokenizerBase

from minikv.engine.audit import OwnershipAudit
from minikv.engine.config import EngineConfig
from minikv.engine.events import Clock, EventLog
from minikv.engine.front_door import FrontDoor, check_pool
from minikv.engine.model_runner import ModelRunner
from minikv.engine.page_pool import PagePool
from minikv.engine.request import CLIENT_CLOSED_REQUEST, Finished, Request, Sequence
from minikv.engine.scheduler import Scheduler
from minikv.model.llama import Llama, ModelConfig


def pool_and_audit(model: ModelConfig, pages: int, page_size: int, device: torch.device, dtype: torch.dtype,
                   node: str, audit: bool, prefix_caching: bool, scrub_on_free: bool,
                   tenants: int | None) -> tuple[PagePool, OwnershipAudit | None]:
    """A node's pool (cut for `tenants`; None: shared) and its audit, wired: every node builds them here."""
    pool = PagePool(model, pages, page_size, device, dtype, scrub_on_free, prefix_caching, tenants)
    ledger = OwnershipAudit(pages * page_size, page_size, node, pool.kv.device) if audit else None
    if ledger is not None and scrub_on_free:
        pool.on_scrub = ledger.forget  # a scrubbed slot was written by nobody
    return pool, ledger


def pool_line(node: str, pool: PagePool, context_len: int, detail: str = "") -> str:
    """A node's startup line: its pool size (and `detail`) next to the context window."""
    detail = f" ({detail})" if detail else ""
    return (f"[{node}] KV pool: {pool.num_pages} pages x {pool.page_size} tokens = {pool.capacity_tokens} "
            f"tokens{detail}; context window: {context_len} tokens")


class Engine(FrontDoor):
    """A single node: model + page pool + scheduler + audit + event log."""

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase,
                 config: EngineConfig = EngineConfig(), node: str = "single") -> None:
        mc = model.config
        if config.context_len > mc.max_position_embeddings:
            raise ValueError(f"context_len {config.context_len} exceeds the model's max_position_embeddings "
                             f"{mc.max_position_embeddings}; lower context_len")
        tenants = config.cache_tenants if config.cache_partition else None  # None: one shared pool
        log = EventLog(enabled=config.event_log, limit=config.event_log_limit)
        super().__init__(config, tokenizer, log, Clock(), node, tenants, config.cache_salt)  # Clock: step no.
        self.model, self.node = model, node
        self.pool, self.audit = pool_and_audit(mc, config.pool_pages(mc), config.page_size, model.device,
                                               model.dtype, node, config.audit, config.prefix_caching,
                                               config.scrub_on_free, tenants)
        self.scheduler = Scheduler(self.pool, self.log, node, self.clock, tokenizer,
                                   config.max_prefill_tokens, config.max_batch_size, config.chunked_prefill,
                                   config.mixed_steps)
        self.runner = ModelRunner(model, self.pool, self.audit, self.log, node)

    def startup_log(self) -> list[str]:
        size = f"{self.pool.kv.nbytes / 2**20:.2f} MiB, {self.model.config.kv_bytes_per_token} bytes/token"
        return [pool_line(self.node, self.pool, self.config.context_len, size)]

    def health(self) -> dict:
        return {"pools": {self.node: self.pool.occupancy()},
                "cross_tenant_reads": self.audit.cross_tenant_reads if self.audit is not None else 0}

    # -- requests in and out ------------------------------------------------------------------
    def _admit(self, request: Request, request_id: str, prompt_ids: list[int]) -> Sequence:
        """A request its tenant's pages could never hold is refused now (400); else it waits its turn."""
        pages = self.pool.pages_for(len(prompt_ids) + request.max_tokens)
        check_pool(pages * self.pool.page_size, self.pool.tenant_tokens, self.node, len(prompt_ids),
                   self.pool.partition is not None)
        seq = Sequence.of(request, request_id, prompt_ids, self.page_keying)
        self._event("submit", request_id, seq.tenant, f"{len(prompt_ids)} prompt tokens")
        if self.audit is not None:
            self.audit.register(seq.uid, request_id, seq.tenant, prompt_ids)
        self.scheduler.add(seq)
        return seq

    def _cancel(self, seq: Sequence) -> None:
        """Free its pages now and answer 499."""
        self.scheduler.release(seq, "cancelled")
        self._event("cancel", seq.request_id, seq.tenant)
        self._end(seq.abort(CLIENT_CLOSED_REQUEST, "cancelled by the client"))
        self._retire(seq)

    # -- one step -------------------------------------------------------------------------
    @torch.inference_mode()
    def _advance(self) -> list[Finished]:
        """Run one prefill or decode step; free what ended and log why."""
        batch, ended = self.scheduler.schedule(), []
        if batch is not None:
            sampled = self.runner.run(self.clock.now, batch.phase, batch.seqs, batch.new_tokens)
            self.scheduler.cache_prompt_pages(batch, sampled)
            ended = self.scheduler.postprocess(batch.seqs, sampled, [len(t) for t in batch.new_tokens])
        for f in ended:
            ok = f.status == HTTPStatus.OK
            self.scheduler.release(f.seq, f"finished ({f.seq.finish_reason})" if ok else "failed")
            why = f.seq.finish_reason if ok else f"failed (500): {f.error}"
            self._event("finish", f.seq.request_id, f.seq.tenant, why)
            self._retire(f.seq)
        self.clock.advance()
        return ended

    def _retire(self, seq: Sequence) -> None:
        if self.audit is not None:
            self.audit.retire(seq.uid)

    def check_integrity(self) -> None:
        """Pool bookkeeping is consistent and every page holder is a live request."""
        self.pool.check_integrity({s.request_id for s in self.scheduler.running})
