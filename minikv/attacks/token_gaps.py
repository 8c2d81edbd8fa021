"""Batching's own channel: Bob's gaps between tokens tell how much prefill Alice's request needed.

Continuous batching puts a newly admitted prompt's prefill into the same step as everyone's
decode, so the step takes as long as its work. Bob streams tokens; the step in which Alice's
prompt is prefilled delays his next token by that prefill's time. If Alice's prompt hits her own
cache (she sent it before), the step computes one token and Bob hardly notices; if it misses,
every token of it. Salts and partitions do nothing here: nothing is shared but the step.
Chunked prefill (`EngineConfig.chunked_prefill`) caps the prefill tokens per step, so each gap
is bounded; the work, and with it the sum of the gaps, stays.

In-process, one engine step is one of Bob's gaps: the wall time of each step is what a client
streaming Bob's tokens would see, minus the network.
"""

from __future__ import annotations

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
    """Seconds between Bob's tokens from the step Alice's prompt arrives at until Bob is done.

    Bob's request is admitted first; `alice_at` steps later Alice submits `alice_prompt` (1 token
    to generate). Steps in which Bob is still decoding are his gaps.
    """
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
