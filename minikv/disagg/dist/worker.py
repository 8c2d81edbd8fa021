"""One worker process of the distributed pair (rank 0 prefill, rank 1 decode): its own model, a
process group joined through the bootstrap TCPStore, a node built by `build_node` over a
`DistKVManager`; it steps the node and exits when told to, when its parent is gone, or on an error.
"""

import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from minikv.disagg.cluster import ROLES, ClusterConfig, build_node, node_pool, pool_line, transfer_cap
from minikv.disagg.decode_node import DecodeNode
from minikv.disagg.dist.child import HEARTBEAT_S, exit_now, ignore_group_signals, parent_alive
from minikv.disagg.dist.messages import Admit, Cancel, News, Ready, Stop, WorkerFailed
from minikv.engine.request import Finished
from minikv.disagg.node import Node
from minikv.disagg.switches import SafetySwitches
from minikv.disagg.transfer.torch_dist import DistKVManager
from minikv.engine.events import Clock, EventLog
from minikv.model.checkpoint import load_model

PREFILL_RANK, DECODE_RANK = 0, 1  # a worker's rank is its role's place in ROLES
IDLE_WAIT_S = 0.02  # how long an idle worker waits for a command before looking again
WAITING_NAP_S = 0.0005  # a worker whose requests only wait on the other side yields the CPU this long
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
TRANSFER_TIMEOUT_S = 30.0  # a room whose KV makes no progress this long fails (500)
LOOPBACK_INTERFACE = "lo"  # gloo's listeners: the pair never leaves this machine
BACKEND = "gloo"  # on GPUs too (pages staged through host memory): NCCL ignores tags (docs/disagg.md)


@dataclass(frozen=True)
class WorkerSpec:
    """How both workers are set up: where they meet, what they load, and the pair's configuration."""
    port: int  # the bootstrap TCPStore, served by the prefill worker on 127.0.0.1
    model_dir: str | None
    devices: tuple[str, str]  # (prefill, decode)
    config: ClusterConfig
    switches: SafetySwitches
    link_s_per_page: float  # a slow link, so that a cancel can race a late write (tests)
    threads: int = 1


def worker_main(rank: int, spec: WorkerSpec, inbox, outbox, parent_pid: int) -> None:
    """The worker process's entry point (multiprocessing spawns it)."""
    ignore_group_signals()
    try:
        torch.set_num_threads(spec.threads)
        model, tokenizer = load_model(spec.model_dir, spec.devices[rank])
        store = loopback_store(rank, spec.port)
        dist.init_process_group(BACKEND, store=store, rank=rank, world_size=2, timeout=RENDEZVOUS_TIMEOUT)
        role = ROLES[rank]
        pool, audit = node_pool(role, model, spec.config, spec.switches, model.device)
        side = "sender" if rank == PREFILL_RANK else "receiver"
        manager = DistKVManager(side, pool, audit, store, peer=1 - rank,
                                batch_cap_pages=transfer_cap(spec.config, spec.switches),
                                timeout_s=TRANSFER_TIMEOUT_S, link_s_per_page=spec.link_s_per_page)
        node = build_node(role, model, tokenizer, spec.config, spec.switches, EventLog(enabled=False),
                          Clock(), manager, pool, audit)
        line = (f"{pool_line(role, pool, spec.config.context_len)}; worker pid {os.getpid()} on "
                f"{model.device}, {BACKEND} rank {rank}")
        outbox.put(Ready(rank, line))
        serve(rank, node, manager, inbox, outbox, parent_pid)
    except Exception as e:  # noqa: BLE001 - reported to the front door, which answers 503 from now on
        outbox.put(WorkerFailed(rank, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        exit_now(outbox)  # once everything this worker said has reached the front door


def loopback_store(rank: int, port: int) -> dist.TCPStore:
    """The pair's TCPStore, listening on 127.0.0.1 only, and gloo's own sockets on loopback too.

    TCPStore binds every interface (`*:PORT`) whatever host it is given, so the prefill worker binds the
    socket itself and hands it over (`master_listen_fd`, as torchelastic does); gloo binds the interface
    named here."""
    os.environ["GLOO_SOCKET_IFNAME"] = LOOPBACK_INTERFACE  # read by init_process_group in this worker process
    listen_fd = None
    if rank == PREFILL_RANK:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", port))
        listen_fd = listener.detach()  # the store's from now on: it outlives this socket object
    return dist.TCPStore("127.0.0.1", port, 2, is_master=listen_fd is not None, timeout=RENDEZVOUS_TIMEOUT,
                         master_listen_fd=listen_fd)


def serve(rank: int, node: Node, manager: DistKVManager, inbox, outbox, parent_pid: int) -> None:
    """Take commands and step the node until told to stop or the parent is gone; send News on every change
    and at least every HEARTBEAT_S."""
    streamed: dict[str, int] = {}  # decode: tokens already sent, per request
    last, reported = None, 0.0
    while parent_alive(parent_pid):
        if not take_commands(node, inbox, block=not (node.live() or manager.rooms)):
            return
        tokens, ended = {}, []
        if node.live() or manager.rooms:
            node.step()
            manager.land_due()
            node.clock.advance()
            if isinstance(node, DecodeNode):
                tokens, ended = decode_news(node, streamed)
        now = {**node.report(), "late_writes": list(manager.landed_late)}  # writes landed after an abort
        if tokens or ended or now != last or time.monotonic() - reported > HEARTBEAT_S:
            outbox.put(News(rank, now, tokens, ended))
            last, reported = now, time.monotonic()
        if not (node.scheduler.waiting or node.scheduler.running):
            # nothing to compute here: every request waits on the other side or the network
            time.sleep(WAITING_NAP_S)


def take_commands(node: Node, inbox, block: bool) -> bool:
    """Apply every queued command (waiting IDLE_WAIT_S for the first if `block`); False once told to stop."""
    while True:
        try:
            command = inbox.get(timeout=IDLE_WAIT_S) if block else inbox.get_nowait()
        except queue.Empty:
            return True
        block = False
        if isinstance(command, Stop):
            return False
        if isinstance(command, Admit):
            node.admit(command.seq)
        elif isinstance(command, Cancel):
            node.cancel(command.request_id)


def decode_news(node: DecodeNode, streamed: dict[str, int]) -> tuple[dict[str, list[int]], list[Finished]]:
    """The new tokens of running requests, and how finished ones left."""
    tokens = {}
    for seq in node.scheduler.running:
        if len(seq.output_ids) > (sent := streamed.get(seq.request_id, 0)):
            streamed[seq.request_id] = len(seq.output_ids)
            tokens[seq.request_id] = seq.output_ids[sent:]
    ended = [Finished(f.seq, int(f.status), f.error) for f in node.take_finished()]
    for f in ended:
        streamed.pop(f.seq.request_id, None)
    return tokens, ended
