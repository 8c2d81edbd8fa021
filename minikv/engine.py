"""One serving node: admission control, continuous batching over a page pool, and responses.

The step-wise API is what notebooks use to watch the engine work:

    engine.submit(Request("alice: save pin 1234.\\n", tenant="alice"))
    while engine.has_work():
        finished = engine.step()   # one prefill or decode step; responses that completed

`generate([...])` does all of that in one call. Every allocation, write, read, free and state
change lands in `engine.log`; every read is checked by `engine.audit`.
"""

from __future__ import annotations

import itertools
import time

import torch
from transformers import PreTrainedTokenizerBase

from minikv.admission import Rejected, check_context, check_pool, check_request
from minikv.audit import OwnershipAudit
from minikv.config import EngineConfig
from minikv.events import Event, EventLog
from minikv.model import Llama
from minikv.page_pool import PagePool
from minikv.prefix_cache import cache_salt, page_keys
from minikv.model_runner import ModelRunner
from minikv.request import Request, Sequence, SeqStatus
from minikv.response import Response, Usage, bad_request
from minikv.sampling import SamplingParams
from minikv.scheduler import ScheduledBatch, Scheduler
from minikv.tokenizer import decode


class Engine:
    """A single node: model + page pool + scheduler + audit + event log."""

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase,
                 config: EngineConfig = EngineConfig(), node: str = "single",
                 scrub_on_free: bool = False) -> None:
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
        self.log = EventLog(enabled=config.event_log)
        self.scheduler = Scheduler(self.pool, config, self.log, node)
        self.runner = ModelRunner(model, self.pool, self.audit, self.log, node)
        self.seqs: dict[str, Sequence] = {}
        self.responses: dict[str, Response] = {}
        self._outbox: list[Response] = []  # finished but not yet returned by step()
        self._ids = itertools.count()

    # -- what a serving engineer reads at startup ---------------------------------------
    def startup_log(self) -> str:
        mc, pool = self.model.config, self.pool
        return (
            f"[{self.node}] KV pool: {pool.num_pages} pages x {pool.page_size} tokens = "
            f"{pool.capacity_tokens} tokens ({pool.bytes / 2**20:.2f} MiB, "
            f"{mc.kv_bytes_per_token} bytes/token); context window: {self.config.context_len} tokens"
        )

    # -- requests in -----------------------------------------------------------------------
    def admit(self, request: Request, request_id: str) -> list[int]:
        """The prompt's token ids, or Rejected with the reason for a 400."""
        if request_id in self.seqs or request_id in self.responses:
            raise Rejected(f"duplicate request_id {request_id!r}")
        ids = check_request(request, self.tokenizer)
        check_context(len(ids), request.max_tokens, self.config.context_len)
        pages = self.pool.pages_for(len(ids) + request.max_tokens)
        check_pool(pages * self.pool.page_size, self.pool.capacity_tokens, self.node, len(ids))
        return ids

    def submit(self, request: Request) -> str:
        """Admit `request` to the queue, or answer it 400 at once. Returns its request id."""
        request_id = request.request_id or f"req-{next(self._ids)}"
        now = time.perf_counter()
        tenant = request.tenant if isinstance(request.tenant, str) else "?"
        try:
            ids = self.admit(request, request_id)
        except Rejected as e:
            self.log.add(Event(self.scheduler.step_no, self.node, "reject", request_id, tenant, (), e.reason))
            self._finish_response(bad_request(request_id, tenant, e.reason, e.prompt_tokens))
            return request_id
        seq = Sequence(request_id, tenant, ids, request.max_tokens, request.sampling, now)
        if self.config.prefix_caching:
            salt = cache_salt(tenant, request.cache_salt, per_tenant=self.config.cache_salt)
            seq.cache_keys = page_keys(ids, self.pool.page_size, salt)
        if not request.sampling.greedy:
            seq.generator = torch.Generator().manual_seed(request.sampling.seed if request.sampling.seed is not None else 0)
        self.seqs[request_id] = seq
        if self.audit is not None:
            self.audit.register(seq.uid, request_id, tenant, ids)
        self.scheduler.add(seq)
        self.log.add(Event(self.scheduler.step_no, self.node, "submit", request_id, tenant, (), f"{len(ids)} prompt tokens"))
        return request_id

    def cancel(self, request_id: str) -> bool:
        """The client went away: free its pages now. False if it was not live."""
        seq = self.seqs.get(request_id)
        if seq is None or seq.status is SeqStatus.FINISHED:
            return False
        self.scheduler.release(seq, "cancelled")
        self.log.add(Event(self.scheduler.step_no, self.node, "cancel", request_id, seq.tenant))
        seq.finish_reason = "abort"
        self._finish_response(self._response(seq, status=499, error="cancelled by the client"))
        return True

    # -- one step -------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._outbox)

    @torch.inference_mode()
    def step(self) -> list[Response]:
        """Run one prefill or decode step; return the responses that completed."""
        batch = self.scheduler.schedule()
        if batch is not None:
            self._run(batch)
        self.scheduler.step_no += 1
        done, self._outbox = self._outbox, []
        return done

    def _run(self, batch: ScheduledBatch) -> None:
        chosen = self.runner.run(self.scheduler.step_no, batch.phase, batch.seqs, batch.new_tokens)
        if batch.phase == "prefill":
            self.scheduler.cache_prompt_pages(batch.seqs)
        for seq, nxt in zip(batch.seqs, chosen):
            if nxt == self.tokenizer.eos_token_id:
                self._complete(seq, "stop")
            elif len(seq.output_ids) >= seq.max_tokens:
                self._complete(seq, "length")

    # -- responses out -----------------------------------------------------------------
    def _complete(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.scheduler.release(seq, f"finished ({reason})")
        self.log.add(Event(self.scheduler.step_no, self.node, "finish", seq.request_id, seq.tenant, (), reason))
        self._finish_response(self._response(seq, status=200))

    def _response(self, seq: Sequence, status: int, error: str | None = None) -> Response:
        out = [t for t in seq.output_ids if t != self.tokenizer.eos_token_id]
        return Response(
            seq.request_id, seq.tenant, status, decode(self.tokenizer, out),
            Usage(len(seq.prompt_ids), len(seq.output_ids), seq.cached_tokens), seq.first_token_s,
            list(seq.token_times_s), error, seq.finish_reason,
        )

    def _finish_response(self, response: Response) -> None:
        self.responses[response.request_id] = response
        self._outbox.append(response)

    # -- convenience -----------------------------------------------------------------------
    def run(self, max_steps: int = 100_000) -> list[Response]:
        """Step until every submitted request is answered; responses in completion order."""
        done: list[Response] = []
        for _ in range(max_steps):
            if not self.has_work():
                return done
            done += self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def generate(self, prompts: list[str], max_tokens: int = 64, tenant: str = "anon",
                 sampling: SamplingParams = SamplingParams()) -> list[Response]:
        """Submit every prompt, run to completion, return responses in prompt order."""
        ids = [self.submit(Request(p, tenant, max_tokens, sampling)) for p in prompts]
        self.run()
        return [self.responses[i] for i in ids]

    def check_integrity(self) -> None:
        """Pool bookkeeping is consistent and every page holder is a live request."""
        self.pool.check_integrity()
        live = {s.request_id for s in self.scheduler.running}
        for p, holders in enumerate(self.pool.holders):
            assert set(holders) <= live, f"page {p} held by {holders}, not all of them running"
