"""`python -m minikv <command>` (`--help` lists them): the engine's demos here; serve, probe, peer, bench
--serve and the log tools wired from their own packages. Bad input ends with one line naming the problem
(exit 2), never a traceback."""

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from minikv.logs import gateway_log, scan
from minikv.probe.command import add_probe_arguments, run_probe
from minikv.serve.command import run_serve
from minikv.serve.flags import add_model_arguments, add_serve_arguments, add_switch_arguments, positive_int


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


def load_engine(args: argparse.Namespace):
    """The model and one paged engine over it, as `info` and `generate` configure them."""
    from minikv.engine.config import EngineConfig
    from minikv.engine.engine import Engine
    from minikv.model.checkpoint import load_model
    model, tok = load_model(args.model, args.device)
    config = EngineConfig(num_pages=args.num_pages, page_size=args.page_size, context_len=args.context_len)
    return model, Engine(model, tok, config)


def cmd_info(args: argparse.Namespace) -> int:
    from minikv.model.checkpoint import describe_model_dir
    model, engine = load_engine(args)
    mc = model.config
    print(f"model: {describe_model_dir(args.model)}")
    print(f"device: {model.device} ({model.dtype})")
    print(f"parameters: {model.num_parameters():,}")
    print(f"layers: {mc.num_layers}, heads: {mc.num_heads} (kv heads: {mc.num_kv_heads}), "
          f"head_dim: {mc.head_dim}, vocab: {mc.vocab_size}")
    print(f"KV bytes per token: {mc.kv_bytes_per_token:,} = {mc.num_layers} layers x 2 (K,V) x "
          f"{mc.num_kv_heads} kv heads x {mc.head_dim} dims x 4 bytes")
    print(f"max_position_embeddings: {mc.max_position_embeddings}")
    print("\n".join(engine.startup_log()))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    _, engine = load_engine(args)
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


def cmd_demo(args: argparse.Namespace) -> int:
    from minikv.attacks.scenarios import run_scenario
    from minikv.disagg.switches import SafetySwitches
    from minikv.model.checkpoint import load_model
    preset = args.preset or ("vulnerable" if args.enable else "safe")  # --enable alone: vulnerable plus it
    switches = SafetySwitches.preset(preset).with_switches(args.enable, args.disable)  # ValueError: which
    model, tok = load_model(args.model, args.device)
    result = run_scenario(args.scenario, model, tok, switches, secret=args.secret, seed=args.seed,
                          oracle=args.oracle, alphabet=args.alphabet)
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
    from minikv.training.train import TrainConfig, train
    out = check_out_dir(args.out, args.overwrite_shipped)
    steps = dict(induction_steps=2, copy_steps=2, leak_steps=2, polish_steps=2) if args.quick else {}
    train(TrainConfig(seed=args.seed, **steps), out, resume_from=Path(args.resume) if args.resume else None)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from minikv.bench.benchmark import run_command
    from minikv.bench.plot import plot_path_problem
    from minikv.model.checkpoint import load_model
    cores = os.cpu_count() or 1
    if args.threads > cores:  # more torch threads than cores crashes OpenMP (100,000 segfaults)
        raise CliError(f"--threads {args.threads}: this machine has {cores} CPU core(s); give 1 to {cores}")
    problem = plot_path_problem(args.plot) if args.plot else None
    if problem:  # before the benchmark runs, not after
        raise CliError(f"--plot {args.plot}: {problem}")
    if args.partition and args.plot:
        raise CliError("--plot draws the whole benchmark; --partition prints a table (or --json) only")
    model, tok = load_model(args.model, args.device)
    return run_command(model, tok, args)


def command(sub, name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help)
    parser.set_defaults(func=func)
    return parser


def add_engine_commands(sub) -> None:
    """info, generate, demo, train, bench: the commands that load the model in this process."""
    info = command(sub, "info", cmd_info, "model, device, parameters, KV bytes per token, pool and context")
    generate = command(sub, "generate", cmd_generate, "generate from prompts on the paged engine")
    for p in (info, generate):
        add_model_arguments(p)
        p.add_argument("--num-pages", type=positive_int, default=256, help="pages in the KV pool")
        p.add_argument("--page-size", type=positive_int, default=16, help="tokens per page")
        p.add_argument("--context-len", type=positive_int, default=1024, help="context window in tokens")
    generate.add_argument("--prompt", action="append", required=True,
                          help="a prompt; repeat for a batch ('\\n' ends a line)")
    generate.add_argument("--max-tokens", type=positive_int, default=64)
    generate.add_argument("--json", action="store_true", help="print a JSON list of responses")

    p = command(sub, "demo", cmd_demo,
                "replay an incident, or the prefix-cache probe, on a disaggregated pair")
    p.add_argument("--scenario", required=True, choices=["over-length", "late-write", "prefix-probe"])
    add_switch_arguments(p, "where the switches start (default: vulnerable with --enable alone, else safe)")
    p.add_argument("--secret", help="what the victim saves: up to 40 letters, digits, spaces, '-' or ','")
    p.add_argument("--oracle", choices=["cached", "timing"], default="cached",
                   help="prefix-probe: the attacker reads usage.cached_tokens, or times to first token only")
    p.add_argument("--alphabet", choices=["full", "digits"], default="full",
                   help="prefix-probe: what the attacker assumes the secret is made of (digits: a PIN)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    add_model_arguments(p, hidden=True)

    p = command(sub, "train", cmd_train, "train the tiny model into --out DIR")
    p.add_argument("--out", metavar="DIR", help="where to write the checkpoint (required)")
    p.add_argument("--overwrite-shipped", action="store_true",
                   help="allow --out to be the shipped data/tiny-llama")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few steps only, to check the pipeline")
    p.add_argument("--resume", metavar="DIR", help="skip phases 0-2: polish this checkpoint (phase 3)")

    p = command(sub, "bench", cmd_bench, "minikv against transformers on the same workload")
    p.add_argument("--quick", action="store_true",
                   help="time the checked run only: under a minute on 2 CPU cores")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    p.add_argument("--plot", metavar="FILE", help="write a figure (.png, .svg) for the README and notebooks")
    p.add_argument("--requests", type=positive_int, default=32, help="requests in the workload")
    p.add_argument("--repeats", type=positive_int,
                   help="timed runs per system after the checked one (default 5)")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--partition", action="store_true", help="only what the static partition costs against "
                   "the shared pool: what one tenant holds, hit rate, tokens/s (--repeats rounds, default 3)")
    p.add_argument("--max-batch", type=positive_int, metavar="N", help="requests the paged engine runs at "
                   "once (default: the whole workload, which its pool holds; with --serve: serve's default)")
    add_model_arguments(p)


def build_parser(command_name: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; `bench --serve` and `peer` (whose modules load torch) only for those commands
    or when none is named, so that `scan-logs` and `probe` start without torch."""
    parser = argparse.ArgumentParser(prog="python -m minikv", description="a small paged-KV inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    add_engine_commands(sub)
    scan.add_scan_logs_arguments(command(sub, "scan-logs", scan.run_scan_logs,
                                         "the customer checklist over a gateway log"))
    gateway_log.add_make_logs_arguments(command(sub, "make-logs", gateway_log.run_make_logs,
                                                "write a synthetic gateway log"))
    add_serve_arguments(command(sub, "serve", run_serve,
                                "an OpenAI-compatible HTTP server over the engine or the cluster"))
    add_probe_arguments(command(sub, "probe", run_probe,
                                "black-box isolation checks of an OpenAI-compatible endpoint"), positive_int)
    if command_name in (None, "bench", "peer"):
        from minikv.bench.serving import add_serving_arguments
        from minikv.serve.peer import add_peer_parser
        add_serving_arguments(sub.choices["bench"])  # bench --serve: minikv serve (and vLLM) over HTTP
        add_peer_parser(sub)  # peer setup|serve vllm: the real engine in a venv of its own
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ValueError) as e:  # ValueError: an invalid configuration; its message names the numbers
        print(f"error: {e}", file=sys.stderr)
        return 2
