"""The client side of a server, the same on `Engine` and `Cluster`: ids in, responses out.

The engine owns its request ids. A client may name its request (`Request.request_id`); that
name is only echoed back (`Response.client_request_id`), scoped to the client's tenant, and never
used to route. The engine's id is the client's name when no request still held here uses it and
it is not an automatic id (`req-N`), so logs stay readable; otherwise a fresh automatic id.
A request is *held* from `submit` until its response is handed over; while held, its id is
taken, and a second request with the same name from the same tenant is refused (400).

Responses are handed over exactly once, by `step` (or `run`, `generate`), and nothing is kept
afterwards: a server's memory follows its live requests, not its history. At handover each
response's tenant is checked against the tenant that submitted it.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from http import HTTPStatus

from minikv.admission import Rejected
from minikv.request import Request
from minikv.response import Response, Usage, bad_request
from minikv.sampling import SamplingParams

AUTO_PREFIX = "req-"  # automatic ids; a client's name with this prefix is never taken as an engine id


def id_problem(request: Request) -> str | None:
    """Why the request's tenant or id cannot even be read (a 400), or None."""
    if not isinstance(request.tenant, str) or not request.tenant:
        return f"tenant must be a non-empty string, got {request.tenant!r}"
    if request.request_id is not None and not isinstance(request.request_id, str):
        return f"request_id must be a string or None, got {type(request.request_id).__name__} {request.request_id!r}"
    return None


class FrontDoor(ABC):
    """Engine-owned ids, the handover of responses, and the client API built on `_advance`."""

    def __init__(self) -> None:
        self._auto_ids = itertools.count()
        self._tenant_of: dict[str, str] = {}  # engine id -> tenant, for every held request
        self._named: dict[tuple[str, str], str] = {}  # (tenant, client's name) -> engine id, while held
        self._outbox: dict[str, Response] = {}  # answered, not yet handed over; completion order

    # -- what Engine and Cluster implement -------------------------------------------------
    @abstractmethod
    def submit(self, request: Request) -> str:
        """Admit `request`, or answer it 400 at once. Returns the engine's id for it."""

    @abstractmethod
    def cancel(self, request_id: str) -> bool:
        """The client went away: end the request now (499). False if it was not being served."""

    @abstractmethod
    def output_ids(self, request_id: str) -> list[int]:
        """Tokens generated so far for a request still being served (what a server streams); [] otherwise."""

    @abstractmethod
    def health(self) -> dict:
        """What a server's /health reports: each pool's occupancy and the audit's cross-tenant reads."""

    @abstractmethod
    def _advance(self) -> None:
        """One step of the server; answers land in the outbox through `_answer`."""

    @abstractmethod
    def _busy(self) -> bool:
        """Whether any request is still being served."""

    @abstractmethod
    def _log_refusal(self, request_id: str, tenant: str, reason: str) -> None:
        """Record a request answered at the door (the `reject` event)."""

    def close(self) -> None:
        """Release what the server holds outside this process (DistCluster's workers); nothing here."""

    # -- ids ------------------------------------------------------------------------------------
    def _open(self, request: Request) -> tuple[str, str, str | None]:
        """Take an engine id for `request`: (engine id, tenant, why it must be refused or None)."""
        problem = id_problem(request)
        tenant = request.tenant if isinstance(request.tenant, str) else ""  # "" is no tenant's name
        name = request.request_id if problem is None else None
        if name and (tenant, name) in self._named:
            problem = (f"duplicate request_id {name!r}: tenant {tenant!r} already has a request with this id "
                       f"that has not been answered")
        elif name and name not in self._tenant_of and not name.startswith(AUTO_PREFIX):
            self._named[(tenant, name)] = name
            self._tenant_of[name] = tenant
            return name, tenant, None
        request_id = self._fresh_id()
        self._tenant_of[request_id] = tenant
        if name and problem is None:
            self._named[(tenant, name)] = request_id
        return request_id, tenant, problem

    def _intake(self, request: Request, check: Callable[[Request], list[int]]) -> tuple[str, str, str | None, list[int] | None]:
        """Take an id for `request` and run `check` (the prompt's token ids, or Rejected).

        Returns (engine id, tenant, client's name, token ids); the ids are None when the request
        was answered here: 400 with the reason, or 500 if checking it raised.
        """
        request_id, tenant, problem = self._open(request)
        name = request.request_id if isinstance(request.request_id, str) else None
        try:
            if problem:
                raise Rejected(problem)
            return request_id, tenant, name, check(request)
        except Rejected as e:
            self._log_refusal(request_id, tenant, e.reason)
            self._answer(bad_request(request_id, tenant, e.reason, e.prompt_tokens, name))
        except Exception as e:  # noqa: BLE001 - one request's failure, not the server's
            reason = f"internal error while checking this request: {type(e).__name__}: {e}"
            self._log_refusal(request_id, tenant, reason)
            self._answer(Response(request_id, tenant, HTTPStatus.INTERNAL_SERVER_ERROR, usage=Usage(), error=reason,
                                  finish_reason="abort", client_request_id=name))
        return request_id, tenant, name, None

    def _fresh_id(self) -> str:
        while True:
            request_id = f"{AUTO_PREFIX}{next(self._auto_ids)}"
            if request_id not in self._tenant_of:
                return request_id

    # -- responses --------------------------------------------------------------------------
    def _answer(self, response: Response) -> None:
        """A held request's one response, kept until the next handover."""
        assert response.request_id in self._tenant_of, f"{response.request_id} answered but not held"
        assert response.request_id not in self._outbox, f"{response.request_id} answered twice"
        self._outbox[response.request_id] = response

    def _hand_over(self, request_ids: list[str] | None = None) -> list[Response]:
        """Give the answered responses (or only those of `request_ids`) to the caller and forget them."""
        keys = list(self._outbox) if request_ids is None else request_ids
        out = []
        for request_id in keys:
            response = self._outbox.pop(request_id)
            tenant = self._tenant_of.pop(request_id)
            assert response.tenant == tenant, f"{request_id}: answer for {response.tenant!r} would go to {tenant!r}"
            name = response.client_request_id
            if name and self._named.get((tenant, name)) == request_id:
                del self._named[(tenant, name)]
            out.append(response)
        return out

    def held(self) -> int:
        """Requests submitted and not yet handed over (what a server's memory is proportional to)."""
        return len(self._tenant_of)

    # -- the client API -------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self._busy() or bool(self._outbox)

    def step(self) -> list[Response]:
        """One step; the responses completed in it (or earlier and not yet handed over)."""
        self._advance()
        return self._hand_over()

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
        """Submit every prompt, step until each is answered, return responses in prompt order.

        Responses of other requests completed meanwhile stay for the next `step`.
        """
        ids = [self.submit(Request(p, tenant, max_tokens, sampling)) for p in prompts]
        for _ in range(100_000):
            if all(i in self._outbox for i in ids):
                return self._hand_over(ids)
            self._advance()
        raise RuntimeError(f"{type(self).__name__} still busy after 100000 steps")
