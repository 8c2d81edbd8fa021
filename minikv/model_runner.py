"""Runs one batch through the model over a page pool, and picks each request's next token.

Shared by the single-node engine and both roles of the disaggregated pair: whoever decides
*which* requests run (a scheduler, a queue) hands the batch here. It logs what is written and
read, and turns the audit's findings into `cross_read` events.
"""

from __future__ import annotations

import time

import torch

from minikv.audit import OwnershipAudit
from minikv.events import Event, EventLog
from minikv.model import Llama
from minikv.page_pool import PagePool
from minikv.paged_attention import PagedStep, SeqSlice
from minikv.request import Sequence
from minikv.sampling import sample_next


class ModelRunner:
    """The model, one node's pool and audit, and the event log it reports to."""

    def __init__(self, model: Llama, pool: PagePool, audit: OwnershipAudit | None, log: EventLog, node: str) -> None:
        self.model, self.pool, self.audit, self.log, self.node = model, pool, audit, log, node

    @torch.inference_mode()
    def run(self, step_no: int, phase: str, seqs: list[Sequence], new_tokens: list[list[int]]) -> list[int]:
        """Compute K/V for each sequence's `new_tokens` after its cached ones; return next tokens.

        Every sequence must already own pages for all of its tokens. Updates `num_cached`,
        `output_ids` and the timings of each sequence.
        """
        slices, ids, last = [], [], []
        ps = self.pool.page_size
        for seq, toks in zip(seqs, new_tokens):
            start, end = seq.num_cached, seq.num_cached + len(toks)
            assert len(seq.block_table) * ps >= end, f"{seq.request_id} has pages for {len(seq.block_table) * ps} tokens, needs {end}"
            slices.append(SeqSlice(seq.uid, list(seq.block_table), start, len(toks)))
            ids += toks
            last.append(len(ids) - 1)
            if self.log.enabled:
                written = tuple(seq.block_table[start // ps : self.pool.pages_for(end)])
                self.log.add(Event(step_no, self.node, "write", seq.request_id, seq.tenant, written,
                                   f"{phase}: {len(toks)} token(s) at positions {start}..{end - 1}"))
                self.log.add(Event(step_no, self.node, "read", seq.request_id, seq.tenant,
                                   tuple(seq.block_table[: self.pool.pages_for(end)]), f"attend over {end} tokens"))
        device = self.model.device
        seen = len(self.audit.events) if self.audit is not None else 0
        step = PagedStep(self.pool, slices, self.audit)  # block tables, positions, slots: tensors, once per step
        logits = self.model(torch.tensor(ids, device=device), step.positions, step,
                            logits_index=torch.tensor(last, device=device))  # (B, V)
        if self.audit is not None:
            for e in self.audit.events[seen:]:
                victim = f"{e.victim_tenant}/{e.victim}" if e.victim else "never-written"
                self.log.add(Event(step_no, self.node, "cross_read", e.reader, e.reader_tenant, e.pages, f"victim={victim}"))
        now = time.perf_counter()
        chosen = []
        for seq, toks, row in zip(seqs, new_tokens, logits):
            seq.num_cached += len(toks)
            nxt = sample_next(row, seq.sampling, seq.generator)
            seq.output_ids.append(nxt)
            seq.token_times_s.append(now - seq.arrival_s)
            if seq.first_token_s is None:
                seq.first_token_s = now - seq.arrival_s
            chosen.append(nxt)
        return chosen
