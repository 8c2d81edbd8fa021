"""The ownership audit's read check: tensors against the read-by-read reference; Python only on a finding."""

import random
from unittest.mock import patch

import torch

from minikv.engine.audit import OwnershipAudit, check_reads_reference

WIDTH, PAGE = 12, 4  # key positions per read; tokens per page
UIDS = list(range(1, 7))


def ledger(rng: random.Random) -> OwnershipAudit:
    """Six requests, each having written its prompt into its own row of slots (uid u: (u-1)*WIDTH + p)."""
    audit = OwnershipAudit(len(UIDS) * WIDTH, PAGE, "n")
    base = [rng.randrange(2) for _ in range(WIDTH)]
    for uid in UIDS:  # prompts that agree with one another up to a random point
        cut = rng.randrange(WIDTH + 1)
        audit.register(uid, f"r{uid}", rng.choice(["alice", "bob"]), base[:cut] + [2] * (WIDTH - cut))
        row = torch.arange(WIDTH) + (uid - 1) * WIDTH
        audit.record_writes(row, torch.full((WIDTH,), uid), torch.arange(WIDTH))
    return audit


def random_reads(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three readers, each reading another request's row up to a point, then its own; now and then a stray."""
    readers = rng.sample(UIDS, 3)
    gather = torch.zeros(3, WIDTH, dtype=torch.long)
    for b, uid in enumerate(readers):
        other, cut = rng.choice(UIDS), rng.randrange(WIDTH)
        gather[b] = torch.tensor([((other if p < cut else uid) - 1) * WIDTH + p for p in range(WIDTH)])
        if rng.random() < 0.2:
            gather[b, rng.randrange(WIDTH)] = rng.randrange(len(UIDS) * WIDTH)
    valid = torch.arange(WIDTH)[None, :] < torch.tensor([rng.randint(1, WIDTH) for _ in readers])[:, None]
    return torch.tensor(readers), gather, valid


def rewrite(audit: OwnershipAudit, rng: random.Random) -> None:
    """Between steps: a slot rewritten (by anyone, at its own position or not); now and then a scrub."""
    slot = rng.randrange(len(UIDS) * WIDTH)
    position = slot % WIDTH if rng.random() < 0.5 else rng.randrange(WIDTH)
    audit.record_writes(torch.tensor([slot]), torch.tensor([rng.choice(UIDS)]), torch.tensor([position]))
    if rng.random() < 0.1:
        audit.forget([rng.randrange(len(UIDS) * WIDTH // PAGE)])


def test_tensor_check_agrees_with_the_read_by_read_reference():
    """On random read sets (shared prefixes, foreign slots, shifted positions, scrubbed pages), step after
    step with grants carried over, check_reads finds exactly the reference's events and grants exactly its
    shared reads."""
    findings = shared_steps = 0
    for seed in range(40):
        rng = random.Random(seed)
        audit, shared = ledger(rng), set()
        for _ in range(15):
            reads = random_reads(rng)
            expected, pairs = check_reads_reference(audit, *reads)
            assert audit.check_reads(*reads) == expected
            shared |= pairs
            assert {(r, w) for r, ws in audit.shared.items() for w in ws} == shared
            findings += len(expected)
            shared_steps += bool(pairs)
            rewrite(audit, rng)
    assert findings > 100 and shared_steps > 100  # both kinds of read were exercised


def test_python_runs_only_on_a_finding():
    """A shared read is resolved in Python once; the same reads again are checked by tensors alone, and a
    foreign slot read among them is found again."""
    audit = OwnershipAudit(2 * WIDTH, PAGE, "n")
    for uid in (1, 2):
        audit.register(uid, f"r{uid}", "alice", [7] * WIDTH)
    writers = torch.tensor([1] * WIDTH + [2] * WIDTH)
    audit.record_writes(torch.arange(2 * WIDTH), writers, torch.arange(2 * WIDTH) % WIDTH)
    reads = torch.tensor([2]), torch.arange(WIDTH)[None, :], torch.ones(1, WIDTH, dtype=torch.bool)
    with patch.object(OwnershipAudit, "_same_prefix", autospec=True, side_effect=lambda *a: True) as looked:
        assert audit.check_reads(*reads) == [] and looked.call_count == 1
        assert audit.check_reads(*reads) == [] and looked.call_count == 1  # no Python for a granted read
    audit.record_writes(torch.tensor([3]), torch.tensor([1]), torch.tensor([0]))  # slot 3, now at position 0
    assert [e.num_slots for e in audit.check_reads(*reads)] == [WIDTH]
    assert audit.cache_hits == 1 and audit.violations == 1
