"""The ownership audit: a ledger of who wrote every slot, checked on every attention read.

Freed pages keep their data, so what stands between tenants is whether each request reads only the
slots it wrote: a read of a slot someone else wrote is an event naming reader, victim and pages.
The one legitimate exception is a **shared read** of a prefix-cache page whose writer sent the same
prompt up to there (counted apart, `cross_tenant_cache_hits`, when tenants differ). See docs/engine.md.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

NEVER_WRITTEN = 0  # writer id of a slot nobody has written since boot; request uids start at 1
UNKNOWN_POSITION = -1  # writer position of a slot written without one (never a shared read)


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
        self.positions = torch.full((num_slots,), UNKNOWN_POSITION, dtype=torch.long, device=device)
        self.page_size, self.node = page_size, node
        self.names: dict[int, tuple[str, str]] = {}  # uid -> (request id, tenant), while it may be needed
        self.prompts: dict[int, list[int]] = {}  # uid -> the prompt token ids it sent, kept as long as its name
        self.live: set[int] = set()  # registered and not yet retired
        self.events: list[CrossReadEvent] = []  # every finding since boot (zero in a correct engine)
        self.shared: dict[int, set[int]] = {}  # live reader uid -> writers whose cached prefix it read
        self.cache_hits = 0  # (reader, writer) pairs since boot in which a reader used a cached prefix
        self.cross_tenant_cache_hits = 0  # those pairs in which reader and writer are different tenants
        self._prune_at = 64

    def register(self, uid: int, request_id: str, tenant: str, prompt_ids: list[int] = ()) -> None:
        assert uid != NEVER_WRITTEN
        self.names[uid] = (request_id, tenant)
        self.prompts[uid] = list(prompt_ids)
        self.live.add(uid)

    def retire(self, uid: int) -> None:
        """`uid` will write no more: its name stays while a slot holds its data (pruned when retired names double)."""
        self.live.discard(uid)
        self.shared.pop(uid, None)
        if len(self.names) - len(self.live) >= self._prune_at:  # retired names kept: prune when they double
            keep = set(self.writers.unique().tolist()) | self.live
            self.names = {u: name for u, name in self.names.items() if u in keep}
            self.prompts = {u: ids for u, ids in self.prompts.items() if u in keep}
            self._prune_at = max(64, 2 * (len(self.names) - len(self.live)))

    def record_writes(self, slots: Tensor, writer_uids: Tensor, positions: Tensor | None = None) -> None:
        """slots (N,) were just written by writer_uids (N,), at token positions (N,) when known."""
        self.writers[slots] = writer_uids
        self.positions[slots] = UNKNOWN_POSITION if positions is None else positions

    def _same_prefix(self, reader: int, writer: int, upto: int) -> bool:
        """Both requests sent the same tokens at positions 0..upto."""
        a, b = self.prompts.get(reader, []), self.prompts.get(writer, [])
        return upto < len(a) and upto < len(b) and a[: upto + 1] == b[: upto + 1]

    def forget(self, pages: list[int]) -> None:
        """`pages` were scrubbed (zeroed): their slots now hold what nobody wrote."""
        for page in pages:
            self.writers[page * self.page_size:(page + 1) * self.page_size] = NEVER_WRITTEN
            self.positions[page * self.page_size:(page + 1) * self.page_size] = UNKNOWN_POSITION

    def check_reads(self, reader_uids: Tensor, gather: Tensor, valid: Tensor) -> list[CrossReadEvent]:
        """reader_uids (B,), gather (B, S) slots each reader attends over, valid (B, S)."""
        writers = self.writers[gather]  # (B, S)
        bad = valid & (writers != reader_uids[:, None])
        if not bool(bad.any()):
            return []
        key_positions = torch.arange(gather.shape[1], device=gather.device)[None, :]  # (1, S)
        at_own_position = self.positions[gather] == key_positions  # (B, S) written at the position it is read at
        found = []
        for b in bad.any(dim=1).nonzero().flatten().tolist():
            reader_uid = int(reader_uids[b])
            reader_id, reader_tenant = self.names[reader_uid]
            for victim_uid in sorted(set(writers[b][bad[b]].tolist()), key=lambda u: (u == NEVER_WRITTEN, u)):
                sel = bad[b] & (writers[b] == victim_uid)
                last = int(sel.nonzero().max())
                if victim_uid != NEVER_WRITTEN and bool(at_own_position[b][sel].all()) \
                        and self._same_prefix(reader_uid, victim_uid, last):
                    self._count_cache_hit(reader_uid, victim_uid)
                    continue  # a legitimate read of a cached prefix: the reader sent these tokens too
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

    def _count_cache_hit(self, reader: int, writer: int) -> None:
        """Count each (reader, writer) pair once, however many steps the reader attends over it."""
        seen = self.shared.setdefault(reader, set())
        if writer in seen:
            return
        seen.add(writer)
        self.cache_hits += 1
        if self.names[reader][1] != self.names[writer][1]:
            self.cross_tenant_cache_hits += 1  # no salt kept the two tenants apart

    @property
    def violations(self) -> int:
        """All reads of slots the reader did not write (other requests or never-written memory)."""
        return len(self.events)
