"""The ownership audit: a ledger of who wrote every slot, checked on every attention read. A read of a slot
someone else wrote is a finding, unless it is a **shared read** of a prefix-cache page whose writer sent
the same prompt up to there. Python runs only on reads the tensor check cannot explain. See docs/engine.md.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

NEVER_WRITTEN = 0  # writer id of a slot nobody has written since boot; request uids start at 1
UNKNOWN_POSITION = -1  # writer position of a slot written without one (never a shared read)
NO_GRANT = -1  # in a reader's row of grants: no other writer's slot may be read at this position


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
        self.prompts: dict[int, list[int]] = {}  # uid -> the prompt ids it sent, kept as long as its name
        self.live: set[int] = set()  # registered and not yet retired
        self.events: list[CrossReadEvent] = []  # every finding since boot (zero in a correct engine)
        self.shared: dict[int, set[int]] = {}  # live reader uid -> writers whose cached prefix it read
        self.cache_hits = 0  # (reader, writer) pairs since boot in which a reader used a cached prefix
        self.cross_tenant_cache_hits = 0  # those pairs in which reader and writer are different tenants
        # (rows, key positions): the writer a reader may read at each position; row 0 grants nothing
        self.grants = torch.full((2, 0), NO_GRANT, dtype=torch.long, device=device)
        self.grant_rows: dict[int, int] = {}  # live reader uid -> its row of grants
        self.free_rows = [1]  # rows no reader holds
        self._prune_at = 64

    def register(self, uid: int, request_id: str, tenant: str, prompt_ids: list[int] = ()) -> None:
        assert uid != NEVER_WRITTEN
        self.names[uid] = (request_id, tenant)
        self.prompts[uid] = list(prompt_ids)
        self.live.add(uid)

    def retire(self, uid: int) -> None:
        """`uid` will write no more: its name stays while a slot holds its data (pruned when retired names
        double); its grants go."""
        self.live.discard(uid)
        self.shared.pop(uid, None)
        if uid in self.grant_rows:
            row = self.grant_rows.pop(uid)
            self.grants[row] = NO_GRANT
            self.free_rows.append(row)
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
            span = slice(page * self.page_size, (page + 1) * self.page_size)
            self.writers[span], self.positions[span] = NEVER_WRITTEN, UNKNOWN_POSITION

    def check_reads(self, reader_uids: Tensor, gather: Tensor, valid: Tensor) -> list[CrossReadEvent]:
        """reader_uids (B,), gather (B, S) slots each reader attends over, valid (B, S). Every read is checked
        with tensor operations; Python runs only for a reader with a read neither its own nor granted."""
        writers = self.writers[gather]  # (B, S)
        key_positions = torch.arange(gather.shape[1], device=gather.device)  # (S,)
        at_own_position = self.positions[gather] == key_positions  # (B, S) written where it is read
        foreign = valid & (writers != reader_uids[:, None])  # (B, S) reads of slots the reader did not write
        granted = (writers == self._granted(reader_uids.tolist(), gather.shape[1])) & at_own_position
        new = foreign & ~granted  # (B, S)
        if not bool(new.any()):
            return []
        found = [e for b in new.any(dim=1).nonzero().flatten().tolist()
                 for e in self._resolve(int(reader_uids[b]), gather[b], writers[b], foreign[b], new[b],
                                        at_own_position[b])]
        self.events.extend(found)
        return found

    def _resolve(self, reader_uid: int, gather: Tensor, writers: Tensor, foreign: Tensor, new: Tensor,
                 at_own_position: Tensor) -> list[CrossReadEvent]:
        """One reader's foreign reads (S,), victim by victim among those in `new`: a shared read of a cached
        prefix is granted (not checked in Python again), anything else is a finding."""
        found = []
        for victim_uid in sorted(set(writers[new].tolist()), key=lambda u: (u == NEVER_WRITTEN, u)):
            sel = foreign & (writers == victim_uid)  # (S,) every read of this victim's slots, granted or not
            last = int(sel.nonzero().max())
            if victim_uid != NEVER_WRITTEN and bool(at_own_position[sel].all()) \
                    and self._same_prefix(reader_uid, victim_uid, last):
                self._grant(reader_uid, victim_uid, sel.nonzero().flatten())
                continue  # a legitimate read of a cached prefix: the reader sent these tokens too
            found.append(self.finding(reader_uid, victim_uid, gather[sel].tolist()))
        return found

    def finding(self, reader: int, writer: int, slots: list[int]) -> CrossReadEvent:
        """The event for `reader`'s reads of `slots` that `writer` wrote (NEVER_WRITTEN: nobody)."""
        victim, victim_tenant = self.names.get(writer, (None, None))
        pages = tuple(sorted({slot // self.page_size for slot in slots}))
        return CrossReadEvent(*self.names[reader], victim, victim_tenant, pages, len(slots), self.node)

    def _granted(self, reader_uids: list[int], width: int) -> Tensor:
        """(B, width): the writer each reader may read at each key position (a shared prefix), or NO_GRANT."""
        if width > self.grants.shape[1]:
            self._grow(len(self.grants), max(width, 2 * self.grants.shape[1]))
        rows = torch.tensor([self.grant_rows.get(u, 0) for u in reader_uids], device=self.grants.device)
        return self.grants[:, :width][rows]

    def _grant(self, reader: int, writer: int, positions: Tensor) -> None:
        """`reader` may read what `writer` wrote at `positions`: their prompts agree up to there."""
        if reader not in self.grant_rows:
            if not self.free_rows:
                self.free_rows = list(range(len(self.grants), 2 * len(self.grants)))
                self._grow(2 * len(self.grants), self.grants.shape[1])
            self.grant_rows[reader] = self.free_rows.pop()
        self.grants[self.grant_rows[reader], positions] = writer
        if writer not in self.shared.setdefault(reader, set()):  # each (reader, writer) pair counts once
            self.shared[reader].add(writer)
            self.cache_hits += 1
            self.cross_tenant_cache_hits += self.names[reader][1] != self.names[writer][1]  # no salt between

    def _grow(self, rows: int, cols: int) -> None:
        """Grow the grants to (rows, cols), new cells NO_GRANT; not an inference tensor: retire writes it."""
        with torch.inference_mode(False):
            grown = torch.full((rows, cols), NO_GRANT, dtype=torch.long, device=self.grants.device)
            grown[: self.grants.shape[0], : self.grants.shape[1]] = self.grants
        self.grants = grown

    @property
    def cross_tenant_reads(self) -> int:
        """Reads of slots written by another tenant's request."""
        return sum(1 for e in self.events
                   if e.victim_tenant is not None and e.victim_tenant != e.reader_tenant)

    @property
    def violations(self) -> int:
        """All reads of slots the reader did not write (other requests or never-written memory)."""
        return len(self.events)


def check_reads_reference(audit: OwnershipAudit, reader_uids: Tensor, gather: Tensor,
                          valid: Tensor) -> tuple[list[CrossReadEvent], set[tuple[int, int]]]:
    """The slow, obvious check, for the tests: read by read in Python, no grants, changing nothing. What
    `check_reads` should find on the audit as it stands, and the (reader, writer) pairs of shared reads."""
    writers, positions = audit.writers.tolist(), audit.positions.tolist()
    found, shared = [], set()
    for reader, slots, reads in zip(reader_uids.tolist(), gather.tolist(), valid.tolist()):
        foreign: dict[int, list[tuple[int, int]]] = {}  # writer -> its (key position, slot) the reader read
        for key, (slot, read) in enumerate(zip(slots, reads)):
            if read and writers[slot] != reader:
                foreign.setdefault(writers[slot], []).append((key, slot))
        for writer in sorted(foreign, key=lambda u: (u == NEVER_WRITTEN, u)):
            keys = [key for key, _ in foreign[writer]]
            mine, theirs = audit.prompts.get(reader, []), audit.prompts.get(writer, [])
            if writer != NEVER_WRITTEN and all(positions[slot] == key for key, slot in foreign[writer]) \
                    and max(keys) < min(len(mine), len(theirs)) \
                    and all(mine[i] == theirs[i] for i in range(max(keys) + 1)):
                shared.add((reader, writer))
                continue
            found.append(audit.finding(reader, writer, [slot for _, slot in foreign[writer]]))
    return found, shared
