"""scan-logs on the logs of `minikv serve --preset vulnerable --log F` under each transport: false flags and misses
of the time-to-first-token signal, the fixed ceiling against the one learned from the log (docs/logs.md).

    python scripts/serve_load.py --clients 32 --requests 320 -- --log OUT_DIR/load32.jsonl   # a busy log
    python scripts/scan_logs_transports.py OUT_DIR [--transport single disagg distributed] [--honest 3]

Each transport's log is a customer's own: Bob sends honest prompts of 64 to 224 tokens (inside every pool),
`--honest` times each, one at a time, then Alice saves a card and Bob sends his 800-token prompt (past the
672-token prefill pool). On the pair that reply is not read: it comes from stale pages, at once (Alice's card
when they hold it, notebook 07), and is the row to flag; on one engine it is read, and every row is honest. Then the
shipped synthetic log (its leaked rows: `gateway_log.leaked`) and OUT_DIR/load32.jsonl if it is there (every row
honest). Prints one JSON line per log.
"""

import argparse
import json
import os
import random
from pathlib import Path

import openai

from minikv.attacks.workload import long_document_prompt
from minikv.logs.gateway_log import SHIPPED_LOG, GatewayRecord, iter_log, leaked
from minikv.logs.scan import DEFAULT_MAX_PREFILL_TOKENS_PER_S, Signals, implied_prefill_rate, scan_log
from minikv.serve.launch import ServerProcess

KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-0002"}
CARD = "4539 1488 0343 6467"
TRANSPORTS = {"single": [], "disagg": ["--disagg"], "distributed": ["--disagg", "--transport", "distributed"]}
HONEST_CHARS = (64, 96, 128, 160, 192, 224)  # the vulnerable pair answers 500 past 15 pages (240 tokens)
MODEL = "tiny-llama"
LEAK_CHARS = 800  # one token a character: past the pair's 672-token prefill pool, inside the 1,024 window


def write_log(path: Path, transport: str, honest: int) -> set[str]:
    """Serve, send the customer's traffic, stop; the request id of Bob's 800-token reply on the pair."""
    keys = [a for name, key in KEYS.items() for a in ("--api-key", f"{name}={key}")]
    with ServerProcess([*TRANSPORTS[transport], "--preset", "vulnerable", *keys, "--log", str(path)]) as server:
        alice, bob = (openai.OpenAI(base_url=server.base_url, api_key=KEYS[t], max_retries=0) for t in KEYS)
        rng = random.Random(0)
        for _ in range(honest):
            for chars in HONEST_CHARS:
                bob.completions.create(model=MODEL, prompt=long_document_prompt("bob", chars, rng), max_tokens=8)
        alice.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"alice: save card {CARD}."}])
        bob.completions.create(model=MODEL, prompt=long_document_prompt("bob", LEAK_CHARS, rng), max_tokens=64)
    return unread(path, transport)


def unread(path: Path, transport: str) -> set[str]:
    """Bob's reply past the prefill pool, which the pair answers from stale pages; none on one engine."""
    return set() if transport == "single" else {r.request_id for r in iter_log(path) if isinstance(r, GatewayRecord)
                                                and r.account == "bob" and r.prompt_tokens == LEAK_CHARS}


def judge(path: Path, leak_ids: set[str], name: str) -> dict:
    """False flags (honest rows flagged by the TTFT signal) and misses (leaked rows it did not flag), with the
    fixed ceiling and the learned one."""
    rows = {r.request_id: r for r in iter_log(path) if isinstance(r, GatewayRecord)}
    out = {"log": name, "rows": len(rows), "leaked": len(leak_ids),
           "leaked_ttft_ms": [rows[i].ttft_ms for i in sorted(leak_ids)]}
    for how, ceiling in (("fixed", DEFAULT_MAX_PREFILL_TOKENS_PER_S), ("learned", None)):
        fast = {f.record.request_id for f in scan_log(path, signals=Signals(max_prefill_tokens_per_s=ceiling)).flags
                if "ttft_anomaly" in f.reasons}
        out[how] = {"false_flags": len(fast - leak_ids), "misses": len(leak_ids - fast)}
    return out | {"load_average": [round(x, 2) for x in os.getloadavg()]}


def shipped_leaks() -> set[str]:
    return {r.request_id for r in iter_log(SHIPPED_LOG) if isinstance(r, GatewayRecord)
            and leaked(r.timestamp, r.model, r.prompt_tokens) and implied_prefill_rate(r) is not None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--transport", nargs="*", choices=TRANSPORTS, default=list(TRANSPORTS))
    parser.add_argument("--honest", type=int, default=4, help="rounds of Bob's honest prompts (default %(default)s)")
    parser.add_argument("--reuse", action="store_true", help="judge the logs already in OUT_DIR, serve nothing")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for transport in args.transport:
        path = args.out / f"{transport}.jsonl"
        if not args.reuse:
            path.unlink(missing_ok=True)
        leaks = unread(path, transport) if args.reuse else write_log(path, transport, args.honest)
        print(json.dumps(judge(path, leaks, transport)), flush=True)
    print(json.dumps(judge(SHIPPED_LOG, shipped_leaks(), "synthetic gateway log")), flush=True)
    if (args.out / "load32.jsonl").exists():
        print(json.dumps(judge(args.out / "load32.jsonl", set(), "32-client load run")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
