"""What one probe run is asked to do, with its defaults; no heavy imports (the command line reads these first)."""

from dataclasses import dataclass

CHECKS = ("canary", "over-length", "honesty", "prefix-cache", "eviction", "token-gaps")  # in the order they run
DEFAULT_CHECKS = CHECKS[:4]  # the other two fill the endpoint's pool, or hold a stream open


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
