"""A check's result: what was sent, what came back, and the verdict; printed or as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, INCOMPLETE = "pass", "fail", "incomplete"
INFO = "info"  # a measured residual, reported with its figures: never a pass or a fail


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

    def decide(self, verdict: str, reason: str) -> "CheckResult":
        self.verdict, self.reason = verdict, reason
        return self

    def to_json(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "reason": self.reason, "figures": self.figures,
                "exchanges": [{"sent": s, "got": g} for s, g in self.exchanges]}

    def format(self) -> str:
        lines = [f"[{self.name}]"]
        for sent, got in self.exchanges:
            lines += [f"  sent: {sent}", f"  got:  {got}"]
        lines.append(f"  verdict: {self.verdict.upper()}: {self.reason}")
        return "\n".join(lines)


def exit_status(results: list[CheckResult]) -> int:
    """0 all passed, 1 any failed, 2 a check could not finish (and none failed). INFO counts as passed."""
    if any(r.verdict == FAIL for r in results):
        return 1
    return 0 if all(r.verdict in (PASS, INFO) for r in results) else 2
