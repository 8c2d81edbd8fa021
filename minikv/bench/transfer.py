"""The distributed KV transfer over loopback (docs/disagg.md), and `run_pair`, the harness of a bare pair:
`python -m minikv.bench.transfer --pages 256` (MiB/s, pages/s) or `--first-token` (Cluster vs DistCluster)."""

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minikv.disagg.dist.cluster import free_port
from minikv.disagg.dist.worker import DECODE_RANK, PREFILL_RANK
from minikv.disagg.transfer.base import KVPoll, KVReceiver, KVSender, Shipment
from minikv.disagg.transfer.torch_dist import DistKVManager
from minikv.engine.audit import OwnershipAudit
from minikv.engine.page_pool import PagePool
from minikv.model.llama import ModelConfig
from minikv.serve.flags import positive_int

Worker = Callable[[int, dist.Store, float, tuple], dict]


def _entry(rank: int, worker: Worker, args: tuple, port: int, out_dir: str, deadline: float) -> None:
    torch.set_num_threads(1)
    timeout = timedelta(seconds=max(1.0, deadline - time.time()))
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == PREFILL_RANK, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    try:
        result = worker(rank, store, deadline, args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # neither side leaves while the other may still need the store
    finally:
        dist.destroy_process_group()


def run_pair(worker: Worker, args: tuple = (), timeout_s: float = 30.0) -> tuple[dict, dict]:
    """`worker(rank, store, deadline, args)` as prefill (sender) and decode, gloo over loopback, both killed
    past `timeout_s`; (prefill result, decode result)."""
    with tempfile.TemporaryDirectory() as out_dir:
        deadline = time.time() + timeout_s
        ctx = mp.spawn(_entry, args=(worker, args, free_port(), out_dir, deadline), nprocs=2, join=False)
        while not ctx.join(timeout=max(0.1, deadline - time.time())):
            if time.time() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"the process pair did not finish within {timeout_s:.0f} s")
        return tuple(torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)  # files this call just wrote
                     for r in (PREFILL_RANK, DECODE_RANK))


def wait_for(condition: Callable[[], bool], deadline: float, what: str) -> None:
    """Spin until `condition()` holds; raise past the deadline."""
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.0005)


def make_pool(config: ModelConfig, num_pages: int, page_size: int) -> tuple[PagePool, OwnershipAudit]:
    return PagePool(config, num_pages, page_size), OwnershipAudit(num_pages * page_size, page_size, "node")


BENCH_CONFIG = ModelConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                           num_kv_heads=2, head_dim=64, max_position_embeddings=256)


def _throughput_worker(rank: int, store: dist.Store, deadline: float, args: tuple) -> dict:
    """Carry `rooms` rooms of `pages_per_room` pages each through the protocol, one after another."""
    pages_per_room, rooms, page_size = args
    pool, audit = make_pool(BENCH_CONFIG, pages_per_room, page_size)
    manager = DistKVManager("sender" if rank == PREFILL_RANK else "receiver", pool, audit, store, peer=1 - rank)
    pages, shipment = list(range(pages_per_room)), Shipment(pages_per_room * page_size, 0, None)
    dist.barrier()
    start = time.perf_counter()
    for room in range(rooms):
        manager.open_room(room, f"r{room}", "t", uid=room + 1)
        if rank == PREFILL_RANK:
            endpoint: KVSender | KVReceiver = KVSender(manager, room)
            wait_for(lambda: endpoint.poll() is KVPoll.WaitingForInput, deadline, f"room {room}'s destination pages")
            endpoint.init(len(pages))
            endpoint.send(pages, shipment)
        else:
            endpoint = KVReceiver(manager, room)
            endpoint.send_metadata(pages)

        def finished() -> bool:
            manager.land_due()
            return endpoint.poll() in (KVPoll.Success, KVPoll.Failed)

        wait_for(finished, deadline, f"room {room} to finish")
        assert endpoint.poll() is KVPoll.Success
        endpoint.close()
    return {"seconds": time.perf_counter() - start}


def measure(pages_per_room: int, rooms: int, page_size: int = 16, timeout_s: float = 120.0) -> dict:
    """Loopback throughput of the distributed backend, as the receiver saw it."""
    _, decode = run_pair(_throughput_worker, (pages_per_room, rooms, page_size), timeout_s)
    c = BENCH_CONFIG
    page_bytes = c.num_layers * 2 * page_size * c.num_kv_heads * c.head_dim * 4  # float32
    total_pages = pages_per_room * rooms
    return {"backend": "distributed (gloo, loopback)", "rooms": rooms, "pages_per_room": pages_per_room,
            "page_kib": page_bytes / 1024, "seconds": round(decode["seconds"], 4),
            "mib_per_s": round(total_pages * page_bytes / 2**20 / decode["seconds"], 1),
            "pages_per_s": round(total_pages / decode["seconds"], 1)}


def compare_first_token(num_requests: int = 20, max_tokens: int = 8) -> dict:
    """Median time to first token of the same requests through Cluster and DistCluster (two processes)."""
    from minikv.bench.systems import BenchRequest, serve_all
    from minikv.disagg.cluster import Cluster, ClusterConfig
    from minikv.disagg.dist.cluster import DistCluster
    from minikv.disagg.switches import SafetySwitches
    from minikv.model.checkpoint import load_model

    model, tokenizer = load_model(device="cpu")
    config, switches = ClusterConfig(prefill_pages=64, decode_pages=128), SafetySwitches.preset("safe")
    workload = [BenchRequest(f"Request {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 4), max_tokens,
                             f"tenant-{i % 3}") for i in range(num_requests)]
    result = {"requests": num_requests, "max_tokens": max_tokens}
    for name, door in (("in_process", lambda: Cluster(model, tokenizer, config, switches)),
                       ("dist_cluster", lambda: DistCluster(tokenizer, config, switches))):
        with closing(door()) as pair:
            result[f"{name}_median_ttft_ms"] = round(1000 * statistics.median(serve_all(pair, workload).ttft_s), 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure the distributed KV transfer over loopback.")
    parser.add_argument("--pages", type=positive_int, default=256, help="pages per room")
    parser.add_argument("--rooms", type=positive_int, default=8, help="rooms, transferred one after another")
    parser.add_argument("--first-token", action="store_true", help="time to first token: Cluster vs DistCluster")
    args = parser.parse_args(argv)
    print(json.dumps(compare_first_token() if args.first_token else measure(args.pages, args.rooms)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
