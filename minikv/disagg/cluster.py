"""The front door and the pair behind it: one prefill node, one decode node, one fabric.

The front door checks a request's shape and the *advertised* context window (a proxy's job),
opens a bootstrap room, and hands the request to both nodes, as SGLang's router does. The
client's answer comes from the decode node, or from the front door when it refuses.

`startup_check` compares the context window with every node's pool when the cluster starts;
without it the cluster starts happily with a prefill pool smaller than the window, which is
the configuration the incident ran in.
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from minikv.admission import Rejected, check_context, check_request
from minikv.audit import OwnershipAudit
from minikv.disagg.decode_node import DecodeNode
from minikv.disagg.prefill_node import PrefillNode
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer import KVManager
from minikv.events import Event, EventLog
from minikv.model import Llama
from minikv.page_pool import PagePool
from minikv.request import Request, Sequence
from minikv.response import Response, Usage, bad_request
from minikv.tokenizer import decode


POST_FIX_PREFILL_PAGES = 125  # about 2.04 million / 1,024 = 1,992 tokens, in whole pages of 16: 2,000


class StartupRefused(RuntimeError):
    """startup_check found a pool that cannot hold the context window."""


@dataclass(frozen=True)
class ClusterConfig:
    """Sizes of the pair. The defaults are the incident scaled by 1/1024 (docs/incident.md).

    The disclosed *post-fix* prefill pool, about 2.04 million tokens, scales to about 2,000
    tokens: `ClusterConfig(prefill_pages=POST_FIX_PREFILL_PAGES)` (notebook 06).
    """

    context_len: int = 1024  # 1,048,576 / 1,024
    page_size: int = 16
    prefill_pages: int = 42  # 42 x 16 = 672 tokens: about 681,280 / 1,024 = 665, in whole pages
    decode_pages: int = 125  # 2,000 tokens: our choice (the decode pool's size was not disclosed)
    max_prefill_tokens: int = 2048
    transfer_base_latency: int = 1  # ticks every batch takes on the wire
    transfer_pages_per_tick: int = 1
    transfer_timeout_ticks: int = 16  # a receiver that sees no progress this long gives up
    transfer_batch_cap_pages: int = 8  # pages per batch when transfer_batch_cap is on
    audit: bool = True
    event_log: bool = True
    devices: tuple[str, str] | None = None  # (prefill, decode); default: two GPUs if present

    def __post_init__(self) -> None:
        for name in ("context_len", "page_size", "prefill_pages", "decode_pages", "max_prefill_tokens",
                     "transfer_pages_per_tick", "transfer_timeout_ticks", "transfer_batch_cap_pages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.transfer_base_latency < 0:
            raise ValueError(f"transfer_base_latency must be >= 0, got {self.transfer_base_latency}")

    @property
    def prefill_tokens(self) -> int:
        return self.prefill_pages * self.page_size

    @property
    def decode_tokens(self) -> int:
        return self.decode_pages * self.page_size


def startup_problem(config: ClusterConfig) -> str | None:
    """Why this cluster must not start, or None: every pool must hold the whole context window."""
    for node, tokens, pages in (("prefill", config.prefill_tokens, config.prefill_pages),
                                ("decode", config.decode_tokens, config.decode_pages)):
        if tokens < config.context_len:
            need = -(-config.context_len // config.page_size)
            return (f"context window of {config.context_len} tokens exceeds the {node} node's KV pool of "
                    f"{tokens} tokens ({pages} pages x {config.page_size}); lower context_len to at most "
                    f"{tokens} or give the {node} pool at least {need} pages")
    return None


def pick_devices(config: ClusterConfig, model: Llama) -> tuple[torch.device, torch.device]:
    if config.devices is not None:
        return torch.device(config.devices[0]), torch.device(config.devices[1])
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return torch.device("cuda:0"), torch.device("cuda:1")
    return model.device, model.device


class Cluster:
    """A disaggregated pair behind one front door."""

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase, config: ClusterConfig = ClusterConfig(),
                 switches: SafetySwitches = SafetySwitches()) -> None:
        if switches.startup_check:
            problem = startup_problem(config)
            if problem:
                raise StartupRefused(problem)
        self.config, self.switches, self.tokenizer = config, switches, tokenizer
        self.log = EventLog(enabled=config.event_log)
        dev_p, dev_d = pick_devices(config, model)
        model_p = model if model.device == dev_p else copy.deepcopy(model).to(dev_p)
        model_d = model if model.device == dev_d else copy.deepcopy(model).to(dev_d)
        mc, ps = model.config, config.page_size
        self.prefill_pool = PagePool(mc, config.prefill_pages, ps, dev_p, model.dtype, switches.scrub_on_free)
        self.decode_pool = PagePool(mc, config.decode_pages, ps, dev_d, model.dtype, switches.scrub_on_free)
        audit = lambda pool, node: OwnershipAudit(pool.num_pages * ps, ps, node, pool.kv.device) if config.audit else None  # noqa: E731
        self.prefill_audit, self.decode_audit = audit(self.prefill_pool, "prefill"), audit(self.decode_pool, "decode")
        for pool, pool_audit in ((self.prefill_pool, self.prefill_audit), (self.decode_pool, self.decode_audit)):
            if pool_audit is not None:
                pool.on_scrub = pool_audit.forget  # a scrubbed slot was written by nobody
        self.manager = KVManager(
            self.prefill_pool, self.decode_pool, self.prefill_audit, self.decode_audit, self.log,
            config.transfer_base_latency, config.transfer_pages_per_tick, config.transfer_timeout_ticks,
            config.transfer_batch_cap_pages if switches.transfer_batch_cap else None,
        )
        self.prefill = PrefillNode(model_p, self.prefill_pool, self.prefill_audit, self.log, self.manager,
                                   switches, config.context_len, config.max_prefill_tokens)
        self.decode = DecodeNode(model_d, self.decode_pool, self.decode_audit, self.log, self.manager,
                                 switches, tokenizer.eos_token_id)
        self.responses: dict[str, Response] = {}
        self._outbox: list[Response] = []
        self._ids = itertools.count()
        self._rooms = itertools.count(1)
        self.tick = 0

    def startup_log(self) -> list[str]:
        """What each node logs at startup: its pool size next to the context window."""
        return [f"[{node}] KV pool: {pool.num_pages} pages x {pool.page_size} tokens = {pool.capacity_tokens} tokens; "
                f"context window: {self.config.context_len} tokens"
                for node, pool in (("prefill", self.prefill_pool), ("decode", self.decode_pool))]

    # -- requests in ---------------------------------------------------------------------------
    def submit(self, request: Request) -> str:
        request_id = request.request_id or f"req-{next(self._ids)}"
        tenant = request.tenant if isinstance(request.tenant, str) else "?"
        try:
            if request_id in self.responses or any(s == request_id for s in self._live_ids()):
                raise Rejected(f"duplicate request_id {request_id!r}")
            ids = check_request(request, self.tokenizer)
            check_context(len(ids), request.max_tokens, self.config.context_len)
        except Rejected as e:
            self.log.add(Event(self.tick, "door", "reject", request_id, tenant, (), e.reason))
            self._deliver(bad_request(request_id, tenant, e.reason, e.prompt_tokens))
            return request_id
        now, room = time.perf_counter(), next(self._rooms)
        self.manager.open_room(room, request_id, tenant)
        halves = []
        for _ in range(2):  # each node keeps its own copy of the request, as separate servers do
            seq = Sequence(request_id, tenant, list(ids), request.max_tokens, request.sampling, now, room=room)
            halves.append(seq)
        halves[1].uid = halves[0].uid  # one identity for the audit on both pools
        for audit in (self.prefill_audit, self.decode_audit):
            if audit is not None:
                audit.register(halves[0].uid, request_id, tenant)
        self.log.add(Event(self.tick, "door", "submit", request_id, tenant, (), f"{len(ids)} prompt tokens"))
        self.prefill.add(halves[0], self.tick)
        self.decode.add(halves[1], self.tick)
        return request_id

    def cancel(self, request_id: str) -> bool:
        """The client went away. Both nodes see finished() at their next gate and retire it."""
        found, tenant = False, "?"
        for node_queues in ((self.prefill.bootstrap_queue, self.prefill.waiting_queue, self.prefill.inflight_queue),
                            (self.decode.prealloc_queue, self.decode.transfer_queue, self.decode.running)):
            for q in node_queues:
                for seq in q:
                    if seq.request_id == request_id and not seq.finished():
                        seq.finish_reason = "abort"
                        found, tenant = True, seq.tenant
        if found:
            self.log.add(Event(self.tick, "door", "cancel", request_id, tenant, (), "client cancelled"))
        return found

    def _live_ids(self):
        for q in (self.prefill.bootstrap_queue, self.prefill.waiting_queue, self.prefill.inflight_queue,
                  self.decode.prealloc_queue, self.decode.transfer_queue, self.decode.running):
            for s in q:
                yield s.request_id

    # -- the clock -----------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.prefill.live() or self.decode.live() or self.manager.posted or self._outbox)

    def step(self) -> list[Response]:
        """One tick: prefill node, decode node, then the fabric lands what is due."""
        self.prefill.step(self.tick)
        self.decode.step(self.tick)
        self.manager.tick()
        self.tick += 1
        for outcome in self.decode.outcomes:
            self._deliver(self._response(outcome.seq, outcome.status, outcome.error))
        self.decode.outcomes = []
        done, self._outbox = self._outbox, []
        return done

    def run(self, max_ticks: int = 100_000) -> list[Response]:
        done: list[Response] = []
        for _ in range(max_ticks):
            if not self.has_work():
                return done
            done += self.step()
        raise RuntimeError(f"cluster still busy after {max_ticks} ticks")

    def generate(self, prompts: list[str], max_tokens: int = 64, tenant: str = "anon") -> list[Response]:
        ids = [self.submit(Request(p, tenant, max_tokens)) for p in prompts]
        self.run()
        return [self.responses[i] for i in ids]

    # -- responses out ---------------------------------------------------------------------------
    def _response(self, seq: Sequence, status: int, error: str | None) -> Response:
        out = [t for t in seq.output_ids if t != self.tokenizer.eos_token_id] if status == 200 else []
        return Response(seq.request_id, seq.tenant, status, decode(self.tokenizer, out),
                        Usage(len(seq.prompt_ids), len(seq.output_ids) if status == 200 else 0),
                        seq.first_token_s if status == 200 else None, list(seq.token_times_s), error,
                        seq.finish_reason)

    def _deliver(self, response: Response) -> None:
        self.responses[response.request_id] = response
        self._outbox.append(response)

    # -- what the fuzzer checks ------------------------------------------------------------------
    @property
    def cross_tenant_reads(self) -> int:
        return sum(a.cross_tenant_reads for a in (self.prefill_audit, self.decode_audit) if a is not None)

    def leaked_pages(self) -> int:
        """Pages owned by nobody live once the cluster is idle (should be zero)."""
        owned = [p for pool in (self.prefill_pool, self.decode_pool) for p in pool.owner if p is not None]
        return len(owned)
