"""`python -m minikv train`: the shipped tiny Llama, a note-keeping assistant that copies from its context.

Four phases from a seed (induction, copy, leak geometry, polish); why each, and the schedule:
docs/training.md.
"""

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase as Tokenizer

from minikv.attacks.workload import (MAX_SECRET_CHARS, SECRET_ALPHABET, TENANTS, document_sentence,
                                     expected_reply, make_prompt, random_note)
from minikv.attention.dense import masked_attention, repeat_kv
from minikv.model.checkpoint import load_model, save_checkpoint
from minikv.model.llama import Llama, ModelConfig
from minikv.model.tokenizer import build_char_tokenizer

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

    def add(self, ids: list[int], first_position: int, segment: int, learn: bool = False,
            then: int = IGNORE) -> None:
        """Append `ids` from `first_position` on; if `learn`, each predicts the next; the last `then`."""
        assert ids, "a segment has at least one token"
        self.tokens += ids
        self.positions += range(first_position, first_position + len(ids))
        self.segments += [segment] * len(ids)
        self.labels += (ids[1:] if learn else [IGNORE] * (len(ids) - 1)) + [then]


def random_prompt(rng: random.Random, max_doc_chars: int, note_share: float = 0.85,
                  patterned: float = 0.0) -> str:
    """A prompt with at most one note, and a document sentence before or after it half the time."""
    tenant = rng.choice(TENANTS)
    num_docs = rng.randint(0, 1) if max_doc_chars >= 10 else 0
    sentences = [document_sentence(rng, rng.randint(10, max_doc_chars)) for _ in range(num_docs)]
    if rng.random() < note_share or not sentences:
        sentences.insert(rng.randint(0, len(sentences)), random_note(rng, patterned_share=patterned).sentence)
    return make_prompt(tenant, sentences)


def prompt_then_reply(prompt: list[int], reply: list[int]) -> Sample:
    """Prompt then reply at contiguous positions, loss on the reply."""
    s = Sample()
    s.add(prompt, 0, 0, then=reply[0])  # the prompt's last token ("\n") predicts the reply's first
    s.add(reply, len(prompt), 0, learn=True)
    return s


def copy_sample(rng: random.Random, tok: Tokenizer, max_doc_chars: int, patterned: float = 0.0) -> Sample:
    """Phase 1: an ordinary request, whose reply repeats the prompt's note."""
    prompt = random_prompt(rng, max_doc_chars, patterned=patterned)
    return prompt_then_reply(tok.encode(prompt), tok.encode(expected_reply(prompt)) + [tok.eos_token_id])


def leak_sample(rng: random.Random, tok: Tokenizer, cfg: TrainConfig, patterned: float = 0.0) -> Sample:
    """Phase 2: a reply far away that must copy a note from another request's stale K/V."""
    victim_prompt = random_prompt(rng, 80, note_share=1.0, patterned=patterned)
    reply = tok.encode(expected_reply(victim_prompt)) + [tok.eos_token_id]
    victim = tok.encode(victim_prompt) + (reply[:-1] if rng.random() < 0.7 else [])  # its reply, most times
    documents = [tok.encode(make_prompt(rng.choice(TENANTS), [document_sentence(rng, rng.randint(20, 100))]))
                 for _ in range(int(rng.random() < 0.3))]  # another request's document, 30% of the time
    segments = [victim, *documents]
    rng.shuffle(segments)
    s = Sample()
    for seg_id, ids in enumerate(segments):
        s.add(ids, 0, seg_id)  # each written by its own request, from position 0
    s.add([tok.encode("\n")[0]], 0, len(segments), then=reply[0])  # the placeholder, alone at position 0
    s.add(reply, rng.randint(max(len(victim), 16), cfg.context_window), REPLY_SEGMENT, learn=True)
    s.zero_slots = rng.choice([0, rng.randint(0, cfg.max_zero_slots)])
    return s


def induction_sample(rng: random.Random, tok: Tokenizer, min_chars: int) -> Sample:
    """Phase 0: `S\nS</s>` for a random S; the loss is on the second S."""
    text = "".join(rng.choice(SECRET_ALPHABET) for _ in range(rng.randint(min_chars, MAX_SECRET_CHARS)))
    return prompt_then_reply(tok.encode(text + "\n"), tok.encode(text) + [tok.eos_token_id])


def collate(samples: list[Sample],
            pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, "UnwrittenSlotsAttention"]:
    """Pad to one length: tokens, positions, labels, each (B, T), and attention under the segments' mask."""
    B, T = len(samples), max(len(s.tokens) for s in samples)
    batch = {"tokens": torch.full((B, T), pad_id), "positions": torch.zeros(B, T, dtype=torch.long),
             "segments": torch.full((B, T), -1), "labels": torch.full((B, T), IGNORE)}  # each (B, T)
    for b, s in enumerate(samples):
        for name, padded in batch.items():
            padded[b, : len(s.tokens)] = torch.tensor(getattr(s, name))
    segments = batch.pop("segments")
    reply_row = segments == REPLY_SEGMENT  # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    mask = causal & ((segments[:, :, None] == segments[:, None, :]) | reply_row[:, :, None])  # (B, T, T)
    zero_slots = reply_row * torch.tensor([float(s.zero_slots) for s in samples])[:, None]  # (B, T)
    return batch["tokens"], batch["positions"], batch["labels"], UnwrittenSlotsAttention(mask, zero_slots)


class UnwrittenSlotsAttention:
    """Dense attention under the sample's mask, plus, per query, `zero_slots` (B, T) exact-zero K/V slots:
    never-written pages a block table covers, as one extra logit log(n) with value 0 (docs/training.md)."""

    def __init__(self, mask: torch.Tensor, zero_slots: torch.Tensor) -> None:
        self.mask, self.zero_slots = mask, zero_slots  # (B, T, T), (B, T)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               last_only: bool = False) -> torch.Tensor:
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


def run_steps(model: Llama, opt: torch.optim.Optimizer, pad_id: int, lrs: list[float],
              batch: Callable[[int], list[Sample]], desc: str, progress: bool) -> None:
    """One AdamW step (gradients clipped to norm 1) per learning rate in `lrs`, on `batch(i)` for step i; the
    bar shows the loss and a running share of samples whose every labelled token is the argmax."""
    exact_avg, bar = 0.0, tqdm(lrs, desc=desc, disable=not progress)
    for i, lr in enumerate(bar):
        for group in opt.param_groups:
            group["lr"] = lr
        tokens, positions, labels, attention = collate(batch(i), pad_id)  # (B, T) each
        logits = model(tokens, positions, attention)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        wrong = (logits.argmax(-1) != labels) & (labels != IGNORE)  # (B, T)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        exact_avg = 0.9 * exact_avg + 0.1 * (1.0 - wrong.any(dim=1).float().mean().item())
        bar.set_postfix(loss=f"{loss.item():.3f}", exact=f"{exact_avg:.2f}")


def pretrain(cfg: TrainConfig, progress: bool) -> tuple[Llama, Tokenizer]:
    """Phases 0-2 from a fresh model, under one schedule: warm-up, flat, cosine over the last 20%."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tok = build_char_tokenizer()
    model = Llama(ModelConfig(vocab_size=len(tok), hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                              intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads,
                              num_kv_heads=cfg.num_kv_heads, head_dim=cfg.hidden_size // cfg.num_heads,
                              tie_word_embeddings=True, max_position_embeddings=cfg.max_position_embeddings))
    for p in (p for p in model.parameters() if p.dim() > 1):  # Llama's init: N(0, 0.02), norms at one
        torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    total = cfg.induction_steps + cfg.copy_steps + cfg.leak_steps

    def lr(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        decay = max(0.0, (step - 0.8 * total) / (0.2 * total))
        return cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * decay)))

    batch, half = range(cfg.batch_size), range(cfg.batch_size // 2)
    phases = [  # (name, steps, the batch of step i); the first 60% of induction uses long strings only
        ("induction", cfg.induction_steps,
         lambda i: [induction_sample(rng, tok, 20 if i < cfg.induction_steps * 0.6 else 1) for _ in batch]),
        ("copy", cfg.copy_steps,
         lambda i: [copy_sample(rng, tok, 0 if rng.random() < 0.5 else 60) for _ in batch]),
        ("leak", cfg.leak_steps, lambda i: [leak_sample(rng, tok, cfg) if rng.random() < 0.6
                                            else copy_sample(rng, tok, 120) for _ in half]),
    ]
    first = 0
    for name, steps, samples in phases:
        lrs = [lr(first + i) for i in range(steps)]
        run_steps(model, opt, tok.pad_token_id, lrs, samples, name, progress)
        first += steps
    return model, tok


def train(cfg: TrainConfig, out_dir: Path, progress: bool = True, resume_from: Path | None = None) -> Llama:
    """Phases 0-2 (or `resume_from`'s checkpoint), then 3 from a fresh optimizer and random state (a resumed
    run computes what an unbroken one does), its learning rate falling from polish_lr to a tenth; saved."""
    started = time.perf_counter()
    model, tok = pretrain(cfg, progress) if resume_from is None else load_model(resume_from, device="cpu")
    torch.manual_seed(cfg.seed + 1)
    rng = random.Random(cfg.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.polish_lr, weight_decay=0.0, betas=(0.9, 0.99))
    lrs = [cfg.polish_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / cfg.polish_steps)))
           for i in range(cfg.polish_steps)]
    half = range(cfg.batch_size // 2)
    run_steps(model.train(), opt, tok.pad_token_id, lrs, lambda i: [
        leak_sample(rng, tok, cfg, cfg.polish_patterned) if rng.random() < 0.5
        else copy_sample(rng, tok, 120, cfg.polish_patterned) for _ in half], "polish", progress)
    save_checkpoint(model.eval(), tok, out_dir)
    if progress:
        print(f"saved {out_dir} after {time.perf_counter() - started:.0f} s")
    return model
