"""A request as a client sends it, and the engine's running state for it (a Sequence)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

import torch

from minikv.sampling import SamplingParams


@dataclass(frozen=True)
class Request:
    """What arrives at the API: who, what, and how much to generate."""

    prompt: str
    tenant: str = "anon"
    max_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    request_id: str | None = None  # the client's own id: echoed back in the response, never used to route
    cache_salt: str | None = None  # prefix-cache namespace: only requests with the same salt share pages


class SeqStatus(Enum):
    """Where a sequence is on its node: the scheduler's view, not why it ended."""

    WAITING = "waiting"  # admitted, no pages yet (or preempted, pages given back)
    RUNNING = "running"  # holds pages; prefilled or decoding
    FINISHED = "finished"  # ended on this node; holds no pages (decode's deferred release may hold them until writes land)


_uids = itertools.count(1)


@dataclass
class Sequence:
    """The engine's view of one admitted request: tokens, pages, progress, timings.

    Three fields say something about the end, and each says one thing:
    - `status` is where the sequence is on its node (WAITING, RUNNING, FINISHED);
    - `finish_reason` is why it ended, set once when it does ("stop", "length", "abort", or
      "transferred" for the prefill half of a disaggregated request); `finished()` reads it;
    - `to_finish` is a finish *decided but not yet applied*, named as in SGLang's `Req.to_finish`.
      It sets nothing else: until a queue gate reads it, the request looks alive to `finished()`.
      That gap is the incident (see disagg/prefill_node.py).
    """

    request_id: str  # the engine's id
    tenant: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    arrival_s: float
    uid: int = field(default_factory=lambda: next(_uids))  # numeric id for the audit ledger
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose K/V are in the pool
    status: SeqStatus = SeqStatus.WAITING
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    generator: torch.Generator | None = None  # per-request sampler state; None when greedy
    client_request_id: str | None = None  # echoed back in the response
    # Prefix caching (prefix_cache.py): the key of each full prompt page (empty when the node has
    # no cache), and how many prompt tokens came from the cache when the request was first admitted.
    cache_keys: list[bytes] = field(default_factory=list)
    cached_tokens: int = 0
    # Disaggregated serving only (see disagg/): an abort decided at intake but not yet applied
    # (SGLang's `to_finish`), and the transfer room that pairs prefill with decode.
    to_finish: str | None = None
    room: int | None = None

    def finished(self) -> bool:
        """Whether the request has ended. Reads finish_reason only, never to_finish (as SGLang's `Req.finished()`)."""
        return self.finish_reason is not None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_seq_len(self) -> int:
        """The most tokens this request can ever hold: prompt plus every generated token."""
        return len(self.prompt_ids) + self.max_tokens
