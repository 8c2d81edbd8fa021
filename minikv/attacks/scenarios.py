"""The two incidents, scaled by 1/1024, played through the ordinary serving paths.

over-length  Alice saves a secret; her request finishes on the decode node and its pages go
             back to the free list, unscrubbed. Bob then sends a prompt longer than the
             prefill pool (672 tokens) but inside the advertised window (1,024 tokens).
late-write   Carol sends a long prompt; its KV transfer is one big batch that outlasts the
             decode node's timeout, so decode aborts her and frees her pages while the batch
             is still on the wire. Dave's request gets those pages; Carol's batch lands in them.
prefix-probe Alice saves a key; Mallory recovers it character by character from the
             `cached_tokens` her own probes report (prefix_probe.py), at 1-token pages, or
             (`oracle="timing"`) from their times to first token alone (timing_probe.py).

Nothing here touches the engine's internals: the scenarios only submit requests and step the
clock. Which stale pages Bob or Dave receive is decided by the ordinary free list (most
recently freed first), and what they read is decided by the ordinary queues and switches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from minikv.disagg.cluster import Cluster, ClusterConfig, StartupRefused
from minikv.attacks.cached_tokens import PROBE_CONFIG, probe_attack
from minikv.disagg.switches import SafetySwitches
from minikv.attacks.timing import ALPHABETS, timing_attack
from minikv.model.llama import Llama
from minikv.engine.request import Request
from minikv.engine.request import Response
from minikv.attacks.workload import (
    SECRET_ALPHABET,
    Note,
    check_secret,
    document_sentence,
    long_document_prompt,
    make_prompt,
    note_prompt,
)

SCENARIOS = ("over-length", "late-write", "prefix-probe")
ORACLES = ("cached", "timing")  # how the prefix-probe attacker learns a hit: usage.cached_tokens, or the stopwatch
DEFAULT_SECRETS = {"over-length": "5412 7534 9821 0064", "late-write": "sk-live-7Hq2Zp9Xw4", "prefix-probe": "7Hq2Zp9Xw4"}
DEFAULT_PIN = "4821"  # prefix-probe's secret when the attacker assumes digits
BOB_PROMPT_CHARS = 800  # > 672-token prefill pool, < 1,024-token window
MAX_TOKENS = 64


@dataclass
class ScenarioResult:
    """What the demo reports: both responses, the audit, and the cluster to look inside."""

    scenario: str
    switches: SafetySwitches
    victim: Response | None
    attacker: Response | None
    refused: str | None = None  # startup_check's message when the cluster would not start
    cluster: Cluster | None = field(default=None, repr=False)
    recovered: str | None = None  # prefix-probe: what the attacker reconstructed
    probes: int | None = None  # prefix-probe: requests the attacker sent
    oracle: str | None = None  # prefix-probe: "cached" or "timing"
    seconds: float | None = None  # prefix-probe: the attack's wall time
    cycles: int | None = None  # prefix-probe with the timing oracle: flush-refresh-probe cycles

    @property
    def cross_tenant_reads(self) -> int:
        return self.cluster.cross_tenant_reads if self.cluster else 0

    @property
    def cross_tenant_cache_hits(self) -> int:
        return self.cluster.cross_tenant_cache_hits if self.cluster else 0

    def audit_pages(self) -> list[int]:
        """Decode-pool pages the attacker read that another tenant wrote."""
        if self.cluster is None or self.cluster.decode_audit is None:
            return []
        pages = {p for e in self.cluster.decode_audit.events
                 if e.victim_tenant not in (None, e.reader_tenant) for p in e.pages}
        return sorted(pages)

    def leaked(self, secret: str) -> bool:
        return bool(self.attacker and secret in self.attacker.text)

    def to_json(self) -> dict:
        out = {
            "scenario": self.scenario,
            "switches": self.switches.as_dict(),
            "victim": self.victim.to_json() if self.victim else None,
            "attacker": self.attacker.to_json() if self.attacker else None,
            "audit": {"cross_tenant_reads": self.cross_tenant_reads,
                      "cross_tenant_cache_hits": self.cross_tenant_cache_hits, "pages": self.audit_pages()},
        }
        if self.recovered is not None:
            out["recovered"], out["probes"] = self.recovered, self.probes
            out["oracle"], out["seconds"] = self.oracle, self.seconds
            if self.cycles is not None:
                out["cycles"] = self.cycles
        if self.refused:
            out["refused"] = self.refused
        return out


def run_scenario(name: str, model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches,
                 secret: str | None = None, seed: int = 0, config: ClusterConfig | None = None,
                 oracle: str = "cached", alphabet: str = "full") -> ScenarioResult:
    """Play scenario `name` under `switches` (on the incident's pair, or PROBE_CONFIG for prefix-probe).

    prefix-probe only: `oracle` (ORACLES) is what the attacker reads, `alphabet` (a key of
    timing_probe.ALPHABETS) what she assumes the secret is made of."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}: choose from {', '.join(SCENARIOS)}")
    if oracle not in ORACLES:
        raise ValueError(f"unknown oracle {oracle!r}: choose from {', '.join(ORACLES)}")
    if alphabet not in ALPHABETS:
        raise ValueError(f"unknown alphabet {alphabet!r}: choose from {', '.join(ALPHABETS)}")
    if name != "prefix-probe" and (oracle, alphabet) != ("cached", "full"):
        raise ValueError(f"oracle and alphabet are options of the prefix-probe scenario, not of {name}")
    if secret is None:
        secret = DEFAULT_SECRETS[name] if alphabet == "full" else DEFAULT_PIN
    secret = check_secret(secret)
    outside = sorted(set(secret) - set(ALPHABETS[alphabet]))
    if outside:
        raise ValueError(f"the secret has characters outside the {alphabet} alphabet: {outside}; "
                         "give a secret made of it, or another alphabet")
    config = config or (PROBE_CONFIG if name == "prefix-probe" else ClusterConfig())
    try:
        cluster = Cluster(model, tokenizer, config, switches)
    except StartupRefused as e:
        return ScenarioResult(name, switches, None, None, refused=str(e))
    if name == "prefix-probe":
        return prefix_probe(cluster, switches, secret, random.Random(seed), oracle, ALPHABETS[alphabet])
    play = {"over-length": over_length, "late-write": late_write}[name]
    return play(cluster, switches, secret, random.Random(seed))


def over_length(cluster: Cluster, switches: SafetySwitches, secret: str, rng: random.Random) -> ScenarioResult:
    cluster.submit(Request(note_prompt("alice", Note("card", secret)), "alice", MAX_TOKENS, request_id="alice-1"))
    [alice] = cluster.run()
    cluster.submit(Request(long_document_prompt("bob", BOB_PROMPT_CHARS, rng), "bob", MAX_TOKENS, request_id="bob-1"))
    [bob] = cluster.run()
    return ScenarioResult("over-length", switches, alice, bob, cluster=cluster)


CAROL_PROMPT_CHARS = 600  # 38 pages: one uncapped batch takes 39 ticks, past the 16-tick timeout
DAVE_ARRIVAL_AFTER_ABORT = 13  # ticks: Dave's own KV lands one tick before Carol's late batch


def late_write(cluster: Cluster, switches: SafetySwitches, secret: str, rng: random.Random) -> ScenarioResult:
    head = f"carol: save key {secret}. "
    body = document_sentence(rng, CAROL_PROMPT_CHARS)[: CAROL_PROMPT_CHARS - len(head) - 2].rstrip() + "."
    cluster.submit(Request(head + body + "\n", "carol", 32, request_id="carol-1"))
    carol: list[Response] = []
    for _ in range(200):  # until Carol's transfer has been given up on, or she is served
        carol += cluster.step()
        if carol:
            break
    for _ in range(DAVE_ARRIVAL_AFTER_ABORT):
        cluster.step()
    dave_prompt = make_prompt("dave", [document_sentence(rng, 40), "save pin 4821."])
    cluster.submit(Request(dave_prompt, "dave", MAX_TOKENS, request_id="dave-1"))
    [dave] = cluster.run()
    return ScenarioResult("late-write", switches, carol[0], dave, cluster=cluster)


FLUSH_MARGIN = 1.1  # the timing attacker's filler: 10% more tokens than the prefill pool holds


def prefix_probe(cluster: Cluster, switches: SafetySwitches, secret: str, rng: random.Random,
                 oracle: str = "cached", alphabet: str = SECRET_ALPHABET) -> ScenarioResult:
    """Alice saves a key; Mallory probes the prefill node's prefix cache (prefix_probe.py, timing_probe.py)."""
    page_size = cluster.config.page_size
    if oracle == "timing":
        flush = int(cluster.config.prefill_tokens * FLUSH_MARGIN)
        out = timing_attack(cluster, secret, page_size, flush, alphabet, rng)
    else:
        out = probe_attack(cluster, secret, page_size, alphabet)
    return ScenarioResult("prefix-probe", switches, out.victim, out.last_probe, cluster=cluster,
                          recovered=out.recovered, probes=out.probes, oracle=oracle, seconds=out.seconds,
                          cycles=out.cycles)
