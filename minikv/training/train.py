"""Train the shipped tiny Llama: a note-keeping assistant that copies from its context.

`python -m minikv train` rebuilds data/tiny-llama from a seed in under half an hour on two CPU
cores (28 min measured, 2 threads, idle machine). Four phases, because learning everything at
once from scratch stalls:

0. *induction*: a random string, a newline, the same string again; loss on the repeat. Long
   strings (20-40 characters) give many copied tokens per sample, which is what makes the
   copying circuit ("find where the current character appeared, emit the one after it") form
   in a few hundred steps; short strings alone leave it on a plateau for thousands.
1. *copy*: ordinary requests, prompt then reply; the loss is on the reply only, and the reply
   repeats the prompt's note, so the model learns to find a value and copy it exactly.
2. *leak geometry*: the same skill at the distances a paged engine creates. Each sample lays
   out what a request's block table can really cover: another request's note and reply,
   written *at that request's own positions* (keys are cached after RoPE), documents from
   other requests, never-written zero slots, and the one-token placeholder, then the reply at
   a position up to the whole context window away. Every segment attends only within itself,
   as it did when it was written; only the reply sees them all. Ordinary samples stay in the
   mix so the first skill is kept.
3. *polish*: both kinds of sample at a lower learning rate, now with secrets made of repeated
   runs (4111 2222 ...), which copying by the previous character alone gets wrong.

The same seed gives the same weights on the same machine and thread count; a different thread
count changes the order of float sums, so the weights differ slightly but copy just as well.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from minikv.attention.dense import masked_attention, repeat_kv
from minikv.model.llama import Llama, ModelConfig
from minikv.model.tokenizer import build_char_tokenizer
from minikv.attacks.workload import (
    MAX_SECRET_CHARS, SECRET_ALPHABET, TENANTS, document_sentence, make_prompt, random_note,
)

IGNORE = -100  # label for positions that carry no loss
REPLY_SEGMENT = 1_000  # segment id of the reply, which may attend to every segment


@dataclass
class TrainConfig:
    """Everything that decides the shipped model; the defaults reproduce data/tiny-llama."""

    seed: int = 0
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 2048  # context window 1,024 + output, with headroom
    induction_steps: int = 700
    copy_steps: int = 600
    leak_steps: int = 1200
    batch_size: int = 32  # phases 0 and 1; phase 2's samples are longer, so half of it
    lr: float = 1e-3
    warmup_steps: int = 50
    context_window: int = 1024  # replies are placed anywhere up to here in phase 2
    max_zero_slots: int = 1000  # never-written slots a block table may cover
    save_phase1: bool = False  # also save the model after phase 1, for inspection
    polish_steps: int = 800
    polish_lr: float = 3e-4
    polish_patterned: float = 0.3  # share of secrets made of repeated runs (4111 2222 ...)


@dataclass
class Sample:
    """One training sequence: tokens with their own positions, segments and labels."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    zero_slots: int = 0  # zero K/V slots only the reply segment sees

    def add(self, ids: list[int], first_position: int, segment: int, learn: bool) -> None:
        """Append `ids` at positions first_position.. ; if `learn`, each predicts the next."""
        start = len(self.tokens)
        self.tokens += ids
        self.positions += range(first_position, first_position + len(ids))
        self.segments += [segment] * len(ids)
        self.labels += [IGNORE] * len(ids)
        if learn:
            for i in range(start, start + len(ids) - 1):
                self.labels[i] = self.tokens[i + 1]


def random_prompt(rng: random.Random, max_doc_chars: int, note_share: float = 0.85, patterned: float = 0.0) -> str:
    """A prompt with at most one note, and a document sentence before or after it half the time."""
    tenant = rng.choice(TENANTS)
    num_docs = rng.randint(0, 1) if max_doc_chars >= 10 else 0
    sentences = [document_sentence(rng, rng.randint(10, max_doc_chars)) for _ in range(num_docs)]
    if rng.random() < note_share or not sentences:
        sentences.insert(rng.randint(0, len(sentences)), random_note(rng, patterned_share=patterned).sentence)
    return make_prompt(tenant, sentences)


def reply_for(prompt: str) -> str:
    from minikv.attacks.workload import expected_reply

    return expected_reply(prompt)


def copy_sample(rng: random.Random, tok: PreTrainedTokenizerBase, max_doc_chars: int, patterned: float = 0.0) -> Sample:
    """Phase 1: prompt then reply at contiguous positions, loss on the reply."""
    prompt = random_prompt(rng, max_doc_chars, patterned=patterned)
    p, r = tok.encode(prompt), tok.encode(reply_for(prompt)) + [tok.eos_token_id]
    s = Sample()
    s.add(p, 0, 0, learn=False)
    s.labels[-1] = r[0]  # the prompt's last token ("\n") predicts the reply's first
    s.add(r, len(p), 0, learn=True)
    return s


def leak_sample(rng: random.Random, tok: PreTrainedTokenizerBase, cfg: TrainConfig, patterned: float = 0.0) -> Sample:
    """Phase 2: a reply far away that must copy a note from another request's stale K/V."""
    s = Sample()
    victim_prompt = random_prompt(rng, 80, note_share=1.0, patterned=patterned)
    victim = tok.encode(victim_prompt)
    if rng.random() < 0.7:  # its reply, decoded earlier, usually sits in the pages too
        victim = victim + tok.encode(reply_for(victim_prompt))
    segments = [victim] + [
        tok.encode(make_prompt(rng.choice(TENANTS), [document_sentence(rng, rng.randint(20, 100))]))
        for _ in range(int(rng.random() < 0.3))
    ]
    rng.shuffle(segments)
    for seg_id, ids in enumerate(segments):
        s.add(ids, 0, seg_id, learn=False)  # each written by its own request, from position 0
    # The placeholder: one "\n" prefilled alone at position 0; it predicts the reply's start.
    reply = tok.encode(reply_for(victim_prompt)) + [tok.eos_token_id]
    s.add([tok.encode("\n")[0]], 0, len(segments), learn=False)
    s.labels[-1] = reply[0]
    shortest = max(len(victim), 16)
    reply_position = rng.randint(shortest, cfg.context_window)
    s.add(reply, reply_position, REPLY_SEGMENT, learn=True)
    s.zero_slots = rng.choice([0, rng.randint(0, cfg.max_zero_slots)])
    return s


def induction_sample(rng: random.Random, tok: PreTrainedTokenizerBase, min_chars: int) -> Sample:
    """Phase 0: `S\nS</s>` for a random S; the loss is on the second S."""
    text = "".join(rng.choice(SECRET_ALPHABET) for _ in range(rng.randint(min_chars, MAX_SECRET_CHARS)))
    p, r = tok.encode(text + "\n"), tok.encode(text) + [tok.eos_token_id]
    s = Sample()
    s.add(p, 0, 0, learn=False)
    s.labels[-1] = r[0]
    s.add(r, len(p), 0, learn=True)
    return s


def collate(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to one length and build the block-diagonal-plus-reply attention mask."""
    T = max(len(s.tokens) for s in samples)
    B = len(samples)
    tokens = torch.full((B, T), pad_id)
    positions = torch.zeros(B, T, dtype=torch.long)
    segments = torch.full((B, T), -1)
    labels = torch.full((B, T), IGNORE)
    zero_slots = torch.zeros(B, T)
    for b, s in enumerate(samples):
        n = len(s.tokens)
        tokens[b, :n] = torch.tensor(s.tokens)
        positions[b, :n] = torch.tensor(s.positions)
        segments[b, :n] = torch.tensor(s.segments)
        labels[b, :n] = torch.tensor(s.labels)
        zero_slots[b, :n] = torch.tensor([s.zero_slots if g == REPLY_SEGMENT else 0 for g in s.segments], dtype=torch.float)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    same = segments[:, :, None] == segments[:, None, :]  # (B, T, T)
    reply_row = (segments == REPLY_SEGMENT)[:, :, None]  # (B, T, 1)
    mask = causal & (same | reply_row)
    return {"tokens": tokens, "positions": positions, "labels": labels, "mask": mask, "zero_slots": zero_slots}


class UnwrittenSlotsAttention:
    """Dense attention under the sample's mask, plus, per query, `zero_slots` (B, T) exact-zero K/V slots:
    what never-written (boot-zeroed) pages look like to a request whose block table covers them.
    Each adds exp(q . 0) = 1 to the softmax's denominator and nothing to the output: together one
    extra logit log(n) whose value is 0."""

    def __init__(self, mask: torch.Tensor, zero_slots: torch.Tensor) -> None:
        self.mask, self.zero_slots = mask, zero_slots  # (B, T, T), (B, T)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        if not self.zero_slots.any():
            return masked_attention(q, k, v, self.mask)
        num_heads, head_dim = q.shape[-2], q.shape[-1]
        k, v = repeat_kv(k, num_heads), repeat_kv(v, num_heads)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head_dim)  # (B, H, T, S)
        scores = scores.masked_fill(~self.mask.unsqueeze(1), float("-inf"))
        sink = torch.log(self.zero_slots.to(scores.dtype))  # (B, T); log(0) = -inf: no sink
        sink = sink[:, None, :, None].expand(-1, num_heads, -1, 1)  # (B, H, T, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("bhts,bshd->bthd", probs, v)


def loss_on(model: Llama, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, float]:
    """Cross-entropy on the labelled tokens, and the share of samples whose every labelled
    token is the argmax (teacher-forced exact match, which equals greedy exact match)."""
    logits = model(batch["tokens"], batch["positions"], UnwrittenSlotsAttention(batch["mask"], batch["zero_slots"]))  # (B, T, V)
    labels = batch["labels"]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    wrong = (logits.argmax(-1) != labels) & (labels != IGNORE)  # (B, T)
    exact = 1.0 - wrong.any(dim=1).float().mean().item()
    return loss, exact


def optimizer_step(model: Llama, opt: torch.optim.Optimizer, samples: list[Sample], pad_id: int) -> tuple[float, float]:
    """One training step on `samples`: loss, gradients clipped to norm 1, AdamW. Returns (loss, exact)."""
    loss, exact = loss_on(model, collate(samples, pad_id))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item(), exact


def model_config_for(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
    )


def train(cfg: TrainConfig, out_dir: Path, progress: bool = True, resume_from: Path | None = None) -> Llama:
    """Train and save with save_pretrained to `out_dir`; returns the model.

    `resume_from` skips phases 0-2 and polishes that checkpoint instead: the polish phase starts
    from fresh optimizer and random state, so a resumed run computes what an unbroken run does.
    """
    from tqdm import tqdm

    from minikv.model.checkpoint import load_model, save_checkpoint

    if resume_from is not None:
        model, tok = load_model(resume_from, device="cpu")
        model.train()
        polish(model, tok, cfg, progress)
        model.eval()
        save_checkpoint(model, tok, out_dir)
        return model
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tok = build_char_tokenizer()
    model = Llama(model_config_for(cfg, len(tok)))
    for p in model.parameters():  # Llama's init: N(0, 0.02), norms at one
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    phases = [("induction", cfg.induction_steps), ("copy", cfg.copy_steps), ("leak", cfg.leak_steps)]
    total = sum(n for _, n in phases)
    schedule = [name for name, n in phases for _ in range(n)]
    bar = tqdm(range(total), desc="train", disable=not progress)
    started = time.perf_counter()
    exact_avg = 0.0
    for step in bar:
        phase = schedule[step]
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        decay = max(0.0, (step - 0.8 * total) / (0.2 * total))  # flat, then cosine over the last 20%
        for group in opt.param_groups:
            group["lr"] = cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * decay)))
        if phase == "induction":
            min_chars = 20 if step < cfg.induction_steps * 0.6 else 1
            samples = [induction_sample(rng, tok, min_chars) for _ in range(cfg.batch_size)]
        elif phase == "copy":
            samples = [copy_sample(rng, tok, 0 if rng.random() < 0.5 else 60) for _ in range(cfg.batch_size)]
        else:
            samples = [
                leak_sample(rng, tok, cfg) if rng.random() < 0.6 else copy_sample(rng, tok, 120)
                for _ in range(cfg.batch_size // 2)
            ]
        loss, exact = optimizer_step(model, opt, samples, tok.pad_token_id)
        exact_avg = 0.9 * exact_avg + 0.1 * exact
        bar.set_postfix(loss=f"{loss:.3f}", exact=f"{exact_avg:.2f}", phase=phase)
        if cfg.save_phase1 and step == cfg.induction_steps + cfg.copy_steps - 1:
            save_checkpoint(model, tok, Path(str(out_dir) + "-copy-phase"))
    polish(model, tok, cfg, progress)
    model.eval()
    save_checkpoint(model, tok, out_dir)
    if progress:
        print(f"saved {out_dir} after {time.perf_counter() - started:.0f} s")
    return model


def polish(model: Llama, tok: PreTrainedTokenizerBase, cfg: TrainConfig, progress: bool = True) -> None:
    """Phase 3: both skills at a lower learning rate with a fresh optimizer, now with secrets
    made of repeated runs (a card like 4111 2222 3333 4444), which copying by the previous
    character alone gets wrong."""
    from tqdm import tqdm

    if cfg.polish_steps == 0:
        return
    torch.manual_seed(cfg.seed + 1)
    rng = random.Random(cfg.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.polish_lr, weight_decay=0.0, betas=(0.9, 0.99))
    exact_avg = 0.0
    bar = tqdm(range(cfg.polish_steps), desc="polish", disable=not progress)
    for step in bar:
        for group in opt.param_groups:  # cosine from polish_lr to a tenth of it
            group["lr"] = cfg.polish_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.polish_steps)))
        samples = [leak_sample(rng, tok, cfg, cfg.polish_patterned) if rng.random() < 0.5
                   else copy_sample(rng, tok, 120, cfg.polish_patterned) for _ in range(cfg.batch_size // 2)]
        loss, exact = optimizer_step(model, opt, samples, tok.pad_token_id)
        exact_avg = 0.9 * exact_avg + 0.1 * exact
        bar.set_postfix(loss=f"{loss:.3f}", exact=f"{exact_avg:.2f}")
