"""From `minikv serve`'s flags to a running front door, where the engine core runs (its process, or for
ServerThread the kernel's thread): the flags checked, the door built, the lines it prints at startup."""

import argparse
from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from minikv.disagg.cluster import Cluster, ClusterConfig, StartupRefused
from minikv.disagg.dist.cluster import DistCluster, WorkerStartError
from minikv.disagg.switches import SafetySwitches
from minikv.engine.config import EngineConfig, batch_for_pool
from minikv.engine.engine import Engine
from minikv.engine.front_door import FrontDoor
from minikv.engine.partition import quota_pages
from minikv.model.checkpoint import default_model_dir
from minikv.model.llama import Llama
from minikv.serve.flags import chunk_of


def build_backend(model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches, disagg: bool,
                  context_len: int | None, num_pages: int, transport: str = "inprocess",
                  model_dir: str | None = None, device: str | None = None, threads: int = 1, tenants: int = 1,
                  prefill_chunk: int | None = None, prefill_pages: int | None = None,
                  max_batch: int | None = None) -> FrontDoor:
    """The Engine, or the Cluster with its switches (in two worker processes with `transport="distributed"`).
    The event log is off (a server runs for days); the audit stays on. With `cache_partition` every pool is
    cut for `tenants` (one a key) and raised, if need be, until each tenant's quota holds a context window.
    The single engine runs `max_batch` requests at once, by default as many as its pool admits, and prefills
    prompts in its decode steps (mixed steps: docs/benchmarks.md)."""
    context = {"context_len": context_len} if context_len else {}
    context["cache_tenants"] = max(1, tenants)
    if prefill_chunk:  # on the single engine, or on the pair's prefill node
        context |= {"chunked_prefill": True, "max_prefill_tokens": prefill_chunk}
    if disagg:
        pools = {"prefill_pages": prefill_pages} if prefill_pages else {}  # by default ClusterConfig's
        pair = ClusterConfig(event_log=False, **context, **pools)
        if switches.cache_partition:
            pair = replace(pair, prefill_pages=quota(pair.prefill_pages, pair),
                           decode_pages=quota(pair.decode_pages, pair))
        if transport == "distributed":
            return DistCluster(tokenizer, pair, switches, model_dir=model_dir,
                               devices=(device, device) if device else None, threads=threads)
        return Cluster(model, tokenizer, pair, switches)
    config = EngineConfig(num_pages=num_pages, event_log=False, **context, cache_salt=switches.cache_salt,
                          cache_partition=switches.cache_partition, scrub_on_free=switches.scrub_on_free)
    if switches.cache_partition:
        config = replace(config, num_pages=quota(num_pages, config))
    batch = max_batch or batch_for_pool(config.num_pages * config.page_size)
    return Engine(model, tokenizer, replace(config, max_batch_size=batch, mixed_steps=True))


def quota(pages: int, config: EngineConfig | ClusterConfig) -> int:
    """`pages`, raised if need be until each tenant's quota of them holds one context window."""
    return quota_pages(pages, config.context_len, config.page_size, config.cache_tenants)


def start_door(args: argparse.Namespace, keys: dict[str, str], switches, model, tokenizer):
    """The front door `args` ask for (under --mystery the seed's pair); ValueError with one line when it must
    not start (startup_check, a worker that did not start)."""
    from minikv.serve.mystery import MYSTERY_CONTEXT_LEN, prefill_pages
    mystery = args.mystery is not None
    try:
        return build_backend(model, tokenizer, switches, args.disagg or mystery,
                             MYSTERY_CONTEXT_LEN if mystery else args.context_len, args.num_pages,
                             args.transport, args.model, args.device, args.threads,
                             tenants=len(set(keys.values())), prefill_chunk=chunk_of(args),
                             prefill_pages=prefill_pages(switches) if mystery else None,
                             max_batch=args.max_batch)
    except StartupRefused as e:
        raise ValueError(f"startup_check refused to start: {e}") from None
    except WorkerStartError as e:
        raise ValueError(f"the distributed cluster did not start: {e}") from None


def startup_lines(args: argparse.Namespace, backend, switches, keys: dict[str, str]) -> list[str]:
    """What the server prints before it serves: each pool, the topology and switches, the tenants. Under
    --mystery only the address, the window and the tenants: the rest would give the switches away."""
    where = f"on http://{args.host}:{args.port}; context window {backend.config.context_len} tokens"
    names = ", ".join(sorted(set(keys.values()))) or "none (no keys: every caller is tenant anon)"
    tenants = f"tenants: {names}; gateway log: {args.log or 'off'}"
    if args.mystery is not None:
        hidden = f"mystery seed {args.mystery}: what it runs is not shown"
        return [f"serving {model_name(args)} ({hidden}) {where}", tenants]
    topology = "prefill/decode cluster" if args.disagg else "one engine"
    if args.transport == "distributed":
        topology += ", two worker processes, KV over torch.distributed"
    chunk = chunk_of(args)
    topology += f"; prefill in chunks of {chunk} tokens" if chunk else "; whole-prompt prefill"
    on = ", ".join(n for n, v in switches.as_dict().items() if v) or "none (vulnerable)"
    switches_on = f"; switches on: {on}" if args.disagg else ""
    return backend.startup_log() + [f"serving {model_name(args)} ({topology}) {where}{switches_on}", tenants]


def model_name(args: argparse.Namespace) -> str:
    """The name the server answers to: its checkpoint directory's."""
    return Path(args.model).name if args.model else default_model_dir().name
