"""Both paged attention paths (tiles, per-request gather) equal the slot-by-slot reference."""

from __future__ import annotations

import random

import pytest
import torch

from minikv.model.llama import ModelConfig
from minikv.engine.page_pool import PagePool
from minikv.attention.gather import gather_attention
from minikv.attention.tiles import tile_plan, tiled_attention, weighted_values
from minikv.engine.paged_step import (CPU_TILES_MIN_BATCH, PagedStep, SeqSlice, block_table_tensor,
                                      paged_attention_reference, slot_mapping)

GQA = ModelConfig(vocab_size=10, hidden_size=32, intermediate_size=32, num_layers=2, num_heads=8,
                  num_kv_heads=2, head_dim=4, max_position_embeddings=512)
MHA = ModelConfig(vocab_size=10, hidden_size=32, intermediate_size=32, num_layers=2, num_heads=4,
                  num_kv_heads=4, head_dim=8, max_position_embeddings=512)


def random_batch(seed: int, phase: str, page_size: int, num_pages: int = 256, num_seqs: int | None = None) -> list[SeqSlice]:
    """Requests of random lengths whose pages are dealt out interleaved (request 0 gets page a, 1 gets b, ...).

    phase: "decode" (one new token each), "prefill" (whole prompts, or the rest after a cached
    prefix, start > 0) or "mixed" (some of each in one step).
    """
    rng = random.Random(seed)
    seqs_spec = []
    for _ in range(num_seqs or rng.randint(1, 7)):
        kind = rng.choice(["decode", "prefill"]) if phase == "mixed" else phase
        if kind == "decode":
            start, num_new = rng.randint(0, 60), 1
        else:
            start = rng.choice([0, 0, rng.randint(1, 40)])  # a prefix already cached, or none
            num_new = rng.randint(2, 70)
        seqs_spec.append((start, num_new))
    need = [-(-(s + n) // page_size) for s, n in seqs_spec]
    free = list(range(num_pages))
    rng.shuffle(free)
    tables: list[list[int]] = [[] for _ in seqs_spec]
    while any(len(t) < n for t, n in zip(tables, need)):  # round-robin: every table interleaves with the others
        for t, n in zip(tables, need):
            if len(t) < n:
                t.append(free.pop())
    return [SeqSlice(i + 1, t, s, n) for i, (t, (s, n)) in enumerate(zip(tables, seqs_spec))]


def three_pools(config: ModelConfig, page_size: int, seed: int) -> tuple[PagePool, PagePool, PagePool]:
    """Three pools holding the same random (stale) K/V."""
    torch.manual_seed(seed)
    pools = [PagePool(config, 256, page_size) for _ in range(3)]
    init = torch.randn_like(pools[0].kv)
    for p in pools:
        p.kv.copy_(init)
    return pools[0], pools[1], pools[2]


def qkv(config: ModelConfig, seqs: list[SeqSlice]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    N = sum(s.num_new for s in seqs)
    return (torch.randn(N, config.num_heads, config.head_dim), torch.randn(N, config.num_kv_heads, config.head_dim),
            torch.randn(N, config.num_kv_heads, config.head_dim))


@pytest.mark.parametrize("phase", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("config", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_step_equals_gather_path_and_reference(phase, config, page_size):
    """PagedStep.attend (small CPU batches: request by request) equals gather_attention over Python-built
    slot lists and the reference, and writes the same K/V."""
    for seed in range(4):
        fast, gather, slow = three_pools(config, page_size, seed)
        seqs = random_batch(seed, phase, page_size)
        q, k, v = qkv(config, seqs)
        out_fast = PagedStep(fast, seqs).attend(1, q, k, v)
        out_slow = paged_attention_reference(slow, 1, seqs, q, k, v)
        k_cache, v_cache = gather.flat(1)
        new = torch.tensor([x for s in seqs for x in gather.slots(s.block_table, s.start, s.end)])
        k_cache[new], v_cache[new] = k, v
        context = [torch.tensor(gather.slots(s.block_table, 0, s.end)) for s in seqs]
        out_gather = gather_attention(q, k_cache, v_cache, context, [s.start for s in seqs])
        assert torch.allclose(out_fast, out_slow, atol=1e-5), (seed, (out_fast - out_slow).abs().max())
        assert torch.allclose(out_gather, out_slow, atol=1e-5)
        assert torch.equal(fast.kv, slow.kv) and torch.equal(gather.kv, slow.kv)


@pytest.mark.parametrize("config", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("phase, page_size, num_seqs", [("decode", 4, CPU_TILES_MIN_BATCH), ("mixed", 16, 44)])
def test_paged_step_tiles_the_one_token_rows_of_a_large_batch_and_equals_the_reference(config, phase, page_size,
                                                                                     num_seqs):
    """A CPU decode batch of CPU_TILES_MIN_BATCH requests goes through the tiles; so do the one-token rows of a
    mixed step with that many (its prompts through the gather, `split_attention`). The reference's output."""
    for seed in range(3):
        fast, _, slow = three_pools(config, page_size, seed)
        seqs = random_batch(seed + (30 if phase == "decode" else 0), phase, page_size, num_seqs=num_seqs)
        assert sum(s.num_new == 1 for s in seqs) >= CPU_TILES_MIN_BATCH
        q, k, v = qkv(config, seqs)
        step = PagedStep(fast, seqs)
        out_fast = step.attend(1, q, k, v)
        assert (step.plans if phase == "decode" else step.split), "the tiles were not used"
        assert torch.allclose(out_fast, paged_attention_reference(slow, 1, seqs, q, k, v), atol=1e-5)
        assert torch.equal(fast.kv, slow.kv)


@pytest.mark.parametrize("phase", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("block_q, pages_per_tile", [(1, 1), (4, 2), (64, 4), (3, 1)])
def test_tiles_of_any_shape_equal_the_reference(phase, block_q, pages_per_tile):
    """tiled_attention gives the reference's output whatever the tile shape (GPU prefill uses tiles too)."""
    for seed in range(3):
        pool, _, slow = three_pools(GQA, 4, seed)
        seqs = random_batch(10 + seed, phase, 4)
        q, k, v = qkv(GQA, seqs)
        want = paged_attention_reference(slow, 0, seqs, q, k, v)  # also writes k, v into `slow`
        pool.kv.copy_(slow.kv)
        plan = tile_plan(block_table_tensor([s.block_table for s in seqs], pool.kv.device), torch.tensor([s.start for s in seqs]),
                         torch.tensor([s.num_new for s in seqs]), 4, GQA.num_kv_heads, block_q, pages_per_tile)
        got = tiled_attention(q, pool.kv[0], plan)
        assert torch.allclose(got, want, atol=1e-5), (seed, (got - want).abs().max())


@pytest.mark.parametrize("block_q, pages_per_tile", [(1, 1), (64, 4)])
def test_tiles_read_only_the_pages_of_each_request(block_q, pages_per_tile):
    """Poisoning (NaN) every page no request holds changes nothing: no tile reads outside its request's pages."""
    for seed in range(3):
        pool, _, slow = three_pools(GQA, 4, seed)
        seqs = random_batch(20 + seed, "decode" if block_q == 1 else "mixed", 4)
        q, k, v = qkv(GQA, seqs)
        want = paged_attention_reference(slow, 0, seqs, q, k, v)
        held = {p for s in seqs for p in s.block_table}
        pool.kv.copy_(slow.kv)
        pool.kv[:, :, [p for p in range(256) if p not in held]] = float("nan")
        plan = tile_plan(block_table_tensor([s.block_table for s in seqs], pool.kv.device), torch.tensor([s.start for s in seqs]),
                         torch.tensor([s.num_new for s in seqs]), 4, GQA.num_kv_heads, block_q, pages_per_tile)
        assert torch.allclose(tiled_attention(q, pool.kv[0], plan), want, atol=1e-5)


def test_slot_mapping_tensor_equals_python_slots():
    """slot_mapping (one tensor operation) gives pool.slots' numbers for every token of every request."""
    pool = PagePool(GQA, 256, 4)
    seqs = random_batch(5, "mixed", 4)
    tables = block_table_tensor([s.block_table for s in seqs], pool.kv.device)
    for b, s in enumerate(seqs):
        positions = torch.arange(s.end)
        got = slot_mapping(tables, 4, torch.full_like(positions, b), positions)
        assert got.tolist() == pool.slots(s.block_table, 0, s.end)
    step = PagedStep(pool, seqs)
    assert step.slot_mapping.tolist() == [x for s in seqs for x in pool.slots(s.block_table, s.start, s.end)]
    assert step.positions.tolist() == [p for s in seqs for p in range(s.start, s.end)]


@pytest.mark.parametrize("phase", ["prefill", "mixed", "decode"])
@pytest.mark.parametrize("config", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("num_seqs", [3, CPU_TILES_MIN_BATCH], ids=["per-request", "tiles"])
def test_attend_last_only_equals_the_last_rows_of_attend(phase, config, num_seqs):
    """attend(last_only=True) (each request's last query only) gives attend's output at last_rows and
    writes the same K/V."""
    for seed in range(3):
        full, last, _ = three_pools(config, 4, seed)
        seqs = random_batch(40 + seed, phase, 4, num_seqs=num_seqs)
        q, k, v = qkv(config, seqs)
        want = PagedStep(full, seqs).attend(1, q, k, v)
        step = PagedStep(last, seqs)
        got = step.attend(1, q[step.last_rows], k, v, last_only=True)
        assert step.last_rows.tolist() == [sum(s.num_new for s in seqs[: b + 1]) - 1 for b in range(len(seqs))]
        assert torch.allclose(got, want[step.last_rows], atol=1e-5), (seed, (got - want[step.last_rows]).abs().max())
        assert torch.equal(full.kv, last.kv)


@pytest.mark.parametrize("config", [GQA, MHA], ids=["gqa", "mha"])
def test_values_summed_from_the_pool_equal_the_gathered_product(config):
    """weighted_values in decode (embedding_bag over pool rows) equals gathering the values and multiplying."""
    for seed in range(3):
        pool, _, _ = three_pools(config, 4, seed)
        seqs = random_batch(50 + seed, "decode", 4)
        plan = tile_plan(block_table_tensor([s.block_table for s in seqs], pool.kv.device), torch.tensor([s.start for s in seqs]),
                         torch.tensor([s.num_new for s in seqs]), 4, config.num_kv_heads, 1, 1)
        R = config.num_heads // config.num_kv_heads
        probs = torch.rand(len(plan.tile_block), config.num_kv_heads, R, plan.block_k)  # (n_tiles, KVH, R, Bk)
        got = weighted_values(probs, pool.kv[0, 1], plan)
        D = config.head_dim
        values = pool.kv[0, 1].reshape(-1, D)[plan.kv_rows].view(len(plan.tile_block), config.num_kv_heads, plan.block_k, D)
        assert torch.allclose(got, probs @ values, atol=1e-5)

