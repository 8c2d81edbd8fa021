"""`python -m minikv <command>`: terminal demos and checks.

    info        what a serving engineer reads in a startup log
    generate    run prompts through the paged engine (greedy by default)
    demo        replay the over-length or late-write incident, or the prefix-cache probe,
                under chosen safety switches
    train       train the tiny model into --out DIR (the shipped one only with --overwrite-shipped)
    bench       minikv against transformers on the same workload
    scan-logs   the customer checklist over a gateway log
    make-logs   write a synthetic gateway log
    serve       an OpenAI-compatible HTTP server over the engine or the cluster
    probe       a black-box isolation check of any OpenAI-compatible endpoint

Bad input ends with a one-line message naming the problem (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minikv.logs import gateway_log, scan
from minikv.serve.command import positive_int  # the argparse type every command uses


class CliError(Exception):
    """A problem with the command line or its inputs; printed as one line, exit status 2."""


def check_out_dir(out: str | None, overwrite_shipped: bool) -> Path:
    """Where `train` may write: given explicitly, and never the shipped model unless told so."""
    from minikv.model.checkpoint import DEFAULT_MODEL_DIR

    if out is None:
        raise CliError("train needs --out DIR: where to write the model (the shipped data/tiny-llama is "
                       "replaced only with --out data/tiny-llama --overwrite-shipped)")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise CliError(f"--out {out} is a file; give a directory for the checkpoint")
    if path.resolve() == DEFAULT_MODEL_DIR.resolve() and not overwrite_shipped:
        raise CliError(f"--out {out} is the shipped model; add --overwrite-shipped to replace it")
    return path


def check_threads(threads: int) -> None:
    """At most one torch thread per CPU core: far more crashes OpenMP (100,000 segfaults)."""
    import os

    cores = os.cpu_count() or 1
    if threads > cores:
        raise CliError(f"--threads {threads}: this machine has {cores} CPU core(s); give 1 to {cores}")


def load(model_dir: str | None, device: str | None):
    from minikv.model.checkpoint import CheckpointError, load_model
    from minikv.model.devices import DeviceError

    try:
        return load_model(model_dir, device=device)
    except (CheckpointError, DeviceError) as e:
        raise CliError(str(e)) from None


def cmd_info(args: argparse.Namespace) -> int:
    from minikv.engine.config import EngineConfig
    from minikv.engine.engine import Engine

    from minikv.model.checkpoint import describe_model_dir

    model, tok = load(args.model, args.device)
    mc = model.config
    engine = Engine(model, tok, EngineConfig(num_pages=args.num_pages, page_size=args.page_size, context_len=args.context_len))
    print(f"model: {describe_model_dir(args.model)}")
    print(f"device: {model.device} ({model.dtype})")
    print(f"parameters: {model.num_parameters():,}")
    print(f"layers: {mc.num_layers}, heads: {mc.num_heads} (kv heads: {mc.num_kv_heads}), head_dim: {mc.head_dim}, vocab: {mc.vocab_size}")
    print(f"KV bytes per token: {mc.kv_bytes_per_token:,} = {mc.num_layers} layers x 2 (K,V) x {mc.num_kv_heads} kv heads x {mc.head_dim} dims x 4 bytes")
    print(f"max_position_embeddings: {mc.max_position_embeddings}")
    print("\n".join(engine.startup_log()))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from minikv.engine.config import EngineConfig
    from minikv.engine.engine import Engine

    model, tok = load(args.model, args.device)
    engine = Engine(model, tok, EngineConfig(num_pages=args.num_pages, page_size=args.page_size, context_len=args.context_len))
    prompts = [p.replace("\\n", "\n") for p in args.prompt]
    responses = engine.generate(prompts, max_tokens=args.max_tokens)
    if args.json:
        print(json.dumps([r.to_json() for r in responses], indent=2))
    else:
        for prompt, r in zip(prompts, responses):
            head = f"[{r.status}] {prompt.rstrip()!r}"
            usage = (f"  (prompt_tokens={r.usage.prompt_tokens}, cached_tokens={r.usage.cached_tokens}, "
                     f"completion_tokens={r.usage.completion_tokens})")
            print(f"{head} -> {r.text!r}{usage}" if r.status == 200 else f"{head}: {r.error}")
    return 0 if all(r.status == 200 for r in responses) else 1


def demo_preset(args: argparse.Namespace) -> str:
    """The preset `demo` starts from: the one named; else "vulnerable" when --enable is given
    (turning a switch on means "the vulnerable engine plus this"); else "safe"."""
    if args.preset is not None:
        return args.preset
    return "vulnerable" if args.enable else "safe"


def cmd_demo(args: argparse.Namespace) -> int:
    from minikv.attacks.scenarios import run_scenario
    from minikv.disagg.switches import SafetySwitches

    try:
        switches = SafetySwitches.preset(demo_preset(args)).with_switches(args.enable, args.disable)
    except ValueError as e:
        raise CliError(str(e)) from None
    model, tok = load(args.model, args.device)
    try:
        result = run_scenario(args.scenario, model, tok, switches, secret=args.secret, seed=args.seed,
                              oracle=args.oracle, alphabet=args.alphabet)
    except ValueError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    on = [n for n, v in switches.as_dict().items() if v]
    print(f"scenario {args.scenario}, switches on: {', '.join(on) or 'none (vulnerable)'}")
    if result.refused:
        print(f"the cluster refused to start: {result.refused}")
        return 0
    for role, r in (("victim", result.victim), ("attacker", result.attacker)):
        ttft = f"{r.ttft_s * 1e3:.1f} ms" if r.ttft_s is not None else "-"
        body = repr(r.text) if r.status == 200 else r.error
        print(f"{role:8s} {r.tenant:6s} HTTP {r.status}  prompt_tokens={r.usage.prompt_tokens:<4d} "
              f"cached_tokens={r.usage.cached_tokens:<4d} ttft={ttft:>9s}  {body}")
    if result.recovered is not None:
        how = (f"timed {result.cycles} flush-refresh-probe cycles" if result.oracle == "timing"
               else "read usage.cached_tokens")
        print(f"the attacker sent {result.probes} requests in {result.seconds:.1f} s ({how}) and recovered "
              f"{result.recovered!r}")
    print(f"audit: {result.cross_tenant_reads} cross-tenant read(s) on decode pages {result.audit_pages()}, "
          f"{result.cross_tenant_cache_hits} cross-tenant cache hit(s)")
    audit = result.cluster.decode_audit if result.cluster else None
    unwritten = sum(1 for e in audit.events if e.victim is None) if audit else 0
    if unwritten:
        print(f"       {unwritten} read(s) of memory nobody wrote (never written, or scrubbed)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from minikv.training.train import TrainConfig, train

    out = check_out_dir(args.out, args.overwrite_shipped)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = TrainConfig(seed=args.seed)
    if args.quick:
        cfg = TrainConfig(seed=args.seed, induction_steps=10, copy_steps=10, leak_steps=10, polish_steps=10)
    train(cfg, out, resume_from=Path(args.resume) if args.resume else None)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from minikv.bench.benchmark import run_command
    from minikv.bench.plot import plot_path_problem

    check_threads(args.threads)
    problem = plot_path_problem(args.plot) if args.plot else None
    if problem:  # before the benchmark runs, not after
        raise CliError(f"--plot {args.plot}: {problem}")
    model, tok = load(args.model, args.device)
    return run_command(model, tok, args)


def cmd_serve(args: argparse.Namespace) -> int:
    from minikv.serve.command import run_serve

    return run_serve(args, load)


def cmd_probe(args: argparse.Namespace) -> int:
    from minikv.probe.command import run_probe

    return run_probe(args)


def engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local Llama checkpoint directory (default: data/tiny-llama)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--num-pages", type=positive_int, default=256, help="pages in the KV pool")
    p.add_argument("--page-size", type=positive_int, default=16, help="tokens per page")
    p.add_argument("--context-len", type=positive_int, default=1024, help="context window in tokens")


def add_engine_commands(sub) -> None:
    """info, generate, demo, train, bench: the commands that load the model in this process."""
    p = sub.add_parser("info", help="model, device, parameters, KV bytes per token, pool and context")
    engine_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("generate", help="generate from prompts on the paged engine")
    p.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch ('\\n' ends a line)")
    p.add_argument("--max-tokens", type=positive_int, default=64)
    p.add_argument("--json", action="store_true", help="print a JSON list of responses")
    engine_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="replay an incident, or the prefix-cache probe, on a disaggregated pair")
    p.add_argument("--scenario", required=True, choices=["over-length", "late-write", "prefix-probe"])
    p.add_argument("--preset", choices=["vulnerable", "safe"],
                   help="where the switches start (default: vulnerable with --enable alone, else safe)")
    p.add_argument("--enable", action="append", default=[], metavar="SWITCH", help="turn a safety switch on (repeatable)")
    p.add_argument("--disable", action="append", default=[], metavar="SWITCH", help="turn a safety switch off (repeatable)")
    p.add_argument("--secret", help="what the victim saves: up to 40 letters, digits, spaces, '-' or ','")
    p.add_argument("--oracle", choices=["cached", "timing"], default="cached",
                   help="prefix-probe: the attacker reads usage.cached_tokens, or times to first token only")
    p.add_argument("--alphabet", choices=["full", "digits"], default="full",
                   help="prefix-probe: what the attacker assumes the secret is made of (digits: a PIN)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--device", help="cpu, cuda ... (default: cuda if present)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train the tiny model into --out DIR")
    p.add_argument("--out", metavar="DIR", help="where to write the checkpoint (required)")
    p.add_argument("--overwrite-shipped", action="store_true", help="allow --out to be the shipped data/tiny-llama")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few steps only, to check the pipeline")
    p.add_argument("--resume", metavar="DIR", help="skip phases 0-2: polish this checkpoint (phase 3)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("bench", help="minikv against transformers on the same workload")
    p.add_argument("--quick", action="store_true", help="time the checked run only: under a minute on 2 CPU cores")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    p.add_argument("--plot", metavar="FILE", help="write a figure (.png, .svg) for the README and notebooks")
    p.add_argument("--requests", type=positive_int, default=32, help="requests in the workload")
    p.add_argument("--repeats", type=positive_int, help="timed runs per system after the checked one (default 5)")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--model", help="local Llama checkpoint directory (default: data/tiny-llama)")
    p.add_argument("--device", help="cpu, cuda ... (default: cuda if present)")
    p.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minikv", description="a small paged-KV inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    add_engine_commands(sub)
    p = sub.add_parser("scan-logs", help="the customer checklist over a gateway log")
    scan.add_scan_logs_arguments(p)
    p.set_defaults(func=scan.run_scan_logs)
    p = sub.add_parser("make-logs", help="write a synthetic gateway log")
    gateway_log.add_make_logs_arguments(p)
    p.set_defaults(func=gateway_log.run_make_logs)

    from minikv.probe.command import add_probe_arguments
    from minikv.serve.command import add_serve_arguments

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine or the cluster")
    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("probe", help="black-box isolation checks of an OpenAI-compatible endpoint")
    add_probe_arguments(p, positive_int)
    p.set_defaults(func=cmd_probe)
    from minikv.bench.serving import add_serving_arguments
    from minikv.serve.peer import add_peer_parser

    add_serving_arguments(sub.choices["bench"])  # bench --serve: minikv serve (and vLLM) over HTTP
    add_peer_parser(sub)  # peer setup|serve vllm: the real engine in a venv of its own
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # invalid configuration: the message names the numbers
        print(f"error: {e}", file=sys.stderr)
        return 2
