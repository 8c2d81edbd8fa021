"""The two incidents, scaled by 1/1024, and the prefix probe, played through the ordinary serving paths
(docs/attacks.md): the scenarios only submit requests and step the clock."""

import random
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from minikv.attacks.cached_tokens import PROBE_CONFIG, probe_attack
from minikv.attacks.timing import ALPHABETS, timing_attack
from minikv.attacks.workload import (Note, check_secret, document_sentence, long_document_prompt, make_prompt,
                                     note_prompt)
from minikv.disagg.cluster import Cluster, ClusterConfig, StartupRefused
from minikv.disagg.switches import SafetySwitches
from minikv.engine.request import Request, Response
from minikv.model.llama import Llama

SCENARIOS = ("over-length", "late-write", "prefix-probe")
ORACLES = ("cached", "timing")  # how the prefix-probe attacker sees a hit: usage.cached_tokens, a stopwatch
DEFAULT_SECRETS = {"over-length": "5412 7534 9821 0064", "late-write": "sk-live-7Hq2Zp9Xw4",
                   "prefix-probe": "7Hq2Zp9Xw4"}
DEFAULT_PIN = "4821"  # prefix-probe's secret when the attacker assumes digits
BOB_PROMPT_CHARS = 800  # > 672-token prefill pool, < 1,024-token window
CAROL_PROMPT_CHARS = 600  # 38 pages: one uncapped batch takes 39 ticks, past the 16-tick timeout
DAVE_ARRIVAL_AFTER_ABORT = 13  # ticks: Dave's own KV lands one tick before Carol's late batch
FLUSH_MARGIN = 1.1  # the timing attacker's filler: 10% more tokens than the prefill pool holds
MAX_TOKENS = 64


@dataclass
class ScenarioResult:
    """What the demo reports: both responses, the audit, and the cluster to look inside."""
    scenario: str
    switches: SafetySwitches
    victim: Response | None = None
    attacker: Response | None = None
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
        events = self.cluster.decode_audit.events if self.cluster and self.cluster.decode_audit else []
        return sorted({p for e in events if e.victim_tenant not in (None, e.reader_tenant) for p in e.pages})

    def to_json(self) -> dict:
        """`demo --json`: the keys of a probe's outcome only for prefix-probe, `cycles` only when timed."""
        out = {"scenario": self.scenario, "switches": self.switches.as_dict(),
               "victim": self.victim.to_json() if self.victim else None,
               "attacker": self.attacker.to_json() if self.attacker else None,
               "audit": {"cross_tenant_reads": self.cross_tenant_reads,
                         "cross_tenant_cache_hits": self.cross_tenant_cache_hits,
                         "pages": self.audit_pages()}}
        if self.recovered is not None:
            out |= {k: getattr(self, k) for k in ("recovered", "probes", "oracle", "seconds")}
            out |= {"cycles": self.cycles} if self.cycles is not None else {}
        return out | ({"refused": self.refused} if self.refused else {})


def run_scenario(name: str, model: Llama, tokenizer: PreTrainedTokenizerBase, switches: SafetySwitches,
                 secret: str | None = None, seed: int = 0, config: ClusterConfig | None = None,
                 oracle: str = "cached", alphabet: str = "full") -> ScenarioResult:
    """Play scenario `name` under `switches` on the incident's pair (PROBE_CONFIG for prefix-probe, whose
    attacker reads `oracle` and assumes the secret is made of `alphabet`, a key of timing.ALPHABETS)."""
    for what, value, choices in (("scenario", name, SCENARIOS), ("oracle", oracle, ORACLES),
                                 ("alphabet", alphabet, ALPHABETS)):
        if value not in choices:
            raise ValueError(f"unknown {what} {value!r}: choose from {', '.join(choices)}")
    if name != "prefix-probe" and (oracle, alphabet) != ("cached", "full"):
        raise ValueError(f"oracle and alphabet are options of the prefix-probe scenario, not of {name}")
    if secret is None:
        secret = DEFAULT_SECRETS[name] if alphabet == "full" else DEFAULT_PIN
    secret = check_secret(secret)
    if outside := sorted(set(secret) - set(ALPHABETS[alphabet])):
        raise ValueError(f"the secret has characters outside the {alphabet} alphabet: {outside}; "
                         "give a secret made of it, or another alphabet")
    config = config or (PROBE_CONFIG if name == "prefix-probe" else ClusterConfig())
    try:
        cluster = Cluster(model, tokenizer, config, switches)
    except StartupRefused as e:
        return ScenarioResult(name, switches, None, None, refused=str(e))
    rng = random.Random(seed)
    if name == "prefix-probe" and oracle == "timing":
        flush = int(config.prefill_tokens * FLUSH_MARGIN)
        out = timing_attack(cluster, secret, config.page_size, flush, ALPHABETS[alphabet], rng)
    elif name == "prefix-probe":
        out = probe_attack(cluster, secret, config.page_size, ALPHABETS[alphabet])
    else:
        victim, attacker = (over_length if name == "over-length" else late_write)(cluster, secret, rng)
        return ScenarioResult(name, switches, victim, attacker, cluster=cluster)
    return ScenarioResult(name, switches, cluster=cluster, oracle=oracle, **vars(out))


def over_length(cluster: Cluster, secret: str, rng: random.Random,
                bob_chars: int = BOB_PROMPT_CHARS) -> tuple[Response, Response]:
    """Alice's card, then Bob's prompt (past the prefill pool by default): (alice's answer, bob's)."""
    card = note_prompt("alice", Note("card", secret))
    cluster.submit(Request(card, "alice", MAX_TOKENS, request_id="alice-1"))
    [alice] = cluster.run()
    document = long_document_prompt("bob", bob_chars, rng)
    cluster.submit(Request(document, "bob", MAX_TOKENS, request_id="bob-1"))
    [bob] = cluster.run()
    return alice, bob


def late_write(cluster: Cluster, secret: str, rng: random.Random) -> tuple[Response, Response]:
    """Carol's long prompt given up on mid-transfer, then Dave in her pages: (carol's answer, dave's)."""
    head = f"carol: save key {secret}. "
    body = document_sentence(rng, CAROL_PROMPT_CHARS)[: CAROL_PROMPT_CHARS - len(head) - 2].rstrip() + "."
    cluster.submit(Request(head + body + "\n", "carol", 32, request_id="carol-1"))
    carol = next(r for _ in range(200) for r in cluster.step())  # her transfer given up on, or she is served
    for _ in range(DAVE_ARRIVAL_AFTER_ABORT):
        cluster.step()
    dave_prompt = make_prompt("dave", [document_sentence(rng, 40), "save pin 4821."])
    cluster.submit(Request(dave_prompt, "dave", MAX_TOKENS, request_id="dave-1"))
    [dave] = cluster.run()
    return carol, dave
