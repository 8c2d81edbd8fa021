"""The front door's book of requests (front_door.py): engine ids, each client's name scoped to its tenant
(only echoed back, never used to route), and the answers not yet handed over."""

import itertools

from minikv.engine.request import Request, Response

AUTO_PREFIX = "req-"  # automatic ids; a client's name with this prefix is never taken as an engine id


class RequestBook:
    """Which engine ids are held, for which tenant and client name, and the answers not yet handed over."""

    def __init__(self) -> None:
        self.auto_ids = itertools.count()
        self.tenant_of: dict[str, str] = {}  # engine id -> tenant, for every held request
        self.named: dict[tuple[str, str], str] = {}  # (tenant, client's name) -> engine id, while held
        self.outbox: dict[str, Response] = {}  # answered, not yet handed over; completion order

    def open(self, request: Request) -> tuple[str, str, str | None]:
        """Take an engine id for `request`: (engine id, tenant, why it must be refused or None)."""
        problem = None
        if not isinstance(request.tenant, str) or not request.tenant:
            problem = f"tenant must be a non-empty string, got {request.tenant!r}"
        elif request.request_id is not None and not isinstance(request.request_id, str):
            problem = (f"request_id must be a string or None, got {type(request.request_id).__name__} "
                       f"{request.request_id!r}")
        tenant = request.tenant if isinstance(request.tenant, str) else ""  # "" is no tenant's name
        name = request.request_id if problem is None else None
        if name and (tenant, name) in self.named:
            problem = (f"duplicate request_id {name!r}: tenant {tenant!r} already has a request with this id "
                       f"that has not been answered")
        elif name and name not in self.tenant_of and not name.startswith(AUTO_PREFIX):
            self.named[(tenant, name)] = name
            self.tenant_of[name] = tenant
            return name, tenant, None
        request_id = next(i for n in self.auto_ids if (i := f"{AUTO_PREFIX}{n}") not in self.tenant_of)
        self.tenant_of[request_id] = tenant
        if name and problem is None:
            self.named[(tenant, name)] = request_id
        return request_id, tenant, problem

    def answer(self, response: Response) -> None:
        """A held request's one response, kept until the next handover."""
        assert response.request_id in self.tenant_of, f"{response.request_id} answered but not held"
        assert response.request_id not in self.outbox, f"{response.request_id} answered twice"
        self.outbox[response.request_id] = response

    def hand_over(self, request_ids: list[str] | None = None) -> list[Response]:
        """Give the answered responses (or only those of `request_ids`) to the caller and forget them."""
        out = []
        for request_id in list(self.outbox) if request_ids is None else request_ids:
            response = self.outbox.pop(request_id)
            tenant = self.tenant_of.pop(request_id)
            assert response.tenant == tenant, \
                f"{request_id}: answer for {response.tenant!r} would go to {tenant!r}"
            name = response.client_request_id
            if name and self.named.get((tenant, name)) == request_id:
                del self.named[(tenant, name)]
            out.append(response)
        return out

    def held(self) -> int:
        """Requests submitted and not yet handed over (what a server's memory is proportional to)."""
        return len(self.tenant_of)
