"""One worker process of the distributed pair: a node, stepped whenever it has work, driven by messages.

`DistCluster` (dist_cluster.py) starts two of these with torch.multiprocessing: rank 0 the
prefill worker, rank 1 the decode worker. Each loads its own model copy on its own device, joins
the process group (gloo, also between GPUs: see `WorkerSpec.backend`) through the bootstrap `TCPStore`,
builds its half with `dist_nodes.build_node_worker`, and then loops:

    commands in   ("admit", SeqSpec)   a request the front door checked, with its room and uid
                  ("cancel", id)       the client went away
                  ("stop",)            shut down
    messages out  ("ready", rank, startup line)
                  ("in_flight", id)          prefill: the request's KV is posted (a cancel now races a late write)
                  ("tokens", id, ids)        decode: tokens generated since the last message (what the server streams)
                  ("outcome", seq, status, error)  decode: how the request left (seq without its generator)
                  ("report", rank, dict)     pool occupancy and audit, after every change
                  ("error", rank, text)      the worker failed and is exiting

The KV itself never goes through these queues: the pages travel on torch.distributed
(`DistKVManager`). A worker exits when told to, when its parent process is gone, or on an error
it reports first; the front door notices a worker that died without a word by its exit code.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minikv.checkpoint import load_model
from minikv.disagg.cluster import ClusterConfig
from minikv.disagg.dist_nodes import NodeWorker, build_node_worker
from minikv.disagg.dist_pair import PREFILL_RANK
from minikv.disagg.switches import SafetySwitches
from minikv.request import Sequence
from minikv.sampling import SamplingParams

IDLE_WAIT_S = 0.02  # how long an idle worker waits for a command before looking again
WAITING_NAP_S = 0.0005  # a worker whose requests only wait on the other side yields the CPU this long


@dataclass(frozen=True)
class WorkerSpec:
    """How both workers are set up: where they meet, what they load, and the pair's configuration."""

    port: int  # the bootstrap TCPStore, served by the prefill worker on 127.0.0.1
    model_dir: str | None
    devices: tuple[str, str]  # (prefill, decode)
    config: ClusterConfig
    switches: SafetySwitches
    transfer_timeout_s: float | None
    link_s_per_page: float
    threads: int = 1

    @property
    def backend(self) -> str:
        """gloo, on CPUs and GPUs alike (CUDA pages are staged through host memory).

        Not NCCL yet: NCCL's point-to-point operations ignore tags and match in posting order, so
        if the two workers posted two rooms' transfers in different orders, one room's pages would
        land in the other's: another tenant's KV. Gloo matches by tag. NCCL needs both sides to
        post rooms in one agreed order first (nothing enforces that yet).
        """
        return "gloo"


@dataclass(frozen=True)
class SeqSpec:
    """A checked request as the front door hands it to both workers; each builds its own Sequence."""

    request_id: str
    tenant: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    arrival_s: float  # time.perf_counter() in the front door (a system-wide monotonic clock on Linux)
    room: int  # also the request's uid in both audit ledgers
    client_request_id: str | None
    cache_keys: list[bytes]

    def sequence(self) -> Sequence:
        return Sequence(self.request_id, self.tenant, list(self.prompt_ids), self.max_tokens, self.sampling,
                        self.arrival_s, uid=self.room, generator=self.sampling.new_generator(),
                        client_request_id=self.client_request_id, cache_keys=list(self.cache_keys), room=self.room)


def worker_main(rank: int, spec: WorkerSpec, inbox, outbox, parent_pid: int) -> None:
    """The worker process's entry point (torch.multiprocessing spawns it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the front door stops us in order
    try:
        torch.set_num_threads(spec.threads)
        model, tokenizer = load_model(spec.model_dir, spec.devices[rank])
        timeout = timedelta(seconds=120)
        store = dist.TCPStore("127.0.0.1", spec.port, 2, is_master=rank == PREFILL_RANK, timeout=timeout)
        dist.init_process_group(spec.backend, store=store, rank=rank, world_size=2, timeout=timeout)
        worker = build_node_worker(rank, store, model, tokenizer.eos_token_id, spec.config, spec.switches,
                                   spec.transfer_timeout_s, spec.link_s_per_page)
        line = f"{worker.startup_line(spec.config.context_len)}; worker pid {os.getpid()} on {model.device}, {spec.backend} rank {rank}"
        outbox.put(("ready", rank, line))
        outbox.put(("report", rank, worker.report()))
        serve(rank, worker, inbox, outbox, parent_pid)
    except Exception as e:  # noqa: BLE001 - reported to the front door, which answers 503 from now on
        outbox.put(("error", rank, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        outbox.close()
        outbox.join_thread()  # everything this worker said reaches the front door
        os._exit(0)  # skip the interpreter's teardown: about 2 s of library exit hooks, nothing of ours


def serve(rank: int, worker: NodeWorker, inbox, outbox, parent_pid: int) -> None:
    """Take commands and step the node until told to stop or the parent is gone."""
    node, tick, streamed, posted = worker.node, 0, {}, set()
    while os.getppid() == parent_pid:
        if not _take_commands(worker, inbox, tick, block=not worker.busy()):
            return
        if not worker.busy():
            continue
        before = worker.report()
        worker.step(tick)
        tick += 1
        if worker.is_prefill:
            for seq in node.inflight_queue:
                if seq.request_id not in posted:
                    posted.add(seq.request_id)
                    outbox.put(("in_flight", seq.request_id))
            posted &= {seq.request_id for seq in node.inflight_queue}
        else:
            _send_decode_news(worker, outbox, streamed)
        after = worker.report()
        if after != before:
            outbox.put(("report", rank, after))
        if _only_waiting(worker):
            time.sleep(WAITING_NAP_S)


def _take_commands(worker: NodeWorker, inbox, tick: int, block: bool) -> bool:
    """Apply every queued command; False once told to stop."""
    try:
        command = inbox.get(timeout=IDLE_WAIT_S) if block else inbox.get_nowait()
    except queue.Empty:
        return True
    while True:
        if command[0] == "stop":
            return False
        if command[0] == "admit":
            worker.admit(command[1].sequence(), tick)
        elif command[0] == "cancel":
            worker.node.cancel(command[1])
        try:
            command = inbox.get_nowait()
        except queue.Empty:
            return True


def _send_decode_news(worker: NodeWorker, outbox, streamed: dict[str, int]) -> None:
    """Stream new tokens of running requests, then hand over how finished ones left."""
    for seq in worker.node.running:
        sent = streamed.get(seq.request_id, 0)
        if len(seq.output_ids) > sent:
            streamed[seq.request_id] = len(seq.output_ids)
            outbox.put(("tokens", seq.request_id, seq.output_ids[sent:]))
    for outcome in worker.node.take_outcomes():
        streamed.pop(outcome.seq.request_id, None)
        outcome.seq.generator = None  # a torch.Generator does not pickle; the request is over
        outbox.put(("outcome", outcome.seq, int(outcome.status), outcome.error))


def _only_waiting(worker: NodeWorker) -> bool:
    """Nothing to compute here: every request waits on the other side or on the network."""
    node = worker.node
    return not node.waiting_queue if worker.is_prefill else not node.running
