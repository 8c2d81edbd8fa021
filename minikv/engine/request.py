"""A request as a client sends it, the engine's running state for it (a Sequence), and its answer:
shaped like an HTTP reply, with everything a monitor could look at (a 200 can still be wrong)."""

import itertools
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from http import HTTPStatus

import torch
from transformers import PreTrainedTokenizerBase

from minikv.engine.prefix_cache import cache_salt, page_keys
from minikv.model.sampling import SamplingParams
from minikv.model.tokenizer import decode

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a 400 refusing a prompt as too long
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that went away; http.HTTPStatus has none
# earlier tokens decoded with the new ones, so that a tokenizer joining pieces joins them right
DETOKENIZE_CONTEXT = 5


@dataclass(frozen=True)
class Request:
    """What arrives at the API: who, what, how much to generate, and where to stop."""

    prompt: str
    tenant: str = "anon"
    max_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    request_id: str | None = None  # the client's own id: echoed back in the response, never used to route
    cache_salt: str | None = None  # prefix-cache namespace: only requests with the same salt share pages
    stop: tuple[str, ...] = ()  # the reply ends before the first of these strings (OpenAI's `stop`)


class SeqStatus(Enum):
    """Where a sequence is on its node: the scheduler's view, not why it ended."""

    WAITING = "waiting"  # admitted, no pages yet (or preempted, pages given back)
    RUNNING = "running"  # holds pages; prefilled or decoding
    FINISHED = "finished"  # ended on this node; holds no pages, unless its release waits for writes in flight


_uids = itertools.count(1)


@dataclass
class Sequence:
    """The engine's view of one admitted request: tokens, pages, progress, timings, text so far. `to_finish`
    is a finish decided, not yet applied (SGLang's `Req.to_finish`): until a queue gate reads it, the request
    looks alive, `finished()` reading `finish_reason` only. That gap is the incident (disagg/prefill_node.py).
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
    finish_reason: str | None = None  # "stop", "length", "abort"; "transferred": a disaggregated prefill half
    generator: torch.Generator | None = None  # per-request sampler state; None when greedy
    client_request_id: str | None = None  # echoed back in the response
    stop: tuple[str, ...] = ()
    text: str = ""  # decoded incrementally: tokens[text_from:text_upto] decoded last time, the rest is new
    text_from: int = 0
    text_upto: int = 0
    stopped_at_string: bool = False  # a stop string was found: `text` is final
    cache_keys: list[bytes] = field(default_factory=list)  # each full prompt page's key (prefix_cache.py)
    cached_tokens: int = 0  # prompt tokens from the prefix cache at the first admission
    to_finish: str | None = None  # disaggregated serving: an abort decided at intake, not yet applied
    room: int | None = None  # disaggregated serving: the transfer room pairing prefill with decode

    def __post_init__(self) -> None:
        self.text_from = max(0, len(self.prompt_ids) - DETOKENIZE_CONTEXT)
        self.text_upto = len(self.prompt_ids)
        if self.generator is None:
            self.generator = self.sampling.new_generator()

    @classmethod
    def of(cls, request: Request, request_id: str, prompt_ids: list[int],
           page_keying: tuple[int, bool] | None, **fields) -> "Sequence":
        """The one intake of a checked Request, whatever the door: its Sequence, arriving now, with its
        prompt's page keys when `page_keying` (page size, salted per tenant) says the prefix cache is on."""
        name = request.request_id if isinstance(request.request_id, str) else None
        seq = cls(request_id, request.tenant, list(prompt_ids), request.max_tokens, request.sampling,
                  time.perf_counter(), client_request_id=name, stop=tuple(request.stop), **fields)
        if page_keying is not None:  # the one place a salt goes into a key
            page_size, per_tenant = page_keying
            salt = cache_salt(seq.tenant, request.cache_salt, per_tenant)
            seq.cache_keys = page_keys(prompt_ids, page_size, salt)
        return seq

    @classmethod
    def text_view(cls, request: Request, prompt_ids: list[int]) -> "Sequence":
        """A copy that only turns ids into text (a server's HTTP side, streaming): append output ids, read
        `visible_text`, cut where the engine's answer will cut it."""
        return cls("-", "-", list(prompt_ids), 0, SamplingParams(), 0.0, uid=0, stop=tuple(request.stop))

    def copy_for_node(self) -> "Sequence":
        """Another node's own copy (as separate servers keep one): same identity, own lists and sampler."""
        return Sequence(self.request_id, self.tenant, list(self.prompt_ids), self.max_tokens, self.sampling,
                        self.arrival_s, uid=self.uid, client_request_id=self.client_request_id,
                        stop=self.stop, cache_keys=list(self.cache_keys), room=self.room)

    def abort(self, status: int, reason: str) -> "Finished":
        """The one way a request ends unserved: finish_reason "abort", and how it left (status, reason)."""
        self.finish_reason = "abort"
        return Finished(self, status, reason)

    def finished(self) -> bool:
        """Whether the request has ended: finish_reason only, never to_finish (SGLang's `Req.finished()`)."""
        return self.finish_reason is not None

    def tokens(self, start: int, end: int | None = None) -> list[int]:
        """Tokens start..end-1 of the prompt followed by the output (to the last one when `end` is None)."""
        end, p = self.seq_len if end is None else end, len(self.prompt_ids)
        return self.prompt_ids[start:end] + self.output_ids[max(0, start - p) : max(0, end - p)]

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def update_text(self, tokenizer: PreTrainedTokenizerBase) -> bool:
        """Bring `text` up to the last token, decoding only new ones (a piece decoding to U+FFFD waits for
        the next). Returns whether a stop string now ends the text, which is then cut before it and final."""
        if self.stopped_at_string or self.text_upto == self.seq_len:
            return self.stopped_at_string
        shown = decode(tokenizer, self.tokens(self.text_from, self.text_upto))
        both = decode(tokenizer, self.tokens(self.text_from))
        if len(both) <= len(shown) or both.endswith("\ufffd"):
            return False
        new = both[len(shown) :]
        self.text += new
        self.text_from, self.text_upto = self.text_upto, self.seq_len
        tail_from = max(0, len(self.text) - len(new) - max((len(s) for s in self.stop), default=0) + 1)
        hits = [i for i in (self.text.find(s, tail_from) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.stopped_at_string = self.text[: min(hits)], True
        return self.stopped_at_string

    def visible_text(self, tokenizer: PreTrainedTokenizerBase) -> str:
        """The text up to the last token as the client may see it now: all of it once finished; while it
        runs, not a tail that could start a stop string. Streaming and the final answer both read it here."""
        self.update_text(tokenizer)
        if self.finished() or not self.stop:
            return self.text
        return self.text[: max(0, len(self.text) - max(len(s) for s in self.stop) + 1)]


@dataclass
class Usage:
    """Token counts as the API reports them (prompt_tokens is what the client *sent*)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache, not prefill


@dataclass
class Response:
    """One request's answer."""

    request_id: str
    tenant: str
    status: int  # 200 served, 400 refused (the error says why), 499 cancelled, 500 failed, 503 unavailable
    text: str = ""
    usage: Usage = field(default_factory=Usage)
    ttft_s: float | None = None  # seconds from arrival to the first generated token
    token_times_s: list[float] = field(default_factory=list)  # arrival -> each token
    error: str | None = None
    finish_reason: str | None = None  # "stop" (end of text or a stop string), "length" (max tokens), "abort"
    client_request_id: str | None = None  # the client's own id, echoed back; never used to route
    error_code: str | None = None  # a 400's OpenAI code: "invalid_value" or "context_length_exceeded"
    error_param: str | None = None  # the request field a 400 names (OpenAI's `param`), if any

    def __post_init__(self) -> None:
        self.status = int(self.status)  # an HTTPStatus prints as its name in lists; keep the plain number

    def to_json(self) -> dict:
        """The public contract: status, text, usage, ttft_s, error."""
        return {"status": self.status, "text": self.text, "usage": asdict(self.usage), "ttft_s": self.ttft_s,
                "error": self.error}


@dataclass(frozen=True)
class Finished:
    """How a request left a node: the sequence, its status, and the error when not 200."""

    seq: Sequence
    status: int
    error: str | None = None


def to_response(seq: Sequence, status: int, error: str | None,
                tokenizer: PreTrainedTokenizerBase) -> Response:
    """The one way a Sequence becomes a Response: a 200 carries the text and usage, anything else neither
    (the client received none). A node's 400 refuses a prompt too long."""
    if status != HTTPStatus.OK:
        too_long = (CONTEXT_LENGTH_EXCEEDED, "prompt") if status == HTTPStatus.BAD_REQUEST else (None, None)
        return error_response(seq.request_id, seq.tenant, status, error or "", len(seq.prompt_ids),
                              seq.client_request_id, *too_long)
    return Response(seq.request_id, seq.tenant, status, seq.visible_text(tokenizer),
                    Usage(len(seq.prompt_ids), len(seq.output_ids), seq.cached_tokens), seq.first_token_s,
                    list(seq.token_times_s), None, seq.finish_reason, seq.client_request_id)


def error_response(request_id: str, tenant: str, status: int, reason: str, prompt_tokens: int = 0,
                   client_request_id: str | None = None, code: str | None = None,
                   param: str | None = None) -> Response:
    """An answer with no text: 400 (its reason names the numbers; OpenAI's `code`, `param`), 499, 500, 503."""
    return Response(request_id, tenant, status, usage=Usage(prompt_tokens, 0), error=reason,
                    finish_reason="abort", client_request_id=client_request_id, error_code=code,
                    error_param=param)
