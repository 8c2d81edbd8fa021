"""Batching's own channel: Bob's gaps between tokens (one engine step each) tell how much prefill Alice's
request needed; salts and partitions do nothing here (docs/attacks.md)."""

import time
from dataclasses import dataclass

from minikv.engine.front_door import FrontDoor
from minikv.engine.request import Request, Response

BOB_PROMPT = "bob: tell me a long story about the sea.\n"


@dataclass
class Gaps:
    """One trial: Bob's gaps from Alice's arrival on, and Alice's own time to first token."""
    bob_s: list[float]
    alice_ttft_s: float


def bob_gaps(door: FrontDoor, alice_prompt: str, bob_tokens: int = 24, alice_at: int = 8) -> Gaps:
    """Bob's gaps (his request admitted first) from the step Alice submits `alice_prompt` (1 token to
    generate), `alice_at` steps later, until Bob is done."""
    bob = door.submit(Request(BOB_PROMPT, "bob", bob_tokens))
    gaps: list[float] = []
    done: dict[str, Response] = {}
    for step in range(100_000):
        if step == alice_at:
            alice = door.submit(Request(alice_prompt, "alice", 1))
        start = time.perf_counter()
        done.update((r.request_id, r) for r in door.step())
        if step >= alice_at:
            gaps.append(time.perf_counter() - start)
        if bob in done:
            break
    assert gaps, "Bob finished before Alice arrived: raise bob_tokens or lower alice_at"
    done.update((r.request_id, r) for r in door.run())  # Alice's request, if Bob finished first
    assert done[alice].status == done[bob].status == 200, (done[alice].error, done[bob].error)
    return Gaps(gaps, done[alice].ttft_s)
