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
    request_id: str | None = None  # assigned by the engine when None
    cache_salt: str | None = None  # prefix-cache namespace: only requests with the same salt share pages


class SeqStatus(Enum):
    WAITING = "waiting"  # admitted, no pages yet (or preempted, pages given back)
    RUNNING = "running"  # holds pages; prefilled or decoding
    FINISHED = "finished"


_uids = itertools.count(1)


@dataclass
class Sequence:
    """The engine's view of one admitted request: tokens, pages, progress, timings."""

    request_id: str
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
    generator: torch.Generator | None = None
    # Disaggregated serving only (see disagg/): an abort decided at intake but not yet applied,
    # the prompt as the client sent it, and the transfer room that pairs prefill with decode.
    to_finish: str | None = None
    origin_prompt_ids: list[int] | None = None
    room: int | None = None

    def finished(self) -> bool:
        """Whether the request has ended. Reads finish_reason only, not to_finish (see disagg/)."""
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
