"""The front door every server has, whatever runs behind it: ids, checks, live requests, answers.

`Engine`, `Cluster` and `DistCluster` supply only how requests are admitted, cancelled and stepped
(`_admit`, `_cancel`, `_advance`). The door owns the rest: engine ids (a client's `request_id` is only
echoed back), the checks (400s that name the numbers), the live requests (`seqs`), one Response each.
"""

from abc import ABC, abstractmethod
from http import HTTPStatus

from transformers import PreTrainedTokenizerBase

from minikv.engine.config import EngineConfig
from minikv.engine.events import Clock, Event, EventLog
from minikv.engine.partition import TenantSlots
from minikv.engine.request_book import RequestBook
from minikv.engine.request import (CONTEXT_LENGTH_EXCEEDED, Finished, Request, Response, Sequence,
                                   error_response, to_response)
from minikv.model.sampling import SamplingParams
from minikv.model.tokenizer import PromptError, encode_prompt, longest_token_chars


# -- admission control: the checks a request must pass before it may hold any KV cache ---------
class Rejected(Exception):
    """A request answered 400: why, the field it names (OpenAI's `param`), and `prompt_tokens` when the
    prompt is too long (code `context_length_exceeded`)."""

    def __init__(self, reason: str, param: str | None = None, prompt_tokens: int = 0) -> None:
        super().__init__(reason)
        self.reason, self.param, self.prompt_tokens = reason, param, prompt_tokens
        self.code = CONTEXT_LENGTH_EXCEEDED if prompt_tokens else "invalid_value"


# a prompt this many windows long (in the longest token's characters) is never tokenized
UNTOKENIZED_FACTOR = 4
MAX_SALT_CHARS = 256


def check_shape(request: Request) -> None:
    """The request's fields, before its prompt is read: max_tokens, sampling, cache_salt."""
    wanted = request.max_tokens
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise Rejected(f"max_tokens must be a positive integer, got {request.max_tokens!r}", "max_tokens")
    if not isinstance(request.sampling, SamplingParams):
        raise Rejected(f"sampling must be SamplingParams, got {type(request.sampling).__name__}")
    if problem := request.sampling.problem():
        raise Rejected(problem[1], problem[0])
    # client input like any other: an over-long one ended vLLM's engine (CVE-2026-105756)
    salt = request.cache_salt
    valid = isinstance(salt, str) and 1 <= len(salt) <= MAX_SALT_CHARS and salt.isprintable()
    if salt is not None and not valid:
        shown = f"{len(salt)} characters" if isinstance(salt, str) else type(salt).__name__
        raise Rejected(f"cache_salt must be 1 to {MAX_SALT_CHARS} printable characters, got {shown}",
                       "cache_salt")


def check_at_door(request: Request, tokenizer: PreTrainedTokenizerBase, context_len: int,
                  chars_per_token: int) -> list[int]:
    """What every front door checks, cheapest first (the shape, then the window): the prompt's ids."""
    check_shape(request)
    text = request.prompt
    if isinstance(text, str) and len(text) > UNTOKENIZED_FACTOR * context_len * chars_per_token:
        at_least = -(-len(text) // chars_per_token)
        raise Rejected(f"prompt has at least {at_least} tokens ({len(text)} characters); the context window "
                       f"is {context_len} tokens (prompt + output)", "prompt", at_least)
    try:
        ids = encode_prompt(tokenizer, text)
    except PromptError as e:
        raise Rejected(str(e), "prompt") from None
    check_context(len(ids), request.max_tokens, context_len)
    return ids


def check_context(prompt_len: int, max_tokens: int, context_len: int) -> None:
    """The prompt, and the prompt plus its output, must fit the advertised context window."""
    if prompt_len > context_len - 1:
        raise Rejected(f"prompt has {prompt_len} tokens; the context window is {context_len} tokens "
                       "(prompt + output)", "prompt", prompt_len)
    if prompt_len + max_tokens > context_len:
        raise Rejected(f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = "
                       f"{prompt_len + max_tokens} exceeds the context window of {context_len} tokens",
                       "prompt", prompt_len)


def check_pool(num_tokens: int, pool_tokens: int, node: str, prompt_len: int,
               partitioned: bool = False) -> None:
    """A request needing more KV than its tenant may ever hold (the pool, or its quota) can never run."""
    if num_tokens > pool_tokens:
        whose = "holds at most" if not partitioned else "holds for one tenant (its quota) at most"
        raise Rejected(f"request needs {num_tokens} tokens of KV cache; the {node} node's pool {whose} "
                       f"{pool_tokens} tokens", "prompt", prompt_len)


class FrontDoor(ABC):
    """The client API of a server: `submit`, `cancel`, `step`, `run`, `generate`, `health`, `close`."""

    def __init__(self, config: EngineConfig, tokenizer: PreTrainedTokenizerBase, log: EventLog, clock: Clock,
                 door: str, partition_tenants: int | None, salt_per_tenant: bool) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.log, self.clock, self.door = log, clock, door
        # how Sequence.of keys a prompt's pages: (page size, salted per tenant: `cache_salt`); None: no cache
        self.page_keying = (config.page_size, salt_per_tenant) if config.prefix_caching else None
        self.slots = TenantSlots(partition_tenants) if partition_tenants else None  # None: one shared pool
        self.chars_per_token = longest_token_chars(tokenizer)  # for the length check before tokenizing
        self.book = RequestBook()
        self.seqs: dict[str, Sequence] = {}  # engine id -> the request being served, until it ends

    # -- what Engine, Cluster and DistCluster supply ---------------------------------------
    @abstractmethod
    def _admit(self, request: Request, request_id: str, prompt_ids: list[int]) -> Sequence:
        """Hand a request that passed the door's checks to the node(s): its Sequence, or Rejected (400)."""

    @abstractmethod
    def _cancel(self, seq: Sequence) -> None:
        """The client went away: end `seq` now (499) or have the nodes retire it at their next gate."""

    @abstractmethod
    def _advance(self) -> list[Finished]:
        """One step of the server; the requests that ended in it."""

    @abstractmethod
    def startup_log(self) -> list[str]:
        """What each node logs at startup: its pool size next to the context window."""

    @abstractmethod
    def health(self) -> dict:
        """What a server's /health reports: each pool's occupancy and the audit's cross-tenant reads."""

    def close(self) -> None:
        """Release what the server holds outside this process (DistCluster's workers); nothing here."""

    # -- the client API ----------------------------------------------------------------------
    def submit(self, request: Request, prompt_ids: list[int] | None = None) -> str:
        """Admit `request`, or answer it at once (400 with the reason; 500 if checking raised): its engine id.
        `prompt_ids`: what `check_at_door` returned, when a server ran the checks on its own threads."""
        request_id, tenant, problem = self.book.open(request)
        name = request.request_id if isinstance(request.request_id, str) else None
        try:
            if problem:
                raise Rejected(problem)
            if self.slots is not None and (refused := self.slots.take(tenant)):
                raise Rejected(refused)
            ids = prompt_ids or check_at_door(request, self.tokenizer, self.config.context_len,
                                              self.chars_per_token)
            self.seqs[request_id] = self._admit(request, request_id, ids)
            return request_id
        except Rejected as e:
            answer = error_response(request_id, tenant, HTTPStatus.BAD_REQUEST, e.reason, e.prompt_tokens,
                                    name, e.code, e.param)
        except Exception as e:  # noqa: BLE001 - one request's failure, not the server's
            reason = f"internal error while checking this request: {type(e).__name__}: {e}"
            answer = error_response(request_id, tenant, HTTPStatus.INTERNAL_SERVER_ERROR, reason, 0, name)
        self._event("reject", request_id, tenant, answer.error)
        self.book.answer(answer)
        return request_id

    def cancel(self, request_id: str) -> bool:
        """The client went away: end the request (499). False if it was not being served."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self._cancel(seq)
        return True

    def has_work(self) -> bool:
        return bool(self.seqs or self.book.outbox)

    def step(self) -> list[Response]:
        """One step; the responses completed in it (or earlier and not yet handed over)."""
        for ended in self._advance():
            self._end(ended)
        return self.book.hand_over()

    def run(self, max_steps: int = 100_000) -> list[Response]:
        """Step until every submitted request is answered; responses in completion order."""
        done: list[Response] = []
        for _ in range(max_steps):
            if not self.has_work():
                return done
            done += self.step()
        raise RuntimeError(f"{type(self).__name__} still busy after {max_steps} steps")

    def generate(self, prompts: list[str], max_tokens: int = 64, tenant: str = "anon",
                 sampling: SamplingParams = SamplingParams()) -> list[Response]:
        """Submit every prompt and step until each is answered: their responses, in prompt order."""
        ids = [self.submit(Request(p, tenant, max_tokens, sampling)) for p in prompts]
        for _ in range(100_000):
            if all(i in self.book.outbox for i in ids):
                return self.book.hand_over(ids)
            for ended in self._advance():
                self._end(ended)
        raise RuntimeError(f"{type(self).__name__} still busy after 100000 steps")

    # -- what the backends share -------------------------------------------------------------
    def _event(self, kind: str, request_id: str, tenant: str, detail: str = "",
               pages: tuple[int, ...] = ()) -> None:
        self.log.add(Event(self.clock.now, self.door, kind, request_id, tenant, pages, detail))

    def _end(self, ended: Finished) -> None:
        """`ended.seq` has left the server: answer its client and forget it."""
        seq = self.seqs.pop(ended.seq.request_id)
        self.book.answer(to_response(ended.seq, ended.status, ended.error, self.tokenizer))
        assert seq.uid == ended.seq.uid, f"{seq.request_id} ended as another request"

