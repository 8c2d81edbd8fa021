"""The ownership audit: a ledger of who wrote every slot, checked on every attention read.

Freed pages keep their data, so the only thing standing between tenants is whether each
request reads only the slots it wrote itself. The audit makes that visible: every write
records the writer, every read compares the slot's writer with the reader, and a mismatch
becomes an event naming reader, victim and pages. In a correct engine it stays at zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

NEVER_WRITTEN = 0  # writer id of a slot nobody has written since boot; request uids start at 1


@dataclass(frozen=True)
class CrossReadEvent:
    """A request attended over slots someone else wrote (or nobody did)."""

    reader: str
    reader_tenant: str
    victim: str | None  # request id that wrote the slots; None for never-written memory
    victim_tenant: str | None
    pages: tuple[int, ...]
    num_slots: int
    node: str


class OwnershipAudit:
    """Per-slot writer ids for one pool, and the read check."""

    def __init__(self, num_slots: int, page_size: int, node: str, device: torch.device | str = "cpu") -> None:
        self.writers = torch.full((num_slots,), NEVER_WRITTEN, dtype=torch.long, device=device)
        self.page_size = page_size
        self.node = node
        self.names: dict[int, tuple[str, str]] = {}  # uid -> (request id, tenant)
        self.events: list[CrossReadEvent] = []

    def register(self, uid: int, request_id: str, tenant: str) -> None:
        assert uid != NEVER_WRITTEN
        self.names[uid] = (request_id, tenant)

    def record_writes(self, slots: Tensor, writer_uids: Tensor) -> None:
        """slots (N,) were just written by writer_uids (N,)."""
        self.writers[slots] = writer_uids

    def forget(self, pages: list[int]) -> None:
        """`pages` were scrubbed (zeroed): their slots now hold what nobody wrote."""
        for page in pages:
            self.writers[page * self.page_size:(page + 1) * self.page_size] = NEVER_WRITTEN

    def check_reads(self, reader_uids: Tensor, gather: Tensor, valid: Tensor) -> list[CrossReadEvent]:
        """reader_uids (B,), gather (B, S) slots each reader attends over, valid (B, S)."""
        writers = self.writers[gather]  # (B, S)
        bad = valid & (writers != reader_uids[:, None])
        if not bool(bad.any()):
            return []
        found = []
        for b in bad.any(dim=1).nonzero().flatten().tolist():
            reader_id, reader_tenant = self.names[int(reader_uids[b])]
            for victim_uid in sorted(set(writers[b][bad[b]].tolist()), key=lambda u: (u == NEVER_WRITTEN, u)):
                sel = bad[b] & (writers[b] == victim_uid)
                slots = gather[b][sel]
                victim = self.names.get(victim_uid)
                found.append(CrossReadEvent(
                    reader=reader_id, reader_tenant=reader_tenant,
                    victim=victim[0] if victim else None, victim_tenant=victim[1] if victim else None,
                    pages=tuple(sorted(set((slots // self.page_size).tolist()))),
                    num_slots=int(sel.sum()), node=self.node,
                ))
        self.events.extend(found)
        return found

    @property
    def cross_tenant_reads(self) -> int:
        """Reads of slots written by another tenant's request."""
        return sum(1 for e in self.events if e.victim_tenant is not None and e.victim_tenant != e.reader_tenant)

    @property
    def violations(self) -> int:
        """All reads of slots the reader did not write (other requests or never-written memory)."""
        return len(self.events)
