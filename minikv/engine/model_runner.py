"""Runs one batch through the model over a page pool, and picks each request's next token. It changes
no sequence (the scheduler's postprocess does), logs writes, reads and the audit's findings, and turns an
exception into the failure of the request it concerns, never of the node.
"""

from dataclasses import dataclass

import torch

from minikv.engine.audit import OwnershipAudit
from minikv.engine.events import Event, EventLog
from minikv.engine.page_pool import PagePool
from minikv.engine.paged_step import PagedStep, SeqSlice
from minikv.engine.request import Sequence
from minikv.model.llama import Llama
from minikv.model.sampling import sample_next


@dataclass(frozen=True)
class Sampled:
    """What the model runner chose for one request: a token, or why it could not."""

    token: int | None = None
    error: str | None = None


def failure(e: Exception) -> str:
    """The one-line reason a 500 carries."""
    return f"internal error while serving this request: {type(e).__name__}: {e}"


class ModelRunner:
    """The model, one node's pool and audit, and the event log it reports to."""

    def __init__(self, model: Llama, pool: PagePool, audit: OwnershipAudit | None, log: EventLog,
                 node: str) -> None:
        self.model, self.pool, self.audit, self.log, self.node = model, pool, audit, log, node

    @torch.inference_mode()
    def run(self, now: int, phase: str, seqs: list[Sequence], tokens: list[list[int]]) -> list[Sampled]:
        """Compute K/V for each sequence's `tokens` after its cached ones (PagedStep asserts it owns pages
        for all); return each next token, sampled with the sequence's own generator. Changes nothing else."""
        slices, ids = [], []
        pool, ps = self.pool, self.pool.page_size
        for seq, toks in zip(seqs, tokens):
            start, end = seq.num_cached, seq.num_cached + len(toks)
            assert pool.ref_count(seq.block_table[start // ps]) == 1, f"{seq.request_id} writes a shared page"
            slices.append(SeqSlice(seq.uid, list(seq.block_table), start, len(toks)))
            ids += toks
            if self.log.enabled:
                read = tuple(seq.block_table[: pool.pages_for(end)])
                self.log.add(Event(now, self.node, "write", seq.request_id, seq.tenant, read[start // ps :],
                                   f"{phase}: {len(toks)} token(s) at positions {start}..{end - 1}"))
                self.log.add(Event(now, self.node, "read", seq.request_id, seq.tenant, read,
                                   f"attend over {end} tokens"))
        step = PagedStep(pool, slices, self.audit)  # block tables, positions, slots: tensors, once per step
        try:
            logits = self.model(torch.tensor(ids, device=self.model.device), step.positions, step,
                                logits_index=step.last_rows, last_layer_on_logits_only=True)  # (B, V)
        except Exception as e:  # noqa: BLE001 - the batch fails, the node goes on
            return [Sampled(error=failure(e)) for _ in seqs]
        for e in step.findings:
            victim = f"{e.victim_tenant}/{e.victim}" if e.victim else "never-written"
            self.log.add(Event(now, self.node, "cross_read", e.reader, e.reader_tenant, e.pages,
                               f"victim={victim}"))
        top = logits.argmax(-1).tolist()  # (B,) the greedy choice of every row in one call, as sample_next's
        return [Sampled(token=top[b]) if seq.sampling.greedy else self.sample(seq, logits[b])
                for b, seq in enumerate(seqs)]

    @staticmethod
    def sample(seq: Sequence, logits: torch.Tensor) -> Sampled:
        """One request's next token from its logits (V,), or the reason it could not be chosen."""
        try:
            return Sampled(token=sample_next(logits, seq.sampling, seq.generator))
        except Exception as e:  # noqa: BLE001 - one request's failure, not the batch's
            return Sampled(error=failure(e))
