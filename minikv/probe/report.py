"""What one probe run is asked to do (its options and defaults) and what it found: each check's exchanges,
figures and verdict, the report and exit status. No heavy imports: the command line reads these first."""

from dataclasses import dataclass, field

PASS, FAIL, INCOMPLETE = "pass", "fail", "incomplete"
INFO = "info"  # a measured residual, reported with its figures: never a pass or a fail
VERDICT_WORDS = {PASS: "PASS", FAIL: "FAIL", INFO: "INFO", INCOMPLETE: "COULD NOT TELL (incomplete, not a failure)"}
# every check in the order they run: its name on the command line -> its title in the report
CHECKS = {"canary": "canary", "over-length": "over-length", "honesty": "prompt-token honesty",
          "prefix-cache": "shared prefix cache", "eviction": "shared eviction order", "token-gaps": "inter-token gap"}
DEFAULT_CHECKS = tuple(CHECKS)[:4]  # the other two fill the endpoint's pool, or hold a stream open


@dataclass(frozen=True)
class ProbeOptions:
    model: str | None = None  # None: the first model /v1/models lists
    context: int | None = None  # None: max_model_len from /v1/models
    budget: int = 200  # requests
    time_limit_s: float = 300.0
    rounds: int = 20  # of the prefix-cache audit, 4 requests each
    seed: int | None = None  # None: fresh prompts and canaries each run
    salt_per_key: bool = False  # each key's requests carry a cache_salt of their own, as a salting gateway sends
    checks: tuple[str, ...] = DEFAULT_CHECKS

    def __post_init__(self) -> None:
        unknown = set(self.checks) - set(CHECKS)
        assert not unknown, f"unknown checks {sorted(unknown)}"


class Incomplete(Exception):
    """A check cannot finish (a request not served, the budget spent): verdict INCOMPLETE, this the reason."""


@dataclass
class CheckResult:
    """One check: its exchanges (sent, got) in order, a verdict and the reason for it."""

    name: str
    verdict: str = INCOMPLETE
    reason: str = ""
    exchanges: list[tuple[str, str]] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)  # what the check measured, for --json

    def note(self, sent: str, got: str) -> None:
        self.exchanges.append((sent, got))

    def decide(self, verdict: str, reason: str) -> None:
        self.verdict, self.reason = verdict, reason

    def to_json(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "reason": self.reason, "figures": self.figures,
                "exchanges": [{"sent": sent, "got": got} for sent, got in self.exchanges]}

    def format(self) -> str:
        exchanges = [f"  sent: {sent}\n  got:  {got}" for sent, got in self.exchanges]
        return "\n".join([f"[{self.name}]", *exchanges, f"  verdict: {VERDICT_WORDS[self.verdict]}: {self.reason}"])


@dataclass
class ProbeReport:
    """Every check's result, and what the probe learned about the endpoint."""

    endpoint: str
    model: str | None
    context: int | None
    keys: list[str]  # masked
    salt_per_key: bool = False
    requests_sent: int = 0
    results: list[CheckResult] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)  # checks' command-line names
    quirks: list[str] = field(default_factory=list)  # what the endpoint left out that the API allows

    @property
    def status(self) -> int:
        """The exit status: 0 all passed (INFO passes), 1 any failed, 2 a check could not finish."""
        if any(r.verdict == FAIL for r in self.results):
            return 1
        return 0 if all(r.verdict in (PASS, INFO) for r in self.results) else 2

    def verdicts(self) -> dict[str, str]:
        return {r.name: r.verdict for r in self.results}

    def to_json(self) -> dict:
        return {"endpoint": self.endpoint, "model": self.model, "context": self.context, "keys": self.keys,
                "salt_per_key": self.salt_per_key, "requests_sent": self.requests_sent,
                "checks": [r.to_json() for r in self.results], "not_run": self.not_run, "quirks": self.quirks,
                "exit_status": self.status}

    def summary(self) -> str:
        """The closing lines: the verdicts in words, the checks not run and how to run them, each quirk."""
        named = {verdict: [r.name for r in self.results if r.verdict == verdict] for verdict in VERDICT_WORDS}
        found = [f"failed: {', '.join(named[FAIL])}"] if named[FAIL] else []
        if named[INCOMPLETE]:
            found.append(f"could not tell: {', '.join(named[INCOMPLETE])} (not a failure: the reason says why)")
        if named[INFO]:
            found.append(f"measured, not judged: {', '.join(named[INFO])}")
        salted = ", a cache_salt per key" if self.salt_per_key else ""
        lines = [f"{self.requests_sent} requests to {self.endpoint} ({self.model}, window {self.context:,} tokens"
                 f"{salted}): " + ("; ".join(found) if named[FAIL] or named[INCOMPLETE]
                                   else "; ".join(["all checks passed", *found]))]
        if self.not_run:
            lines.append("not run: " + ", ".join(f"{CHECKS[name]} (--check {name})" for name in self.not_run))
        return "\n".join(lines + [f"peer quirk: {quirk}" for quirk in self.quirks])
