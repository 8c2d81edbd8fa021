"""The prefill node and the decode node in two processes, joined by the distributed transfer.

`node_pair_worker` is a `dist_pair.run_pair` worker: rank 0 builds a `PrefillNode`, rank 1 a
`DecodeNode`, each with its own model copy, pool, audit, event log and `DistKVManager`, exactly
as `Cluster` builds them in one process. Both processes receive the same requests (prompt ids
already checked by a front door, one room and one audit uid each), as SGLang's router hands a
request to both workers, in waves; each steps its own node on its own clock until it holds
nothing and no room of it is still open, then takes the next wave (as a client that waits for
one answer before it sends the next request). The decode process returns every request's status and output ids.

Not behind `Cluster` yet: there is no front door across the processes (no cancel, no streaming,
no 503 for a dead worker), which is what `serve --disagg --transport distributed` still needs.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

import torch.distributed as dist

from minikv.audit import OwnershipAudit
from minikv.checkpoint import load_model
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.disagg.decode_node import DecodeNode
from minikv.disagg.dist_pair import PREFILL_RANK, run_pair
from minikv.disagg.dist_transfer import DistKVManager
from minikv.disagg.prefill_node import PrefillNode
from minikv.disagg.switches import SafetySwitches
from minikv.events import EventLog
from minikv.page_pool import PagePool
from minikv.prefix_cache import cache_salt, page_keys
from minikv.request import Request, Sequence
from minikv.sampling import SamplingParams


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
    config, switches, ps = job.config, job.switches, job.config.page_size
    prefill = rank == PREFILL_RANK
    pool = PagePool(model.config, config.prefill_pages if prefill else config.decode_pages, ps, "cpu", model.dtype,
                    switches.scrub_on_free, prefix_caching=prefill and config.prefix_caching)
    audit = OwnershipAudit(pool.num_pages * ps, ps, "prefill" if prefill else "decode")
    cap = config.transfer_batch_cap_pages if switches.transfer_batch_cap else None
    manager = DistKVManager("sender" if prefill else "receiver", pool, audit, store, peer=1 - rank, batch_cap_pages=cap)
    log = EventLog(enabled=False)
    node = (PrefillNode(model, pool, audit, log, manager, switches, config.context_len, config.max_prefill_tokens)
            if prefill else DecodeNode(model, pool, audit, log, manager, switches, tokenizer.eos_token_id))
    answers: dict[str, tuple[int, list[int]]] = {}
    first_token_s: dict[str, float] = {}  # time to first token, seen from the decode process
    tick, room = 0, 0
    dist.barrier()  # both models loaded: the clocks start together
    for wave in job.waves:
        for tenant, ids in wave:
            room += 1
            request_id = f"req-{room}"
            seq = Sequence(request_id, tenant, list(ids), job.max_tokens, SamplingParams(), time.perf_counter(),
                           uid=room, room=room)
            manager.open_room(room, request_id, tenant, seq.uid)
            audit.register(seq.uid, request_id, tenant, ids)
            if prefill and config.prefix_caching:
                seq.cache_keys = page_keys(ids, ps, cache_salt(tenant, None, per_tenant=switches.cache_salt))
            node.add(seq, tick)
        while node.live() or manager.rooms:
            if time.time() > deadline:
                raise TimeoutError(f"{node.name} still busy at tick {tick}: {node.live()} request(s), rooms {sorted(manager.rooms)}")
            node.step(tick)
            manager.land_due()
            tick += 1
            if not prefill:
                for outcome in node.take_outcomes():
                    answers[outcome.seq.request_id] = (int(outcome.status), list(outcome.seq.output_ids))
                    if outcome.seq.first_token_s is not None:
                        first_token_s[outcome.seq.request_id] = outcome.seq.first_token_s
    node.check_integrity()
    return {"answers": answers, "first_token_s": first_token_s, "pages_held": sum(1 for h in pool.holders if h),
            "cross_tenant_reads": audit.cross_tenant_reads, "ticks": tick}


def compare_first_token(num_requests: int = 20, max_tokens: int = 8) -> dict:
    """Median time to first token of the same greedy requests: in-process Cluster against the process pair."""
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
    return {"requests": num_requests, "max_tokens": max_tokens,
            "in_process_median_ttft_ms": round(1000 * statistics.median(in_process), 2),
            "distributed_median_ttft_ms": round(1000 * statistics.median(decode_side["first_token_s"].values()), 2)}


if __name__ == "__main__":
    print(json.dumps(compare_first_token()))
