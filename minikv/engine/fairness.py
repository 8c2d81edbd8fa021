"""Fair admission across tenants: a Virtual Token Counter (Sheng et al., "Fairness in Serving Large
Language Models", OSDI 2024). The least served tenant's request goes first, so a tenant that sends 32
requests at once gets no more prefill than one that sends one. See docs/engine.md.
"""

from collections.abc import Iterable

from minikv.engine.request import Sequence

PROMPT_WEIGHT = 1.0  # service of one prompt token prefilled (one of a batch's many, computed together)
OUTPUT_WEIGHT = 2.0  # service of one generated token (each costs the request a decode step)


class VirtualTokenCounter:
    """Per-tenant counters of service received, and the admission order they give."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}

    def arrive(self, tenant: str, active: set[str]) -> None:
        """`tenant` sends a request while the tenants in `active` have requests queued or running. One that
        had none is lifted to the least active counter (nobody active: to the largest counter there is)."""
        if tenant in active:
            return
        largest = max(self.counters.values(), default=0.0)
        floor = min((self.counters.get(t, 0.0) for t in active), default=largest)
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def charge(self, tenant: str, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """Count service `tenant` has just received."""
        assert prompt_tokens >= 0 and output_tokens >= 0, "service is never negative"
        self.counters[tenant] = (self.counters.get(tenant, 0.0) + PROMPT_WEIGHT * prompt_tokens
                                 + OUTPUT_WEIGHT * output_tokens)

    def next_in_line(self, waiting: Iterable[Sequence]) -> Sequence:
        """The waiting request to admit next: its tenant's counter is least; the earliest of ties."""
        return min(waiting, key=lambda seq: self.counters.get(seq.tenant, 0.0))  # min: the first of equals
