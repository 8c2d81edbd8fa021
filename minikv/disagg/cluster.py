"""The front door over the pair in this process: it checks a request and the *advertised* window, opens
a bootstrap room and hands the request to both nodes, as SGLang's router does. `startup_check`
refuses a pool smaller than the window, the configuration the incident ran in.
"""

import copy
import itertools
from abc import abstractmethod
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from minikv.disagg.decode_node import DecodeNode
from minikv.disagg.node import Node
from minikv.disagg.prefill_node import PrefillNode
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer.base import KVTransfer
from minikv.disagg.transfer.inprocess import KVManager
from minikv.engine.audit import OwnershipAudit
from minikv.engine.engine import pool_and_audit, pool_line
from minikv.engine.events import Clock, EventLog
from minikv.engine.front_door import FrontDoor
from minikv.engine.page_pool import PagePool
from minikv.engine.request import Finished, Request, Sequence
from minikv.model.devices import pick_device
from minikv.model.llama import Llama

ROLES = ("prefill", "decode")
# the disclosed post-fix pool: about 2.04 million / 1,024 = 1,992 tokens; 2,000 in pages
POST_FIX_PREFILL_PAGES = 125


class StartupRefused(RuntimeError):
    """startup_check found a pool that cannot hold the context window."""


@dataclass(frozen=True)
class ClusterConfig:
    """Sizes of the pair. The defaults are the incident scaled by 1/1024 (docs/incident.md); the
    post-fix prefill pool is `ClusterConfig(prefill_pages=POST_FIX_PREFILL_PAGES)` (notebook 06)."""
    context_len: int = 1024  # 1,048,576 / 1,024
    page_size: int = 16
    prefill_pages: int = 42  # 42 x 16 = 672 tokens: about 681,280 / 1,024 = 665, in whole pages
    decode_pages: int = 125  # 2,000 tokens: our choice (the decode pool's size was not disclosed)
    max_prefill_tokens: int = 2048
    chunked_prefill: bool = False  # the prefill node takes a prompt max_prefill_tokens a step
    transfer_base_latency: int = 1  # ticks every batch takes on the wire
    transfer_pages_per_tick: int = 1
    transfer_timeout_ticks: int = 16  # a receiver that sees no progress this long gives up
    transfer_batch_cap_pages: int = 8  # pages per batch when transfer_batch_cap is on
    audit: bool = True
    event_log: bool = True
    event_log_limit: int | None = None  # recent events kept (a long-running server); None: all
    prefix_caching: bool = True  # on the prefill node only; the decode pool keeps its plain free list
    cache_tenants: int = 2  # tenants both pools are cut for with cache_partition (a scenario has two)
    devices: tuple[str, str] | None = None  # (prefill, decode); default: two GPUs if present

    def __post_init__(self) -> None:
        for name in ("context_len page_size prefill_pages decode_pages max_prefill_tokens cache_tenants "
                     "transfer_pages_per_tick transfer_timeout_ticks transfer_batch_cap_pages").split():
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if (limit := self.event_log_limit) is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"event_log_limit must be a positive integer or None, got {limit!r}")
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



def pair_devices(fallback: str) -> tuple[str, str]:
    """(prefill, decode) devices: two GPUs if there are two, else both on `fallback`."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return "cuda:0", "cuda:1"
    return fallback, fallback


def node_pool(role: str, model: Llama, config: ClusterConfig, switches: SafetySwitches,
              device: torch.device) -> tuple[PagePool, OwnershipAudit | None]:
    """A node's pool and audit: prefill's keeps a prefix cache, decode's a plain free list (as SGLang's)."""
    pages = config.prefill_pages if role == "prefill" else config.decode_pages
    return pool_and_audit(model.config, pages, config.page_size, device, model.dtype, role, config.audit,
                          role == "prefill" and config.prefix_caching, switches.scrub_on_free,
                          partition_tenants(config, switches))


def partition_tenants(config: ClusterConfig, switches: SafetySwitches) -> int | None:
    """The tenants both pools are partitioned for with `cache_partition`; None: each pool shared."""
    return config.cache_tenants if switches.cache_partition else None


def build_node(role: str, model: Llama, tokenizer: PreTrainedTokenizerBase, config: ClusterConfig,
               switches: SafetySwitches, log: EventLog, clock: Clock, manager: KVTransfer, pool: PagePool,
               audit: OwnershipAudit | None) -> Node:
    """The prefill or decode node over its pool and transfer (for Cluster and for DistCluster's workers)."""
    parts = (model, tokenizer, pool, audit, log, clock, manager, switches, config.max_prefill_tokens,
             config.chunked_prefill)
    return PrefillNode(*parts, context_len=config.context_len) if role == "prefill" else DecodeNode(*parts)


def transfer_cap(config: ClusterConfig, switches: SafetySwitches) -> int | None:
    """Pages per transfer batch: capped when `transfer_batch_cap` is on, else one batch per room."""
    return config.transfer_batch_cap_pages if switches.transfer_batch_cap else None


class PairDoor(FrontDoor):
    """The front door over a pair, in this process (Cluster) or two (DistCluster): the startup check, a
    bootstrap room per request, and /health summed from each node's `Node.report()`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: ClusterConfig, switches: SafetySwitches,
                 log: EventLog) -> None:
        if switches.startup_check and (problem := startup_problem(config)):
            raise StartupRefused(problem)
        super().__init__(config, tokenizer, log, Clock(), "door", partition_tenants(config, switches),
                         switches.cache_salt)
        self.switches = switches
        self._rooms = itertools.count(1)

    @abstractmethod
    def node_reports(self) -> dict[str, dict]:
        """Each node's latest report, by role."""

    def health(self) -> dict:
        pools = {role: {k: r.get(k, 0) for k in ("free_pages", "total_pages")}
                 for role, r in self.node_reports().items()}
        return {"pools": pools, "cross_tenant_reads": self.cross_tenant_reads}

    @property
    def cross_tenant_reads(self) -> int:
        return sum(r.get("cross_tenant_reads", 0) for r in self.node_reports().values())

    def leaked_pages(self) -> int:
        """Pages still held in either pool (zero once the pair is idle)."""
        return sum(r.get("pages_held", 0) for r in self.node_reports().values())

    def kv_in_flight(self, request_id: str) -> bool:
        """Whether a KV write of this request is on the wire (a cancel now races a late write)."""
        return any(request_id in r.get("kv_in_flight", ()) for r in self.node_reports().values())


class Cluster(PairDoor):
    """A disaggregated pair behind one front door (the same client API as Engine: front_door.py)."""

    def __init__(self, model: Llama, tokenizer: PreTrainedTokenizerBase,
                 config: ClusterConfig = ClusterConfig(),
                 switches: SafetySwitches = SafetySwitches.preset("safe")) -> None:
        log = EventLog(enabled=config.event_log, limit=config.event_log_limit)
        super().__init__(tokenizer, config, switches, log)  # one clock: the nodes step, the fabric by it
        devices = [pick_device(name) for name in config.devices or pair_devices(str(model.device))]
        models = [model if model.device == d else copy.deepcopy(model).to(d) for d in devices]
        pools = [node_pool(role, model, config, switches, d) for role, d in zip(ROLES, devices)]
        (self.prefill_pool, self.prefill_audit), (self.decode_pool, self.decode_audit) = pools
        self.manager = KVManager(self.prefill_pool, self.decode_pool, self.prefill_audit, self.decode_audit,
                                 log, self.clock, config.transfer_base_latency,
                                 config.transfer_pages_per_tick, config.transfer_timeout_ticks,
                                 transfer_cap(config, switches))
        self.nodes = tuple(build_node(role, m, tokenizer, config, switches, log, self.clock, self.manager,
                                      pool, audit) for role, m, (pool, audit) in zip(ROLES, models, pools))
        self.prefill, self.decode = self.nodes

    @property
    def tick(self) -> int:
        """The cluster's clock: the tick the next step() runs."""
        return self.clock.now

    def startup_log(self) -> list[str]:
        return [pool_line(node.name, node.pool, self.config.context_len) for node in self.nodes]

    def node_reports(self) -> dict[str, dict]:
        return {node.name: node.report() for node in self.nodes}

    def _admit(self, request: Request, request_id: str, prompt_ids: list[int]) -> Sequence:
        """Open a bootstrap room and hand the request to both nodes, as SGLang's router does; each
        keeps its own copy, as separate servers do. The decode copy is the one the client follows."""
        seq = Sequence.of(request, request_id, prompt_ids, self.page_keying, room=next(self._rooms))
        self._event("submit", request_id, seq.tenant, f"{len(prompt_ids)} prompt tokens")
        decode_half = seq.copy_for_node()  # one identity (uid) for the audit on both pools
        self.prefill.admit(seq)
        self.decode.admit(decode_half)
        return decode_half

    def _cancel(self, seq: Sequence) -> None:
        """Both nodes see finished() at their next gate and retire it."""
        if any([node.cancel(seq.request_id) for node in self.nodes]):
            self._event("cancel", seq.request_id, seq.tenant, "client cancelled")

    def has_work(self) -> bool:
        """A request is held, or pages are still held or on the wire (a cancelled request's)."""
        return super().has_work() or bool(self.prefill.live() or self.decode.live() or self.manager.posted)

    def _advance(self) -> list[Finished]:
        """One tick: prefill node, decode node, then the fabric lands what is due."""
        for node in self.nodes:
            node.step()
        self.manager.land_due()
        self.clock.advance()
        return self.decode.take_finished()

    def check_integrity(self) -> None:
        """Both nodes' pools are consistent and every page owner is a request its node holds."""
        for node in self.nodes:
            node.check_integrity()

    @property
    def cross_tenant_cache_hits(self) -> int:
        """Cached prefixes one tenant read that another tenant's request wrote (same tokens sent), all on
        prefill, the only node with a prefix cache (decode's reads of the copy are the same pairs)."""
        return self.prefill_audit.cross_tenant_cache_hits if self.prefill_audit is not None else 0
