"""The prefill node and the decode node in two processes, joined by the distributed transfer.

`build_node_worker` builds one process's half: rank 0 a `PrefillNode`, rank 1 a `DecodeNode`,
each with its own model copy, pool, audit, event log (off) and `DistKVManager`, as `Cluster`
builds them in one process.

`node_pair_worker` is a `dist_pair.run_pair` worker on it. Both processes receive the same
requests (prompt ids already checked by a front door, one room and one audit uid each), as
SGLang's router hands a request to both workers, in waves; each steps its own node on its own clock until it holds
nothing and no room of it is still open, then takes the next wave (as a client that waits for
one answer before it sends the next request). The decode process returns every request's status and output ids.

The front door across the processes (cancel, streaming, 503 for a dead worker) is `dist_cluster.py`.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

import torch.distributed as dist

from minikv.audit import OwnershipAudit
from minikv.checkpoint import load_model
from minikv.disagg.cluster import Cluster, ClusterConfig, pool_line
from minikv.disagg.decode_node import DecodeNode
from minikv.disagg.dist_pair import PREFILL_RANK, run_pair
from minikv.disagg.dist_transfer import DistKVManager
from minikv.disagg.prefill_node import PrefillNode
from minikv.disagg.switches import SafetySwitches
from minikv.events import EventLog
from minikv.model import Llama
from minikv.page_pool import PagePool
from minikv.prefix_cache import request_page_keys
from minikv.request import Request, Sequence
from minikv.sampling import SamplingParams


@dataclass
class NodeWorker:
    """One process's half of the pair: its node, pool, audit and `DistKVManager`.

    `build_node_worker` makes it the way `Cluster` builds each node in one process; both
    `node_pair_worker` (requests in waves) and `dist_worker` (requests from the front door) drive it.
    """

    node: PrefillNode | DecodeNode
    manager: DistKVManager
    pool: PagePool
    audit: OwnershipAudit | None

    @property
    def is_prefill(self) -> bool:
        return isinstance(self.node, PrefillNode)

    def admit(self, seq: Sequence, tick: int) -> None:
        """Open `seq`'s room on this side, register it with the audit, and hand it to the node."""
        if not self.is_prefill:
            seq.cache_keys = []  # the decode pool keeps no prefix cache
        self.manager.open_room(seq.room, seq.request_id, seq.tenant, seq.uid)
        if self.audit is not None:
            self.audit.register(seq.uid, seq.request_id, seq.tenant, seq.prompt_ids)
        self.node.add(seq, tick)

    def busy(self) -> bool:
        """A request is held, or a room of this side is still open."""
        return bool(self.node.live() or self.manager.rooms)

    def step(self, tick: int) -> None:
        self.node.step(tick)
        self.manager.land_due()

    def startup_line(self, context_len: int) -> str:
        return pool_line(self.node.name, self.pool, context_len)

    def report(self) -> dict:
        """What this side reports: pool occupancy and what its audit saw."""
        return {**self.pool.occupancy(),
                "pages_held": sum(1 for h in self.pool.holders if h),
                "cross_tenant_reads": self.audit.cross_tenant_reads if self.audit is not None else 0,
                "late_writes": [{"room": r, "pages": pages, "holders": holders} for r, pages, holders in self.manager.landed_late]}


def build_node_worker(rank: int, store: dist.Store, model: Llama, eos_id: int, config: ClusterConfig,
                      switches: SafetySwitches, timeout_s: float | None = None, link_s_per_page: float = 0.0) -> NodeWorker:
    """Rank 0 a `PrefillNode`, rank 1 a `DecodeNode`, on `model`'s device, with the event log off."""
    prefill, ps = rank == PREFILL_RANK, config.page_size
    pool = PagePool(model.config, config.prefill_pages if prefill else config.decode_pages, ps, model.device, model.dtype,
                    switches.scrub_on_free, prefix_caching=prefill and config.prefix_caching)
    audit = OwnershipAudit(pool.num_pages * ps, ps, "prefill" if prefill else "decode", pool.kv.device) if config.audit else None
    if audit is not None:
        pool.on_scrub = audit.forget  # a scrubbed slot was written by nobody
    cap = config.transfer_batch_cap_pages if switches.transfer_batch_cap else None
    manager = DistKVManager("sender" if prefill else "receiver", pool, audit, store, peer=1 - rank, batch_cap_pages=cap,
                            timeout_s=timeout_s, link_s_per_page=link_s_per_page)
    log = EventLog(enabled=False)
    node = (PrefillNode(model, pool, audit, log, manager, switches, config.context_len, config.max_prefill_tokens)
            if prefill else DecodeNode(model, pool, audit, log, manager, switches, eos_id))
    return NodeWorker(node, manager, pool, audit)


@dataclass(frozen=True)
class PairJob:
    """What both processes are given: the requests and how the pair is configured."""

    waves: list[list[tuple[str, list[int]]]]  # (tenant, prompt ids) per request; a wave starts when the last has drained
    max_tokens: int
    config: ClusterConfig
    switches: SafetySwitches


def node_pair_worker(rank: int, store: dist.Store, deadline: float, job: PairJob) -> dict:
    """Run this rank's node over every request; the decode rank returns {request id: (status, output ids)}."""
    model, tokenizer = load_model(device="cpu")
    config, switches = job.config, job.switches
    worker = build_node_worker(rank, store, model, tokenizer.eos_token_id, config, switches)
    answers: dict[str, tuple[int, list[int]]] = {}
    first_token_s: dict[str, float] = {}  # time to first token, seen from the decode process
    tick, room = 0, 0
    dist.barrier()  # both models loaded: the clocks start together
    for wave in job.waves:
        for tenant, ids in wave:
            room += 1
            seq = Sequence(f"req-{room}", tenant, list(ids), job.max_tokens, SamplingParams(), time.perf_counter(),
                           uid=room, room=room)
            if config.prefix_caching:
                seq.cache_keys = request_page_keys(ids, config.page_size, tenant, None, switches.cache_salt)
            worker.admit(seq, tick)
        while worker.busy():
            if time.time() > deadline:
                raise TimeoutError(f"{worker.node.name} still busy at tick {tick}: {worker.node.live()} request(s), "
                                   f"rooms {sorted(worker.manager.rooms)}")
            worker.step(tick)
            tick += 1
            if not worker.is_prefill:
                for outcome in worker.node.take_outcomes():
                    answers[outcome.seq.request_id] = (int(outcome.status), list(outcome.seq.output_ids))
                    if outcome.seq.first_token_s is not None:
                        first_token_s[outcome.seq.request_id] = outcome.seq.first_token_s
    worker.node.check_integrity()
    return {"answers": answers, "first_token_s": first_token_s, "ticks": tick, **worker.report()}


def compare_first_token(num_requests: int = 20, max_tokens: int = 8) -> dict:
    """Median time to first token of the same greedy requests: in-process Cluster, the node pair in two
    processes (waves, no front door), and DistCluster (the front door and its queues included)."""
    model, tokenizer = load_model(device="cpu")
    config, switches = ClusterConfig(prefill_pages=64, decode_pages=128), SafetySwitches()
    prompts = [(f"tenant-{i % 3}", f"Request {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 4))
               for i in range(num_requests)]
    pair = Cluster(model, tokenizer, config, switches)
    for tenant, prompt in prompts:
        pair.submit(Request(prompt, tenant, max_tokens))
    in_process = [r.ttft_s for r in pair.run()]
    job = PairJob([[(tenant, pair.check(Request(prompt, tenant, max_tokens))) for tenant, prompt in prompts]],
                  max_tokens, config, switches)
    _, decode_side = run_pair(node_pair_worker, job, timeout_s=120)
    from minikv.disagg.dist_cluster import DistCluster  # it imports this module

    front_door = DistCluster(tokenizer, config, switches)
    try:
        for tenant, prompt in prompts:
            front_door.submit(Request(prompt, tenant, max_tokens))
        behind_front_door = [r.ttft_s for r in front_door.run()]
    finally:
        front_door.close()
    return {"requests": num_requests, "max_tokens": max_tokens,
            "in_process_median_ttft_ms": round(1000 * statistics.median(in_process), 2),
            "distributed_median_ttft_ms": round(1000 * statistics.median(decode_side["first_token_s"].values()), 2),
            "dist_cluster_median_ttft_ms": round(1000 * statistics.median(behind_front_door), 2)}


if __name__ == "__main__":
    print(json.dumps(compare_first_token()))
