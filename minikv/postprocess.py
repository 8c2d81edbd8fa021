"""After each forward, one owner moves every request of the batch on by one token.

`postprocess` appends the sampled token, advances `num_cached`, records the timings, applies
the finish rule and hands a finished request to its node's `finish`, which frees its pages;
a request whose token could not be chosen goes to `fail` instead (a 500 for that request
alone). The single-node engine and the decode node both call it, so a request's life reads
the same on both. nano-vllm's `Scheduler.postprocess` is the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from minikv.request import Sequence


@dataclass(frozen=True)
class Sampled:
    """What the model runner chose for one request: a token, or why it could not."""

    token: int | None = None
    error: str | None = None


def finish_rule(seq: Sequence, eos_id: int | None) -> str | None:
    """The finish rule, written once: "stop" at end of text, "length" at max_tokens, else None."""
    if seq.output_ids and seq.output_ids[-1] == eos_id:
        return "stop"
    if len(seq.output_ids) >= seq.max_tokens:
        return "length"
    return None


def postprocess(seqs: list[Sequence], sampled: list[Sampled], num_new: list[int], eos_id: int | None,
                finish: Callable[[Sequence], None], fail: Callable[[Sequence, str], None]) -> None:
    """Apply one step's outcome to each sequence.

    Args:
        seqs: the batch, in the order the runner saw it.
        sampled: the runner's choice for each sequence.
        num_new: how many tokens' K/V each sequence's step put into the pool.
        eos_id: the end-of-text token.
        finish: called once `finish_reason` is set; frees the pages and answers the client.
        fail: called with the reason when no token could be chosen; ends that request alone.
    """
    now = time.perf_counter()
    for seq, choice, n in zip(seqs, sampled, num_new, strict=True):
        if choice.error is not None:
            fail(seq, choice.error)
            continue
        assert choice.token is not None and seq.finish_reason is None, f"{seq.request_id} stepped after it ended"
        seq.num_cached += n
        seq.output_ids.append(choice.token)
        seq.token_times_s.append(now - seq.arrival_s)
        if seq.first_token_s is None:
            seq.first_token_s = now - seq.arrival_s
        reason = finish_rule(seq, eos_id)
        if reason is not None:
            seq.finish_reason = reason
            finish(seq)
