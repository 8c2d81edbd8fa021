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
from http import HTTPStatus

import torch
from transformers import PreTrainedTokenizerBase

from minikv.admission import check_at_door
from minikv.audit import OwnershipAudit
from minikv.devices import pick_device
from minikv.disagg.decode_node import DecodeNode
from minikv.disagg.prefill_node import PrefillNode
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer import KVManager
from minikv.events import Clock, Event, EventLog
from minikv.front_door import FrontDoor
from minikv.model import Llama
from minikv.page_pool import PagePool
from minikv.prefix_cache import request_page_keys
from minikv.request import Request, Sequence
from minikv.response import Response, Usage
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
    event_log_limit: int | None = None  # keep about this many recent events (a long-running server); None: all
    prefix_caching: bool = True  # on the prefill node only; the decode pool keeps its plain free list
    devices: tuple[str, str] | None = None  # (prefill, decode); default: two GPUs if present

    def __post_init__(self) -> None:
        for name in ("context_len", "page_size", "prefill_pages", "decode_pages", "max_prefill_tokens",
                     "transfer_pages_per_tick", "transfer_timeout_ticks", "transfer_batch_cap_pages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.event_log_limit is not None and (not isinstance(self.event_log_limit, int) or self.event_log_limit < 1):
            raise ValueError(f"event_log_limit must be a positive integer or None, got {self.event_log_limit!r}")
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


def pool_line(node: str, pool: PagePool, context_len: int) -> str:
    """A node's startup line: its pool size next to the context window."""
    return (f"[{node}] KV pool: {pool.num_pages} pages x {pool.page_size} tokens = {pool.capacity_tokens} tokens; "
            f"context window: {context_len} tokens")


def pick_devices(config: ClusterConfig, model: Llama) -> tuple[torch.device, torch.device]:
    if config.devices is not None:
        return pick_device(config.devices[0]), pick_device(config.devices[1])
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return torch.device("cuda:0"), torch.device("cuda:1")
    return model.device, model.device


def decode_response(tokenizer: PreTrainedTokenizerBase, seq: Sequence, status: int, error: str | None) -> Response:
    """The client's response for a request that left the decode node with `status`."""
    ok = status == HTTPStatus.OK
    out = [t for t in seq.output_ids if t != tokenizer.eos_token_id] if ok else []
    return Response(seq.request_id, seq.tenant, status, decode(tokenizer, out),
                    Usage(len(seq.prompt_ids), len(seq.output_ids) if ok else 0, seq.cached_tokens if ok else 0),
                    seq.first_token_s if ok else None, list(seq.token_times_s), error,
                    seq.finish_reason, seq.client_request_id)


class Cluster(FrontDoor):
    """A disaggregated pair behind one front door (the same client API as Engine: front_door.py)."""

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase, config: ClusterConfig = ClusterConfig(),
                 switches: SafetySwitches = SafetySwitches()) -> None:
        if switches.startup_check:
            problem = startup_problem(config)
            if problem:
                raise StartupRefused(problem)
        super().__init__()
        self.config, self.switches, self.tokenizer = config, switches, tokenizer
        self.log = EventLog(enabled=config.event_log, limit=config.event_log_limit)
        self.clock = Clock()  # the cluster's one clock: nodes step by it, the fabric lands by it
        dev_p, dev_d = pick_devices(config, model)
        model_p = model if model.device == dev_p else copy.deepcopy(model).to(dev_p)
        model_d = model if model.device == dev_d else copy.deepcopy(model).to(dev_d)
        mc, ps = model.config, config.page_size
        self.prefill_pool = PagePool(mc, config.prefill_pages, ps, dev_p, model.dtype, switches.scrub_on_free,
                                     prefix_caching=config.prefix_caching)
        self.decode_pool = PagePool(mc, config.decode_pages, ps, dev_d, model.dtype, switches.scrub_on_free)
        audit = lambda pool, node: OwnershipAudit(pool.num_pages * ps, ps, node, pool.kv.device) if config.audit else None
        self.prefill_audit, self.decode_audit = audit(self.prefill_pool, "prefill"), audit(self.decode_pool, "decode")
        for pool, pool_audit in ((self.prefill_pool, self.prefill_audit), (self.decode_pool, self.decode_audit)):
            if pool_audit is not None:
                pool.on_scrub = pool_audit.forget  # a scrubbed slot was written by nobody
        self.manager = KVManager(
            self.prefill_pool, self.decode_pool, self.prefill_audit, self.decode_audit, self.log, self.clock,
            config.transfer_base_latency, config.transfer_pages_per_tick, config.transfer_timeout_ticks,
            config.transfer_batch_cap_pages if switches.transfer_batch_cap else None,
        )
        self.prefill = PrefillNode(model_p, self.prefill_pool, self.prefill_audit, self.log, self.manager,
                                   switches, config.context_len, config.max_prefill_tokens)
        self.decode = DecodeNode(model_d, self.decode_pool, self.decode_audit, self.log, self.manager,
                                 switches, tokenizer.eos_token_id)
        self._rooms = itertools.count(1)

    @property
    def tick(self) -> int:
        """The cluster's clock: the tick the next step() runs."""
        return self.clock.now

    def health(self) -> dict:
        return {"pools": {"prefill": self.prefill_pool.occupancy(), "decode": self.decode_pool.occupancy()},
                "cross_tenant_reads": self.cross_tenant_reads}

    def startup_log(self) -> list[str]:
        """What each node logs at startup: its pool size next to the context window."""
        return [pool_line(node, pool, self.config.context_len)
                for node, pool in (("prefill", self.prefill_pool), ("decode", self.decode_pool))]

    # -- requests in ---------------------------------------------------------------------------
    def submit(self, request: Request) -> str:
        """Check the request at the door and hand it to both nodes, or answer it 400 at once."""
        request_id, tenant, name, ids = self._intake(request, self.check)
        if ids is None:
            return request_id
        now, room = time.perf_counter(), next(self._rooms)
        halves = []
        for _ in range(2):  # each node keeps its own copy of the request, as separate servers do
            halves.append(Sequence(request_id, tenant, list(ids), request.max_tokens, request.sampling, now,
                                   generator=request.sampling.new_generator(), client_request_id=name, room=room))
        halves[1].uid = halves[0].uid  # one identity for the audit on both pools
        self.manager.open_room(room, request_id, tenant, halves[0].uid)
        if self.config.prefix_caching:
            halves[0].cache_keys = request_page_keys(ids, self.config.page_size, tenant, request.cache_salt,
                                                     self.switches.cache_salt)
        for audit in (self.prefill_audit, self.decode_audit):
            if audit is not None:
                audit.register(halves[0].uid, request_id, tenant, ids)
        self.log.add(Event(self.tick, "door", "submit", request_id, tenant, (), f"{len(ids)} prompt tokens"))
        self.prefill.add(halves[0], self.tick)
        self.decode.add(halves[1], self.tick)
        return request_id

    def check(self, request: Request) -> list[int]:
        """The front door's checks (shape and the advertised window): the prompt's token ids, or Rejected."""
        return check_at_door(request, self.tokenizer, self.config.context_len)

    def _log_refusal(self, request_id: str, tenant: str, reason: str) -> None:
        self.log.add(Event(self.tick, "door", "reject", request_id, tenant, (), reason))

    def cancel(self, request_id: str) -> bool:
        """The client went away. Both nodes see finished() at their next gate and retire it."""
        found = [node.cancel(request_id) for node in (self.prefill, self.decode)]
        if any(found):
            self.log.add(Event(self.tick, "door", "cancel", request_id, self._tenant_of[request_id], (), "client cancelled"))
        return any(found)

    def output_ids(self, request_id: str) -> list[int]:
        """Tokens generated so far for a request still being served (decode generates them); [] otherwise."""
        return self.decode.output_ids(request_id)

    # -- the clock -----------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self.prefill.live() or self.decode.live() or self.manager.posted)

    def _advance(self) -> None:
        """One tick: prefill node, decode node, then the fabric lands what is due."""
        self.prefill.step(self.tick)
        self.decode.step(self.tick)
        self.manager.land_due()
        self.clock.advance()
        for outcome in self.decode.take_outcomes():
            self._answer(self._response(outcome.seq, outcome.status, outcome.error))

    def _response(self, seq: Sequence, status: int, error: str | None) -> Response:
        return decode_response(self.tokenizer, seq, status, error)

    # -- what the fuzzer checks ------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Both nodes' pools are consistent and every page owner is a request its node holds."""
        self.prefill.check_integrity()
        self.decode.check_integrity()

    @property
    def cross_tenant_reads(self) -> int:
        return sum(a.cross_tenant_reads for a in (self.prefill_audit, self.decode_audit) if a is not None)

    @property
    def cross_tenant_cache_hits(self) -> int:
        """Cached prefixes one tenant read that another tenant's request wrote (same tokens sent).

        Every hit happens on prefill, the only node with a prefix cache; decode's reads of the
        transferred copy are the same (reader, writer) pairs, so prefill's ledger holds the count."""
        return self.prefill_audit.cross_tenant_cache_hits if self.prefill_audit is not None else 0

    def leaked_pages(self) -> int:
        """Pages owned by nobody live once the cluster is idle (should be zero)."""
        return sum(1 for pool in (self.prefill_pool, self.decode_pool) for h in pool.holders if h)

    def kv_in_flight(self, request_id: str) -> bool:
        """Whether a KV write of this request is on the wire now (a cancel now races a late write)."""
        return any(self.manager.rooms[b.room].request_id == request_id for b in self.manager.posted)
